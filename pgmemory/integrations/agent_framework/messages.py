"""Where a framework message came from, and the fields pgmemory keeps that the framework has not.

agent-framework stamps every message a provider adds with
``additional_properties["_attribution"]`` (its ``source_id``, and ``origin_session_ids`` for
content of other sessions); the caller's input carries none. pgmemory's stored *source type*
follows from it: no attribution is ``external`` (the caller), a history provider's is
``chat_history``, any other provider's ``context_provider``.

What the framework has no field for rides in ``additional_properties`` under ``pgmemory.*``
keys: the time a message was made (``pgmemory.created_at``, ISO 8601) and the memory ids of an
injected recall (``pgmemory.memory_ids``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias

from agent_framework import HistoryProvider, Message, SessionContext

from pgmemory.errors import InvalidInputError
from pgmemory.vocabulary import CHAT_HISTORY, CONTEXT_PROVIDER, EXTERNAL, SourceType

#: Where the framework keeps attribution in ``Message.additional_properties``.
ATTRIBUTION = "_attribution"
#: The time a message was made, where the framework has no field for it.
CREATED_AT = "pgmemory.created_at"
#: The memory ids an injected recall message shows.
MEMORY_IDS = "pgmemory.memory_ids"

#: Picks the messages a provider searches with or stores (default :func:`external_only`).
MessageFilter: TypeAlias = Callable[[Sequence[Message]], Sequence[Message]]


def attribution(message: Message) -> dict[str, Any]:
    """The framework's attribution stamp of ``message`` (empty for the caller's own)."""
    stamp = (message.additional_properties or {}).get(ATTRIBUTION)
    return dict(stamp) if isinstance(stamp, dict) else {}


def source_id_of(message: Message) -> str | None:
    """The id of the provider that added ``message``, or None for the caller's input."""
    value = attribution(message).get("source_id")
    return value if isinstance(value, str) and value else None


def history_sources(agent: Any) -> frozenset[str]:
    """The source ids of the agent's history providers."""
    providers = getattr(agent, "context_providers", None) or ()
    return frozenset(p.source_id for p in providers if isinstance(p, HistoryProvider))


def source_type_of(message: Message, histories: Iterable[str] = ()) -> SourceType:
    """pgmemory's source type of ``message``: ``external`` without attribution,
    ``chat_history`` when a history provider (one of ``histories``) added it, else
    ``context_provider``."""
    source = source_id_of(message)
    if source is None:
        return EXTERNAL
    return CHAT_HISTORY if source in set(histories) else CONTEXT_PROVIDER


def external_only(messages: Sequence[Message]) -> list[Message]:
    """The caller's own messages: those no provider added (the default filter)."""
    return [m for m in messages if source_id_of(m) is None]


def all_messages(messages: Sequence[Message]) -> list[Message]:
    """Every message (for the storage response filter, whose default it is)."""
    return list(messages)


def user_messages(texts: Iterable[str]) -> list[Message]:
    """Plain ``user`` messages of these texts (blank ones left out): what an extraction request
    sends, without the caller's ids, attribution or other contents."""
    return [Message("user", [text]) for text in texts if text.strip()]


def input_messages(context: SessionContext) -> list[Message]:
    """The run's input messages (``context.input_messages``), each checked to be a ``Message``.

    ``agent.run()`` takes a str, ``Content`` or ``Message``, or a sequence of them; the
    framework turns each str and ``Content`` into a message but passes any other item through
    as it is (a bytes value is iterated into ints). Such an item is outside the framework's
    input contract and carries nothing a provider could store or search with, so it is refused
    rather than skipped: dropping it would store a turn without part of what the caller sent.

    Raises:
        InvalidInputError: an item is not a ``Message``; the message names its position and
            type, never its value.
    """
    messages = context.input_messages
    for position, item in enumerate(messages):
        if not isinstance(item, Message):
            bytes_item = type(item) is int
            hint = (
                " (a bytes value is iterated into ints: decode it to a str)" if bytes_item else ""
            )
            raise InvalidInputError(
                f"the run's input item {position} is a {type(item).__name__}, not a Message"
                f"{hint}; pass agent.run() a str, Content or Message, or a list of them. "
                "Nothing was read or written."
            )
    return messages


def ensure_identity(message: Message) -> str:
    """The message's id, given one (a UUID) when it has none, and its creation time recorded.

    Changed in place, so every provider of a turn stores the caller's message under the one
    id, and a retried save of it is skipped rather than duplicated.
    """
    if not message.message_id:
        message.message_id = str(uuid.uuid4())
    if message.additional_properties is None:
        message.additional_properties = {}
    message.additional_properties.setdefault(CREATED_AT, datetime.now(UTC).isoformat())
    return message.message_id


def created_at(message: Message) -> datetime | None:
    """When ``message`` was made, if pgmemory recorded it."""
    raw = (message.additional_properties or {}).get(CREATED_AT)
    if not isinstance(raw, str):
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


__all__ = [
    "ATTRIBUTION",
    "CREATED_AT",
    "MEMORY_IDS",
    "MessageFilter",
    "all_messages",
    "attribution",
    "created_at",
    "ensure_identity",
    "external_only",
    "history_sources",
    "input_messages",
    "source_id_of",
    "source_type_of",
    "user_messages",
]
