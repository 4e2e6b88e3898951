"""Chat history: each session's messages, in order, as JSON.

A session is keyed by ``(user_id, session_id)`` (``user_id`` ``''`` when unknown). Appends to
one session are serialised by an advisory lock, so concurrent writers never pick the same
``seq`` and never wait for each other's message ids in a cycle (two appends of the same
messages in opposite orders: one waits for the other, then skips what it stored); a message id
already in the session is skipped, so a retried save does not duplicate.

Messages are stored as JSON cleaned like all free text (:mod:`pgmemory.text.clean`: NUL and
lone surrogates become U+FFFD, nesting is limited); ids are refused instead, and the user id,
session id and message id must fit one index entry together (2,704 bytes of UTF-8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

import pgmemory.telemetry as telemetry
from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store._engine.deployment import Write
from pgmemory.store.jsonb import jsonb
from pgmemory.store.records import HistoryRow
from pgmemory.store.validation import (
    HISTORY_INDEXES,
    MAX_NAME_CHARS,
    check_choice,
    check_index_entries,
    check_limit,
    check_metadata,
    check_name,
    check_text,
    describe,
)
from pgmemory.vocabulary import ROLES


async def append(
    db: Database, session_id: str, messages: Sequence[Mapping[str, Any]], *, user_id: str
) -> int:
    """Append messages (JSON-native dicts with ``message_id`` and ``role``) in ONE transaction.

    Returns:
        How many rows were inserted (in a deferred unit of work, how many it sends with its
        commit: a message id already stored is skipped then).

    Raises:
        InvalidInputError: A message is not a dict, lacks a usable ``message_id`` or ``role``,
            is not JSON-native, or its ids do not fit an index entry; nothing is stored.
    """
    with telemetry.operation(
        telemetry.UPDATE_MEMORY, settings=db.settings, user_id=user_id, kind="history"
    ) as op:
        _check_key(session_id, user_id)
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise InvalidInputError(f"messages must be a list of dicts, got {describe(messages)}")
        ids: list[str] = []
        roles: list[str] = []
        payloads: list[Jsonb] = []
        seen: set[str] = set()
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise InvalidInputError(f"messages[{i}] must be a dict, got {describe(message)}")
            message_id = check_name(message.get("message_id"), what=f"messages[{i}].message_id")
            role = check_choice(message.get("role"), what=f"messages[{i}].role", choices=ROLES)
            check_index_entries(
                HISTORY_INDEXES,
                {"user_id": user_id, "session_id": session_id, "message_id": message_id},
                where=f"messages[{i}]",
                names={
                    "message_id": "message_id",
                    "user_id": "user_id",
                    "session_id": "session_id",
                },
            )
            if message_id in seen:
                continue
            seen.add(message_id)
            ids.append(message_id)
            roles.append(role)
            payloads.append(jsonb(check_metadata(message, what=f"messages[{i}]")))
        if not ids:
            return 0
        # The rows returned, not the rowcount: Citus reports the rows its INSERT ... SELECT sent
        # to the shards, the skipped ones included.
        rows = await db.written(
            Write(
                q.HISTORY_APPEND,
                {
                    "session_id": session_id,
                    "user_id": user_id,
                    "message_ids": ids,
                    "roles": roles,
                    "messages": payloads,
                },
                users=(user_id,),
                sessions=((user_id, session_id),),
                deferrable=True,
            )
        )
        added = len(ids) if rows is None else len(rows)  # None: sent with the unit's commit
        op.count("record.count", added)
        return added


async def read(
    db: Database, session_id: str, *, user_id: str, after_seq: int, limit: int | None
) -> list[HistoryRow]:
    """A session's messages in order: those after ``after_seq``, at most ``limit`` (None: all)."""
    with telemetry.operation(
        telemetry.SEARCH_MEMORY, settings=db.settings, user_id=user_id, kind="history"
    ) as op:
        _check_key(session_id, user_id)
        if limit is not None:
            check_limit(limit, maximum=1_000_000)
        if not isinstance(after_seq, int) or isinstance(after_seq, bool) or after_seq < 0:
            raise InvalidInputError(f"after_seq is {describe(after_seq)}; expected an integer >= 0")
        params = {
            "session_id": session_id,
            "user_id": user_id,
            "after_seq": after_seq,
            "limit": limit,
        }
        rows = await db.read_rows(q.READ_HISTORY, params, user=user_id)
        op.count("result.count", len(rows))
        return [HistoryRow(**row) for row in rows]


async def count(db: Database, session_id: str, *, user_id: str) -> int:
    """How many messages a session's history holds."""
    _check_key(session_id, user_id)
    async with db.read(user_id) as conn:
        result = await conn.execute(
            clause(q.COUNT_HISTORY), {"session_id": session_id, "user_id": user_id}
        )
        return int(result.scalar_one())


async def delete(db: Database, session_id: str, *, user_id: str) -> int:
    """Erase a session's history; returns the rows deleted."""
    _check_key(session_id, user_id)
    async with db.write(users=(user_id,)) as conn:
        result = await conn.execute(
            clause(q.DELETE_HISTORY), {"session_id": session_id, "user_id": user_id}
        )
        return int(result.rowcount)


def _check_key(session_id: object, user_id: object) -> None:
    """A session's key: a session id, and a user id or ``''`` (unknown).

    Raises:
        InvalidInputError: The session id is unusable.
        ScopeError: The user id is not a string, or is blank, too long, or holds NUL or a lone
            surrogate (a user id is a scope).
    """
    check_name(session_id, what="session_id")
    if not isinstance(user_id, str):
        raise ScopeError(f"user_id must be a string ('' when unknown), got {describe(user_id)}")
    if user_id:
        check_text(
            user_id,
            what="user_id",
            max_chars=MAX_NAME_CHARS,
            error=ScopeError,
            expected="a string",
            if_blank="pass '' when the user is unknown, or a non-blank id",
            if_long="use a shorter id or a hash of it",
        )
