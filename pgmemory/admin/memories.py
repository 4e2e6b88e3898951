"""A user's stored memories, page by page, and the audit of their writes and deletes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgmemory.admin import statements as s
from pgmemory.admin.pages import Cursor, Page, check_user, clamp_limit, keyset_page, read_rows
from pgmemory.store._engine.database import Database
from pgmemory.store.records import Memory, MemoryScope
from pgmemory.store.validation import check_name, check_optional_name

# --- memories ----------------------------------------------------------------------------------


def _memory(row: Mapping[str, Any]) -> Memory:
    return Memory(
        id=row["id"],
        collection=row["collection"],
        scope=MemoryScope(
            application_id=row["application_id"] or None,
            agent_id=row["agent_id"] or None,
            user_id=row["user_id"] or None,
            session_id=row["session_id"] or None,
        ),
        role=row["role"],
        content=row["content"],
        author_name=row["author_name"],
        message_id=row["message_id"],
        source_type=row["source_type"],
        source_id=row["source_id"],
        embedding_model=row["embedding_model"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        metadata=row["metadata"],
    )


def _memory_edge(memory: Memory) -> Cursor:
    return Cursor(memory.created_at, memory.id)


async def user_memories(
    db: Database,
    user_id: str,
    collection: str,
    *,
    session_id: str | None = None,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
) -> Page[Memory]:
    """A page of a user's memories in a collection, newest first.

    Expired memories that :meth:`MemoryStore.expire <pgmemory.store.store.MemoryStore.expire>` has not reclaimed yet are included: they
    are still stored (searches skip them).

    Args:
        db: the store's database.
        user_id: the user.
        collection: the collection.
        session_id: only this session's memories (None: every session).
        before: continue with the memories older than this cursor (a page's ``older``).
        after: go back to the memories newer than this cursor (a page's ``newer``).
        limit: memories per page (clamped to 1..MAX_PAGE).

    Returns:
        The page.
    """
    return await keyset_page(
        db,
        (s.USER_MEMORIES_OLDER, s.USER_MEMORIES_NEWER),
        {
            "user_id": check_user(user_id),
            "collection": check_name(collection, what="collection"),
            "session_id": check_optional_name(session_id, what="session_id"),
        },
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=True,
        make=_memory,
        edge=_memory_edge,
    )


async def get_memory(db: Database, user_id: str, memory_id: uuid.UUID) -> Memory | None:
    """One of a user's memories, or None if it is not stored (never was, or deleted).

    Args:
        db: the store's database.
        user_id: the user.
        memory_id: the memory's id.

    Returns:
        The memory or None.
    """
    rows = await read_rows(
        db, s.USER_MEMORY, {"user_id": check_user(user_id), "memory_id": memory_id}
    )
    return _memory(rows[0]) if rows else None


# --- write/delete audit -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryAuditEntry:
    """One write, delete or expiry of a memory (the content is kept only as its sha256)."""

    id: int
    at: datetime
    txid: int
    operation: str
    memory_id: uuid.UUID
    collection: str
    application_id: str
    agent_id: str
    session_id: str
    content_sha256: str
    actor: str


async def user_memory_audit(
    db: Database,
    user_id: str,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
) -> Page[MemoryAuditEntry]:
    """A page of a user's memory write/delete audit, newest first.

    Args:
        db: the store's database.
        user_id: the user.
        before: continue with older entries (a page's ``older`` cursor).
        after: go back to newer entries (a page's ``newer`` cursor).
        limit: entries per page (clamped to 1..MAX_PAGE).

    Returns:
        The page.
    """
    return await keyset_page(
        db,
        (s.USER_MEMORY_AUDIT_OLDER, s.USER_MEMORY_AUDIT_NEWER),
        {"user_id": check_user(user_id)},
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=False,
        make=lambda r: MemoryAuditEntry(**r),
        edge=lambda e: Cursor(e.at, e.id),
    )


async def memory_audit_trail(
    db: Database, user_id: str, memory_id: uuid.UUID, *, limit: int = 100
) -> list[MemoryAuditEntry]:
    """The audit entries of one memory, oldest first (its insert, then a delete or expiry).

    Args:
        db: the store's database.
        user_id: the user.
        memory_id: the memory.
        limit: most entries returned (clamped to 1..MAX_PAGE).

    Returns:
        The entries.
    """
    rows = await read_rows(
        db,
        s.MEMORY_AUDIT_TRAIL,
        {"user_id": check_user(user_id), "memory_id": memory_id, "limit": clamp_limit(limit)},
    )
    return [MemoryAuditEntry(**r) for r in rows]
