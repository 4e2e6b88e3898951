"""A user's recalls (the recall audit): which memories went into which answer, and the
recalls a memory was part of.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgmemory.admin import statements as s
from pgmemory.admin.pages import (
    Cursor,
    Page,
    check_user,
    clamp_limit,
    keyset_page,
    read_rows,
)
from pgmemory.store._engine.database import Database
from pgmemory.store.records import Signals

# --- recalls ------------------------------------------------------------------------------------


#: Returned memories shown per recall in a list of recalls (the recall's own page shows more).
RECALL_PREVIEW = 10
#: Returned memories shown on one recall's page.
RECALL_DETAIL_MAX = 500


@dataclass(frozen=True, slots=True)
class RecalledMemory:
    """A memory a recall returned, at its rank, as it is stored now.

    ``content`` and the other memory columns are None when the memory has been deleted since;
    ``deleted_at``/``deleted_by`` then tell when and how, if the audit still has it.
    ``reason`` (``match``, ``recent``, ``neighbour``) and ``signals`` (what similarity,
    keywords, recency and the neighbour share contributed to the score) are None in recalls
    recorded without them (before migration 0010, or by a search without ``explain``).
    """

    rank: int
    memory_id: uuid.UUID
    score: float
    reason: str | None
    signals: Signals | None
    collection: str | None
    role: str | None
    content: str | None
    session_id: str | None
    created_at: datetime | None
    expires_at: datetime | None
    deleted_at: datetime | None
    deleted_by: str | None

    @property
    def deleted(self) -> bool:
        """True when the memory is no longer stored."""
        return self.content is None


@dataclass(frozen=True, slots=True)
class Recall:
    """One recall-audit row: who searched which scope, how, and what came back.

    The query is kept as its sha256 (``query_sha256``); ``query_text`` is set only when the
    caller asked for the text to be kept (and blanked by a user's erasure).
    """

    id: int
    at: datetime
    collection: str
    application_id: str
    agent_id: str
    session_id: str
    provider: str
    mode: str
    requesting_session_id: str
    query_sha256: str
    query_text: str | None
    returned: int
    memories: list[RecalledMemory] = field(default_factory=list)


def _recall(row: Mapping[str, Any], memories: list[RecalledMemory] | None = None) -> Recall:
    return Recall(**row, memories=memories or [])


def _recalled(row: Mapping[str, Any]) -> RecalledMemory:
    return RecalledMemory(
        rank=int(row["rank"]),
        memory_id=row["memory_id"],
        score=float(row["score"]),
        reason=row["reason"],
        signals=Signals.from_dict(row["signals"]),
        collection=row["collection"],
        role=row["role"],
        content=row["content"],
        session_id=row["session_id"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        deleted_at=row["deleted_at"],
        deleted_by=row["deleted_by"],
    )


async def _recalled_memories(
    db: Database, user_id: str, recall_ids: Sequence[int], per_recall: int
) -> dict[int, list[RecalledMemory]]:
    found: dict[int, list[RecalledMemory]] = {i: [] for i in recall_ids}
    if not recall_ids:
        return found
    rows = await read_rows(
        db,
        s.RECALLED_MEMORIES,
        {"user_id": user_id, "recall_ids": list(recall_ids), "per_recall": per_recall},
    )
    for row in rows:
        found[row["recall_id"]].append(_recalled(row))
    return found


async def user_recalls(
    db: Database,
    user_id: str,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
    preview: int = RECALL_PREVIEW,
) -> Page[Recall]:
    """A page of a user's recalls, newest first, each with the first memories it returned.

    Args:
        db: the store's database.
        user_id: the user.
        before: continue with older recalls (a page's ``older`` cursor).
        after: go back to newer recalls (a page's ``newer`` cursor).
        limit: recalls per page (clamped to 1..MAX_PAGE).
        preview: returned memories joined per recall (``Recall.returned`` counts them all).

    Returns:
        The page.
    """
    user_id = check_user(user_id)
    page: Page[dict[str, Any]] = await keyset_page(
        db,
        (s.USER_RECALLS_OLDER, s.USER_RECALLS_NEWER),
        {"user_id": user_id},
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=False,
        make=dict,
        edge=lambda r: Cursor(r["at"], r["id"]),
    )
    joined = await _recalled_memories(
        db, user_id, [r["id"] for r in page.items], max(0, min(preview, RECALL_DETAIL_MAX))
    )
    return Page(
        [_recall(r, joined[r["id"]]) for r in page.items], older=page.older, newer=page.newer
    )


async def get_recall(
    db: Database,
    user_id: str,
    recall_id: int,
    *,
    limit: int = RECALL_DETAIL_MAX,
) -> Recall | None:
    """One recall of a user with the memories it returned, in rank order, joined to the
    memories as they are stored now (deleted ones marked as such).

    Args:
        db: the store's database.
        user_id: the user.
        recall_id: the recall-audit row's id.
        limit: most returned memories joined (``Recall.returned`` counts them all).

    Returns:
        The recall, or None if this user has no such recall.
    """
    user_id = check_user(user_id)
    rows = await read_rows(db, s.USER_RECALL, {"user_id": user_id, "recall_id": recall_id})
    if not rows:
        return None
    joined = await _recalled_memories(
        db, user_id, [recall_id], max(0, min(limit, RECALL_DETAIL_MAX))
    )
    return _recall(rows[0], joined[recall_id])


@dataclass(frozen=True, slots=True)
class MemoryRecall:
    """A recall that returned a given memory, with the memory's score and rank in it."""

    recall: Recall
    score: float
    rank: int


async def recalls_of_memory(
    db: Database,
    user_id: str,
    memory_id: uuid.UUID,
    *,
    limit: int | None = 20,
) -> list[MemoryRecall]:
    """The latest recalls of a user that returned this memory ("which answers used it").

    Args:
        db: the store's database.
        user_id: the user.
        memory_id: the memory.
        limit: most recalls returned (clamped to 1..MAX_PAGE).

    Returns:
        Newest first.
    """
    rows = await read_rows(
        db,
        s.RECALLS_OF_MEMORY,
        {"user_id": check_user(user_id), "memory_id": memory_id, "limit": clamp_limit(limit)},
    )
    out = []
    for row in rows:
        data = dict(row)
        score, rank = float(data.pop("score")), int(data.pop("rank"))
        out.append(MemoryRecall(_recall(data), score, rank))
    return out
