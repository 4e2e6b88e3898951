"""Chat messages: role, contents, identity and a *source stamp* saying where a message came from.

A :class:`Message` is immutable. Stamping (:meth:`Message.with_source`) and every other change
(:meth:`Message.replace`) return a copy, so the caller's message is never altered by the agent
or by a provider. :meth:`Message.to_dict` / :meth:`Message.from_dict` round-trip through plain
JSON types, which is how sessions and the PostgreSQL history keep messages.

The roles and source types are defined in :mod:`pgmemory.vocabulary`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeAlias

from pgmemory.errors import InvalidInputError
from pgmemory.vocabulary import (
    CHAT_HISTORY,
    CONTEXT_PROVIDER,
    EXTERNAL,
    ROLES,
    SOURCE_TYPES,
    Role,
    SourceType,
)


@dataclass(frozen=True, slots=True)
class TextContent:
    """Plain text."""

    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, slots=True)
class FunctionCallContent:
    """The model asks to call tool ``name`` with ``arguments`` (JSON text); ``call_id`` pairs it
    with its :class:`FunctionResultContent`. A mapping passed as ``arguments`` is encoded to JSON."""

    call_id: str
    name: str
    arguments: str = "{}"

    def __post_init__(self) -> None:
        if isinstance(self.arguments, Mapping):
            object.__setattr__(
                self, "arguments", json.dumps(dict(self.arguments), ensure_ascii=False)
            )
        elif not isinstance(self.arguments, str):
            raise InvalidInputError(
                f"FunctionCallContent.arguments must be JSON text or a mapping, got "
                f"{type(self.arguments).__name__}"
            )

    def parse_arguments(self) -> dict[str, Any]:
        """The arguments as a dict; raises :class:`InvalidInputError` if they are not a JSON object."""
        text = self.arguments.strip() or "{}"
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(
                f"arguments of call {self.call_id!r} to {self.name!r} are not valid JSON: {exc}"
            ) from None
        if not isinstance(value, dict):
            raise InvalidInputError(
                f"arguments of call {self.call_id!r} to {self.name!r} must be a JSON object, "
                f"got {type(value).__name__}"
            )
        return value

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "function_call",
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
        }


@dataclass(frozen=True, slots=True)
class FunctionResultContent:
    """What a tool call returned (``result``, JSON-native) or, if it raised, ``error`` text."""

    call_id: str
    result: Any = None
    error: str | None = None

    @property
    def text(self) -> str:
        """The result as the model sees it: a string as is, anything else as JSON."""
        if self.error is not None:
            return f"Error: {self.error}"
        if isinstance(self.result, str):
            return self.result
        return json.dumps(self.result, ensure_ascii=False, default=str)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "type": "function_result",
            "call_id": self.call_id,
            "result": self.result,
        }
        if self.error is not None:
            data["error"] = self.error
        return data


Content: TypeAlias = TextContent | FunctionCallContent | FunctionResultContent


def content_from_dict(data: Mapping[str, Any]) -> Content:
    """Rebuild one content item from :meth:`to_dict` output."""
    kind = data.get("type")
    if kind == "text":
        return TextContent(str(data.get("text", "")))
    if kind == "function_call":
        return FunctionCallContent(
            call_id=str(data["call_id"]),
            name=str(data["name"]),
            arguments=data.get("arguments", "{}"),
        )
    if kind == "function_result":
        return FunctionResultContent(
            call_id=str(data["call_id"]), result=data.get("result"), error=data.get("error")
        )
    raise InvalidInputError(
        f"unknown content type {kind!r}; expected 'text', 'function_call' or 'function_result'"
    )


def _now() -> datetime:
    return datetime.now(UTC)


def _check_role(role: object) -> Role:
    if role not in ROLES:
        raise InvalidInputError(f"message role {role!r} is not one of {', '.join(ROLES)}")
    return role  # type: ignore[return-value]


def _check_source_type(source_type: object) -> SourceType:
    if source_type not in SOURCE_TYPES:
        raise InvalidInputError(
            f"source_type {source_type!r} is not one of {', '.join(SOURCE_TYPES)}"
        )
    return source_type  # type: ignore[return-value]


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One chat message.

    ``Message("user", "hello")`` is the short form; ``contents=`` takes structured contents
    (text, function calls, function results). ``text`` given together with ``contents`` becomes
    the first text content. ``message_id`` defaults to a new UUID and ``created_at`` to now (UTC).
    """

    role: Role
    contents: tuple[Content, ...]
    author_name: str | None
    message_id: str
    created_at: datetime
    source_type: SourceType
    source_id: str | None
    origin_session_ids: tuple[str, ...]
    metadata: Mapping[str, Any] = field(hash=False)

    def __init__(
        self,
        role: Role,
        text: str | None = None,
        *,
        contents: Iterable[Content] = (),
        author_name: str | None = None,
        message_id: str | None = None,
        created_at: datetime | None = None,
        source_type: SourceType = EXTERNAL,
        source_id: str | None = None,
        origin_session_ids: Iterable[str] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        items: list[Content] = []
        if text is not None:
            if not isinstance(text, str):
                raise InvalidInputError(f"message text must be a string, got {type(text).__name__}")
            items.append(TextContent(text))
        for item in contents:
            if not isinstance(item, (TextContent, FunctionCallContent, FunctionResultContent)):
                raise InvalidInputError(
                    f"message content {item!r} is not TextContent, FunctionCallContent or "
                    "FunctionResultContent"
                )
            items.append(item)
        if created_at is not None and created_at.tzinfo is None:
            created_at = created_at.replace(tzinfo=UTC)
        set_ = object.__setattr__
        set_(self, "role", _check_role(role))
        set_(self, "contents", tuple(items))
        set_(self, "author_name", author_name or None)
        set_(self, "message_id", str(message_id) if message_id else str(uuid.uuid4()))
        set_(self, "created_at", created_at or _now())
        set_(self, "source_type", _check_source_type(source_type))
        set_(self, "source_id", source_id or None)
        set_(self, "origin_session_ids", tuple(str(s) for s in origin_session_ids))
        set_(self, "metadata", dict(metadata or {}))

    def __hash__(self) -> int:  # contents may hold unhashable results; the id identifies it
        return hash(self.message_id)

    # -- reading -------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """All text contents joined with newlines ('' if there are none)."""
        return "\n".join(c.text for c in self.contents if isinstance(c, TextContent))

    @property
    def function_calls(self) -> list[FunctionCallContent]:
        """The function calls this message carries (assistant messages)."""
        return [c for c in self.contents if isinstance(c, FunctionCallContent)]

    @property
    def function_results(self) -> list[FunctionResultContent]:
        """The function results this message carries (tool messages)."""
        return [c for c in self.contents if isinstance(c, FunctionResultContent)]

    @property
    def is_blank(self) -> bool:
        """True when the message has no text, no call and no result worth keeping."""
        return not self.text.strip() and not self.function_calls and not self.function_results

    # -- copies ----------------------------------------------------------------------------

    def replace(self, **changes: Any) -> Message:
        """A copy with the given fields changed (same names as the constructor)."""
        fields: dict[str, Any] = {
            "contents": self.contents,
            "author_name": self.author_name,
            "message_id": self.message_id,
            "created_at": self.created_at,
            "source_type": self.source_type,
            "source_id": self.source_id,
            "origin_session_ids": self.origin_session_ids,
            "metadata": self.metadata,
        }
        role = changes.pop("role", self.role)
        unknown = set(changes) - set(fields) - {"text"}
        if unknown:
            raise InvalidInputError(
                f"Message.replace got unknown field(s): {', '.join(sorted(unknown))}"
            )
        if "text" in changes:
            text = changes.pop("text")
            kept = [
                c for c in changes.get("contents", self.contents) if not isinstance(c, TextContent)
            ]
            changes["contents"] = ([TextContent(text)] if text is not None else []) + kept
        fields.update(changes)
        return Message(role, **fields)

    def with_source(
        self,
        source_type: SourceType,
        source_id: str | None = None,
        *,
        origin_session_id: str | None = None,
    ) -> Message:
        """A copy stamped with where it came from; the original is untouched.

        ``origin_session_id`` is appended to :attr:`origin_session_ids` (for messages recalled
        from another session) unless already present.
        """
        origins = self.origin_session_ids
        if origin_session_id and origin_session_id not in origins:
            origins = (*origins, origin_session_id)
        return self.replace(
            source_type=_check_source_type(source_type),
            source_id=source_id,
            origin_session_ids=origins,
        )

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form (strings, numbers, lists, dicts only)."""
        data: dict[str, Any] = {
            "message_id": self.message_id,
            "role": self.role,
            "text": self.text,
            "contents": [c.to_dict() for c in self.contents],
            "author_name": self.author_name,
            "created_at": self.created_at.isoformat(),
            "source_type": self.source_type,
            "source_id": self.source_id,
            "origin_session_ids": list(self.origin_session_ids),
        }
        if self.metadata:
            data["metadata"] = dict(self.metadata)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Rebuild a message from :meth:`to_dict` output.

        ``contents`` wins over ``text`` (which :meth:`to_dict` writes only as a convenience for
        SQL readers); a dict with just ``role`` and ``text`` works too.
        """
        if not isinstance(data, Mapping):
            raise InvalidInputError(f"Message.from_dict needs a mapping, got {type(data).__name__}")
        if "role" not in data:
            raise InvalidInputError(
                f"message dict has no 'role' (its keys: {sorted(map(str, data))})"
            )
        raw_contents = data.get("contents")
        if raw_contents is None:
            text = data.get("text")
            contents: list[Content] = [TextContent(text)] if text is not None else []
        else:
            contents = [content_from_dict(c) for c in raw_contents]
        created = data.get("created_at")
        if isinstance(created, str):
            created = datetime.fromisoformat(created)
        return cls(
            data["role"],
            contents=contents,
            author_name=data.get("author_name"),
            message_id=data.get("message_id"),
            created_at=created,
            source_type=data.get("source_type") or EXTERNAL,
            source_id=data.get("source_id"),
            origin_session_ids=data.get("origin_session_ids") or (),
            metadata=data.get("metadata"),
        )

    def __repr__(self) -> str:
        shown = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        extra = ""
        if self.function_calls:
            extra += f", calls={[c.name for c in self.function_calls]}"
        if self.function_results:
            extra += f", results={[c.call_id for c in self.function_results]}"
        return (
            f"Message({self.role!r}, {shown!r}{extra}, source={self.source_type}"
            f"{':' + self.source_id if self.source_id else ''}, id={self.message_id[:8]})"
        )


#: What :meth:`pgmemory.Agent.run` accepts: a string (one user message), a :class:`Message`, a
#: mapping in OpenAI message shape, or a list (or tuple) of those.
AgentInput: TypeAlias = (
    "str | Message | Mapping[str, Any] | Sequence[str | Message | Mapping[str, Any]]"
)

_ACCEPTED_INPUT = (
    "a str, a Message, a mapping in OpenAI message shape such as "
    "{'role': 'user', 'content': '...'}, or a list of those"
)


def as_messages(value: AgentInput | None) -> list[Message]:
    """Normalise an agent input into messages.

    A string becomes one user message; a mapping is one message (:func:`message_from_mapping`);
    a list or tuple may mix strings, messages and mappings.

    Raises:
        InvalidInputError: ``value`` (or an item) is of another type; the message names the
            accepted types (never the value, which is user text).
    """
    if value is None:
        return []
    if isinstance(value, (str, Message, Mapping)):
        value = [value]
    elif not isinstance(value, (list, tuple)):
        raise InvalidInputError(
            f"agent input is of type {type(value).__name__}; pass {_ACCEPTED_INPUT}"
        )
    result: list[Message] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            result.append(Message("user", item))
        elif isinstance(item, Message):
            result.append(item)
        elif isinstance(item, Mapping):
            result.append(message_from_mapping(item, where=f"agent input item {i}"))
        else:
            raise InvalidInputError(
                f"agent input item {i} is of type {type(item).__name__}; pass {_ACCEPTED_INPUT}"
            )
    return result


def message_from_mapping(data: Mapping[str, Any], *, where: str = "message") -> Message:
    """One message from a mapping in OpenAI chat-completions shape, or :meth:`Message.to_dict`'s.

    OpenAI shape: ``role`` and ``content`` (a string, None, or a list of ``{"type": "text",
    "text": ...}`` parts), optionally ``name`` (the author), ``tool_calls`` (assistant) and
    ``tool_call_id`` (a ``tool`` message answering a call). A mapping without ``content`` but
    with ``contents`` or ``text`` is read by :meth:`Message.from_dict`.

    Raises:
        InvalidInputError: the mapping fits neither shape (the message names the keys, never
            their values).
    """
    if "content" not in data:
        if "contents" in data or "text" in data:
            return Message.from_dict(data)
        raise InvalidInputError(
            f"{where} is a mapping with keys {sorted(map(str, data))}; a message mapping needs "
            "'role' and 'content', e.g. {'role': 'user', 'content': '...'}"
        )
    role = data.get("role")
    if role not in ROLES:
        raise InvalidInputError(f"{where} has no usable 'role'; expected one of {', '.join(ROLES)}")
    text: str | None = _content_text(data["content"], where=where)
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidInputError(f"{where} has a {type(name).__name__} 'name'; expected a string")
    contents: list[Content] = []
    call_id = data.get("tool_call_id")
    if role == "tool" and call_id is not None:
        contents.append(FunctionResultContent(str(call_id), result=text or ""))
        text = None
    for j, call in enumerate(data.get("tool_calls") or ()):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidInputError(
                f"{where} tool_calls[{j}] needs 'function': {{'name': ..., 'arguments': ...}}"
            )
        contents.append(
            FunctionCallContent(
                call_id=str(call.get("id") or uuid.uuid4()),
                name=function["name"],
                arguments=function.get("arguments") or "{}",
            )
        )
    return Message(role, text or None, contents=contents, author_name=name)


def _content_text(content: object, *, where: str) -> str:
    """The text of an OpenAI ``content``: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif (
                isinstance(part, Mapping)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                parts.append(part["text"])
            else:
                raise InvalidInputError(
                    f"{where} has a content part that is not text; only text parts "
                    "({'type': 'text', 'text': '...'}) are supported"
                )
        return "\n".join(parts)
    raise InvalidInputError(
        f"{where} has a {type(content).__name__} 'content'; expected a string or a list of "
        "text parts"
    )


def filter_by_source(
    messages: Iterable[Message], source_types: str | Iterable[str]
) -> list[Message]:
    """The messages whose ``source_type`` is one of ``source_types``."""
    wanted = {source_types} if isinstance(source_types, str) else set(source_types)
    for kind in wanted:
        _check_source_type(kind)
    return [m for m in messages if m.source_type in wanted]


def external_only(messages: Iterable[Message]) -> list[Message]:
    """The default search/storage input filter: only messages the caller passed in."""
    return [m for m in messages if m.source_type == EXTERNAL]


def all_messages(messages: Iterable[Message]) -> list[Message]:
    """A filter that keeps everything (the default storage filter for response messages)."""
    return list(messages)


__all__ = [
    "CHAT_HISTORY",
    "CONTEXT_PROVIDER",
    "EXTERNAL",
    "AgentInput",
    "Content",
    "FunctionCallContent",
    "FunctionResultContent",
    "Message",
    "Role",
    "SourceType",
    "TextContent",
    "all_messages",
    "as_messages",
    "content_from_dict",
    "external_only",
    "filter_by_source",
    "message_from_mapping",
]
