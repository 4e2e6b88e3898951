"""Messages and tools converted between agent-framework's types and pgmemory's, both ways.

A framework message's text, function calls and function results map onto pgmemory's contents
one to one; its attribution (``additional_properties["_attribution"]``: which provider added it
and from which sessions) onto pgmemory's source stamp. Other content kinds (reasoning, data,
URIs, ...) and the framework's own additional properties ride along in the pgmemory message's
metadata, so a message stored by pgmemory and read back is the message that was stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agent_framework import Content, FunctionTool, Message as FrameworkMessage

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.messages import (
    FunctionCallContent,
    FunctionResultContent,
    Message,
    TextContent,
)
from pgmemory.runtime.tools import Tool
from pgmemory.vocabulary import CHAT_HISTORY, CONTEXT_PROVIDER, EXTERNAL, ROLES, SourceType

#: Where the framework keeps attribution in ``Message.additional_properties``.
ATTRIBUTION = "_attribution"
#: Metadata key (in pgmemory's message) for what pgmemory's contents cannot hold.
CARRIED = "agent_framework"


def _json_native(value: Any) -> Any:
    """``value`` if JSON can hold it exactly, else None (it is then not carried)."""
    try:
        return value if json.loads(json.dumps(value)) == value else None
    except (TypeError, ValueError):
        return None


def to_pgmemory(message: FrameworkMessage, *, history_sources: Iterable[str] = ()) -> Message:
    """A framework message as a pgmemory :class:`~pgmemory.Message`.

    Args:
        message: the framework's message.
        history_sources: source ids of the agent's history providers; a message attributed to
            one of them is stamped ``chat_history``, other attributed messages
            ``context_provider``, and messages without attribution (the caller's) ``external``.

    Raises:
        InvalidInputError: the role is not one pgmemory stores (system, user, assistant, tool).
    """
    role = str(message.role)
    if role not in ROLES:
        raise InvalidInputError(
            f"agent-framework message role {role!r} cannot be stored; pgmemory keeps "
            f"{', '.join(ROLES)}"
        )
    contents: list[TextContent | FunctionCallContent | FunctionResultContent] = []
    carried: list[dict[str, Any]] = []
    for content in message.contents:
        if content.type == "text":
            contents.append(TextContent(content.text or ""))
        elif content.type == "function_call":
            arguments = content.arguments
            if isinstance(arguments, Mapping):
                arguments = json.dumps(dict(arguments), ensure_ascii=False)
            contents.append(
                FunctionCallContent(
                    call_id=str(content.call_id),
                    name=str(content.name),
                    arguments=arguments if isinstance(arguments, str) else "{}",
                )
            )
        elif content.type == "function_result":
            error = content.exception
            contents.append(
                FunctionResultContent(
                    call_id=str(content.call_id),
                    result=_json_native(content.result),
                    error=str(error) if error else None,
                )
            )
        else:
            kept = _json_native(content.to_dict())
            if kept is not None:
                carried.append(kept)
    properties = dict(message.additional_properties or {})
    attribution = properties.pop(ATTRIBUTION, None) or {}
    source_id = attribution.get("source_id")
    source_type: SourceType
    if not source_id:
        source_type, source_id = EXTERNAL, None
    elif source_id in set(history_sources):
        source_type = CHAT_HISTORY
    else:
        source_type = CONTEXT_PROVIDER
    metadata: dict[str, Any] = {}
    extra = {k: v for k, v in properties.items() if _json_native({k: v}) is not None}
    if carried or extra:
        metadata[CARRIED] = {"contents": carried, "properties": extra}
    return Message(
        role,  # type: ignore[arg-type]
        contents=contents,
        author_name=message.author_name,
        message_id=message.message_id,
        source_type=source_type,
        source_id=source_id,
        origin_session_ids=attribution.get("origin_session_ids") or (),
        metadata=metadata,
    )


def to_framework(message: Message) -> FrameworkMessage:
    """A pgmemory message as the framework's ``Message`` (without attribution: the framework
    stamps it when a provider adds the message to the context)."""
    contents: list[Content] = []
    for content in message.contents:
        if isinstance(content, TextContent):
            contents.append(Content.from_text(content.text))
        elif isinstance(content, FunctionCallContent):
            contents.append(
                Content.from_function_call(
                    content.call_id, content.name, arguments=content.arguments
                )
            )
        else:
            contents.append(
                Content.from_function_result(
                    content.call_id,
                    result=content.text if content.error is not None else content.result,
                )
            )
    carried = message.metadata.get(CARRIED) or {}
    contents.extend(Content.from_dict(data) for data in carried.get("contents", ()))
    return FrameworkMessage(
        message.role,
        contents,
        author_name=message.author_name,
        message_id=message.message_id,
        additional_properties=dict(carried.get("properties") or {}),
    )


def to_framework_tool(tool: Tool) -> FunctionTool:
    """A pgmemory :class:`~pgmemory.Tool` as the framework's ``FunctionTool`` (same name,
    description and JSON schema; calls run pgmemory's own validation and function)."""

    async def call(**arguments: Any) -> Any:
        return await tool.invoke(arguments)

    return FunctionTool(
        name=tool.name, description=tool.description, func=call, input_model=tool.parameters
    )


__all__ = ["to_framework", "to_framework_tool", "to_pgmemory"]
