"""Chat history: each session's messages, in order, as JSON.

A session is keyed by ``(user_id, session_id)`` (``user_id`` ``''`` when unknown). Appends to
one session are serialised by an advisory lock, so concurrent writers never pick the same
``seq``; a message id already in the session is skipped, so a retried save does not duplicate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb
from sqlalchemy import text

from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store.database import Database
from pgmemory.store.records import HistoryRow
from pgmemory.store.validation import check_choice, check_limit, check_metadata, check_name
from pgmemory.vocabulary import ROLES


async def append(
    db: Database, session_id: str, messages: Sequence[Mapping[str, Any]], *, user_id: str
) -> int:
    """Append messages (JSON-native dicts with ``message_id`` and ``role``) in ONE transaction.

    Returns:
        How many rows were inserted.

    Raises:
        InvalidInputError: A message is not a dict, lacks a usable ``message_id`` or ``role``,
            or is not JSON-serialisable.
    """
    check_name(session_id, what="session_id")
    if user_id:
        check_name(user_id, what="user_id")
    ids: list[str] = []
    roles: list[str] = []
    payloads: list[Jsonb] = []
    seen: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidInputError(f"messages[{i}] must be a dict, got {type(message).__name__}")
        message_id = check_name(message.get("message_id"), what=f"messages[{i}].message_id")
        role = check_choice(message.get("role"), what=f"messages[{i}].role", choices=ROLES)
        if message_id in seen:
            continue
        seen.add(message_id)
        ids.append(message_id)
        roles.append(role)
        payloads.append(Jsonb(check_metadata(message, what=f"messages[{i}]")))
    if not ids:
        return 0
    params = {"session_id": session_id, "user_id": user_id}
    async with db.transaction() as conn:
        await conn.execute(text(q.LOCK_HISTORY), params)
        result = await conn.execute(
            text(q.APPEND_HISTORY),
            {**params, "message_ids": ids, "roles": roles, "messages": payloads},
        )
        return int(result.rowcount)


async def read(
    db: Database, session_id: str, *, user_id: str, after_seq: int, limit: int | None
) -> list[HistoryRow]:
    """A session's messages in order: those after ``after_seq``, at most ``limit`` (None: all)."""
    check_name(session_id, what="session_id")
    if limit is not None:
        check_limit(limit, maximum=1_000_000)
    params = {"session_id": session_id, "user_id": user_id, "after_seq": after_seq, "limit": limit}
    async with db.autocommit() as conn:
        rows = (await conn.execute(text(q.READ_HISTORY), params)).mappings().all()
    return [HistoryRow(**row) for row in rows]


async def count(db: Database, session_id: str, *, user_id: str) -> int:
    """How many messages a session's history holds."""
    async with db.autocommit() as conn:
        result = await conn.execute(
            text(q.COUNT_HISTORY), {"session_id": session_id, "user_id": user_id}
        )
        return int(result.scalar_one())


async def delete(db: Database, session_id: str, *, user_id: str) -> int:
    """Erase a session's history; returns the rows deleted."""
    async with db.transaction() as conn:
        result = await conn.execute(
            text(q.DELETE_HISTORY), {"session_id": session_id, "user_id": user_id}
        )
        return int(result.rowcount)
