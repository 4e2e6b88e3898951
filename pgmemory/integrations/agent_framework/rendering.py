"""Framework messages as memories: the text stored for a message, and how a tool call or
result is marked so that recall leaves it out (what the model sees of a recall is the store's,
:mod:`pgmemory.store.recall_text`)."""

from __future__ import annotations

import json
from typing import Any

from agent_framework import Message

from pgmemory.text.clean import readable_json

#: Default heading of the injected memories message.
DEFAULT_CONTEXT_PROMPT = (
    "## Memories\nConsider the following memories when answering user questions:"
)
#: ``Memory.metadata`` key of a stored tool call or tool result: ``"call"`` or ``"result"``
#: (the store's recall leaves such rows out unless asked: ``include_tools``).
TOOL_KIND = "pgmemory.tool"


def _arguments(value: Any) -> str:
    if isinstance(value, str):
        return readable_json(value)
    return json.dumps(value if value is not None else {}, ensure_ascii=False, default=str)


def _result(content: Any) -> str:
    """A tool result as readable UTF-8 JSON (the framework hands a non-str result over as
    ASCII-escaped JSON text: see :func:`pgmemory.text.clean.readable_json`)."""
    if content.exception is not None:
        return f"Error: {content.exception}"
    value = content.result
    if isinstance(value, str):
        return readable_json(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def render(message: Message, *, skip_call_ids: frozenset[str] | set[str] = frozenset()) -> str:
    """The text stored for a framework message: its text, plus the tool calls and results it
    carries (except those of ``skip_call_ids``), their JSON readable UTF-8; other content kinds
    are not text."""
    parts = [message.text] if message.text.strip() else []
    for content in message.contents:
        if content.type == "function_call" and content.call_id not in skip_call_ids:
            parts.append(f"[called {content.name} with {_arguments(content.arguments)}]")
        elif content.type == "function_result" and content.call_id not in skip_call_ids:
            parts.append(f"[tool result: {_result(content)}]")
    return "\n".join(parts).replace("\x00", "")


def tool_kind(message: Message) -> str | None:
    """``"call"`` / ``"result"`` when ``message`` carries tool calls or results and no text of
    its own (what recall leaves out by default), else None."""
    if message.text.strip():
        return None
    kinds = {c.type for c in message.contents}
    if "function_result" in kinds:
        return "result"
    if "function_call" in kinds:
        return "call"
    return None


__all__ = [
    "DEFAULT_CONTEXT_PROMPT",
    "TOOL_KIND",
    "render",
    "tool_kind",
]
