"""A chat session's history, page by page, for the operator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgmemory.admin import statements as s
from pgmemory.admin.pages import check_user, clamp_limit, read_rows
from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store._engine.database import Database
from pgmemory.store.records import HistoryRow
from pgmemory.store.validation import check_name

# --- chat history ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """A page of a session's history in order; the seq bounds continue the walk (None: none)."""

    rows: list[HistoryRow]
    #: Pass as ``after_seq`` for the next (later) messages.
    next_after_seq: int | None
    #: Pass as ``before_seq`` for the previous (earlier) messages.
    prev_before_seq: int | None
    total: int


async def session_history(
    db: Database,
    user_id: str,
    session_id: str,
    *,
    after_seq: int | None = None,
    before_seq: int | None = None,
    limit: int | None = None,
) -> HistoryPage:
    """A page of a chat session's history in order (the store's own history statements).

    Args:
        db: the store's database.
        user_id: the user the session belongs to.
        session_id: the session.
        after_seq: the messages after this seq (default: from the start).
        before_seq: instead, the page of messages just before this seq.
        limit: messages per page (clamped to 1..MAX_PAGE).

    Returns:
        The page and the session's message count.
    """
    user_id = check_user(user_id)
    check_name(session_id, what="session_id")
    if after_seq is not None and before_seq is not None:
        raise InvalidInputError("pass at most one of after_seq= and before_seq=")
    limit = clamp_limit(limit)
    params: dict[str, Any] = {"user_id": user_id, "session_id": session_id, "limit": limit + 1}
    if before_seq is not None:
        rows = await read_rows(db, s.READ_HISTORY_BEFORE, {**params, "before_seq": before_seq})
        more_before = len(rows) > limit
        page = [HistoryRow(**r) for r in rows[:limit]][::-1]
        more_after = True
    else:
        start = after_seq or 0
        rows = await read_rows(db, q.READ_HISTORY, {**params, "after_seq": start})
        more_after = len(rows) > limit
        page = [HistoryRow(**r) for r in rows[:limit]]
        more_before = start > 0
    total = (await read_rows(db, q.COUNT_HISTORY, params))[0]["count"]
    return HistoryPage(
        rows=page,
        next_after_seq=page[-1].seq if page and more_after else None,
        prev_before_seq=page[0].seq if page and more_before else None,
        total=int(total),
    )
