"""The users an operator finds: the directory of every user any table knows, and each one's
scopes and chat sessions.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from datetime import datetime

from pgmemory.admin import statements as s
from pgmemory.admin.pages import check_user, clamp_limit, read_rows
from pgmemory.store._engine.database import Database
from pgmemory.store.records import MemoryScope

# --- users and scopes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserSummary:
    """One user on the index: memories per collection, recalls, and when they were last active."""

    user_id: str
    #: collection -> number of stored memories (expired but unreclaimed ones included)
    memories: dict[str, int]
    recalls: int
    last_activity: datetime | None

    @property
    def total_memories(self) -> int:
        """Memories in all collections."""
        return sum(self.memories.values())


@dataclass(frozen=True, slots=True)
class UserPage:
    """A page of users in id order; ``next_after`` continues the walk (None: last page)."""

    users: list[UserSummary]
    next_after: str | None


#: Whether each open database has Citus (asked once per database object).
_CITUS: weakref.WeakKeyDictionary[Database, bool] = weakref.WeakKeyDictionary()


async def _distributed(db: Database) -> bool:
    """Whether the database has Citus, so that the directory walks it shard by shard."""
    known = _CITUS.get(db)
    if known is None:
        rows = await read_rows(db, s.CITUS_INSTALLED_AS_ROW, {})
        known = _CITUS[db] = bool(rows[0]["installed"])
    return known


async def list_users(db: Database, *, after: str = "", limit: int | None = None) -> UserPage:
    """Users found in any table (memories, audits, chat history, facts), in id order.

    Every table is walked with a skip scan (one index probe per distinct user; on Citus, each
    shard's distinct users, see USER_PAGE_DISTRIBUTED), so a page costs
    about ``limit`` probes per table however many rows each user has.

    Args:
        db: the store's database.
        after: list the users whose id sorts after this one ('' = from the start).
        limit: users per page (clamped to 1..MAX_PAGE).

    Returns:
        The page, each user with memory counts per collection, recall count and last activity.
    """
    limit = clamp_limit(limit)
    if after:  # '' starts from the beginning; anything else is a user id, checked like one
        check_user(after)
    page = s.USER_PAGE_DISTRIBUTED if await _distributed(db) else s.USER_PAGE
    ids = [r["user_id"] for r in await read_rows(db, page, {"after": after, "limit": limit + 1})]
    more = len(ids) > limit
    ids = ids[:limit]
    if not ids:
        return UserPage([], None)
    counts = await read_rows(db, s.USER_MEMORY_COUNTS, {"user_ids": ids})
    activity = {r["user_id"]: r for r in await read_rows(db, s.USER_ACTIVITY, {"user_ids": ids})}
    memories: dict[str, dict[str, int]] = {i: {} for i in ids}
    last: dict[str, list[datetime]] = {i: [] for i in ids}
    for row in counts:
        memories[row["user_id"]][row["collection"]] = int(row["memories"])
        last[row["user_id"]].append(row["last_at"])
    users = []
    for user_id in ids:
        act = activity.get(user_id, {})
        times = last[user_id] + [
            act.get(k) for k in ("last_recall_at", "last_message_at", "last_fact_at")
        ]
        present: list[datetime] = [t for t in times if t is not None]
        users.append(
            UserSummary(
                user_id=user_id,
                memories=memories[user_id],
                recalls=int(act.get("recalls") or 0),
                last_activity=max(present) if present else None,
            )
        )
    return UserPage(users, ids[-1] if more else None)


@dataclass(frozen=True, slots=True)
class ScopeSummary:
    """A scope a user's memories live in (``''`` = dimension not set), with its row count."""

    collection: str
    application_id: str
    agent_id: str
    session_id: str
    memories: int
    first_at: datetime
    last_at: datetime

    def memory_scope(self, user_id: str) -> MemoryScope:
        """This scope as a :class:`MemoryScope` of ``user_id`` (for search, count or erasure).

        Args:
            user_id: the user the scope belongs to.

        Returns:
            The scope with every set dimension.
        """
        return MemoryScope(
            user_id=user_id,
            application_id=self.application_id or None,
            agent_id=self.agent_id or None,
            session_id=self.session_id or None,
        )


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A chat session of a user, with its message count and time span."""

    session_id: str
    messages: int
    first_at: datetime
    last_at: datetime


async def user_known(db: Database, user_id: str) -> bool:
    """Whether any table holds a row of ``user_id`` (memories, audits, history, facts)."""
    rows = await read_rows(db, s.USER_KNOWN, {"user_id": check_user(user_id)})
    return bool(next(iter(rows[0].values())))


async def user_scopes(
    db: Database, user_id: str, *, limit: int | None = None
) -> list[ScopeSummary]:
    """The scopes a user's memories live in, most recently written first.

    Args:
        db: the store's database.
        user_id: the user.
        limit: most scopes returned (clamped to 1..MAX_PAGE).

    Returns:
        One entry per (collection, application, agent, session).
    """
    rows = await read_rows(
        db, s.USER_MEMORY_SCOPES, {"user_id": check_user(user_id), "limit": clamp_limit(limit)}
    )
    return [ScopeSummary(**row) for row in rows]


async def user_sessions(
    db: Database, user_id: str, *, limit: int | None = None
) -> list[SessionSummary]:
    """A user's chat sessions (chat history), most recently active first.

    Args:
        db: the store's database.
        user_id: the user.
        limit: most sessions returned (clamped to 1..MAX_PAGE).

    Returns:
        One entry per session.
    """
    rows = await read_rows(
        db, s.USER_SESSIONS, {"user_id": check_user(user_id), "limit": clamp_limit(limit)}
    )
    return [SessionSummary(**row) for row in rows]
