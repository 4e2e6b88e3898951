"""Read what pgmemory keeps about a user, page by page, and prune old audit rows.

These functions back the operators' audit page (:mod:`pgmemory.ui`) and are meant for command
line tools too. Each takes the open :class:`~pgmemory.store.store.MemoryStore` or its
:class:`~sqlalchemy.ext.asyncio.AsyncEngine`, runs statements from
:mod:`pgmemory.store.queries`, and returns small frozen dataclasses.

Lists are pages: at most ``limit`` rows (clamped to :data:`MAX_PAGE`), walked with an opaque
:class:`Cursor` (the time and id of the row a page ends on), so a user with a hundred thousand
memories costs one index range per page, never a full read. Nothing here writes, except
:func:`prune_audit`. Logs carry counts only, never user ids or texts.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store.records import HistoryRow, Memory, MemoryScope
from pgmemory.store.validation import check_name, check_optional_name

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore

logger = logging.getLogger(__name__)

#: Rows a page shows unless asked otherwise.
DEFAULT_PAGE = 50
#: Most rows one page may hold, whatever the caller asks.
MAX_PAGE = 200
#: Returned memories shown per recall in a list of recalls (the recall's own page shows more).
RECALL_PREVIEW = 10
#: Returned memories shown on one recall's page.
RECALL_DETAIL_MAX = 500
#: Open time bounds of a keyset walk (earliest and latest instants both sides represent).
_DISTANT_PAST = datetime(1, 1, 2, tzinfo=UTC)
_DISTANT_FUTURE = datetime(9999, 12, 30, tzinfo=UTC)
_NO_UUID = uuid.UUID(int=0)
_MAX_UUID = uuid.UUID(int=(1 << 128) - 1)

T = TypeVar("T")
Direction = Literal["older", "newer"]


def clamp_limit(limit: int | None) -> int:
    """A page size within 1..MAX_PAGE (``None`` or garbage gives DEFAULT_PAGE).

    Args:
        limit: what the caller asked for.

    Returns:
        The page size to use.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        return DEFAULT_PAGE
    return min(limit, MAX_PAGE)


# --- cursors and pages -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ends: the time and id of its edge row, for the next keyset step."""

    at: datetime
    id: int | uuid.UUID

    def encode(self) -> str:
        """A URL-safe token of this cursor (``<iso time>~<id>``).

        Returns:
            The token, for :meth:`decode`.
        """
        return f"{self.at.isoformat()}~{self.id}"

    @classmethod
    def decode(cls, token: str, *, id_type: type = int) -> Cursor:
        """Parse a token made by :meth:`encode`.

        Args:
            token: the token.
            id_type: ``int`` for audit rows, ``uuid.UUID`` for memories.

        Returns:
            The cursor.

        Raises:
            InvalidInputError: the token is malformed.
        """
        try:
            when, _, ident = token.partition("~")
            at = datetime.fromisoformat(when)
            if at.tzinfo is None:
                raise ValueError("naive time")
            return cls(at, id_type(ident))
        except (ValueError, TypeError) as exc:
            raise InvalidInputError(f"malformed page cursor {token[:80]!r}") from exc


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of rows, newest first, and the cursors to its neighbours (None: no such page)."""

    items: list[T]
    #: Cursor of the page of older rows (pass as ``before=``).
    older: Cursor | None
    #: Cursor of the page of newer rows (pass as ``after=``).
    newer: Cursor | None


def _page(
    rows: list[T],
    *,
    limit: int,
    direction: Direction,
    cursor_given: bool,
    edge: Any,
) -> Page[T]:
    """Cut ``limit + 1`` fetched rows to a newest-first page and work out its neighbours."""
    more = len(rows) > limit
    rows = rows[:limit]
    if direction == "newer":
        rows.reverse()
    if not rows:
        return Page([], None, None)
    has_older = more if direction == "older" else True
    has_newer = cursor_given if direction == "older" else more
    return Page(
        rows,
        older=edge(rows[-1]) if has_older else None,
        newer=edge(rows[0]) if has_newer else None,
    )


def _keyset(
    before: Cursor | None, after: Cursor | None, *, uuid_ids: bool
) -> tuple[Direction, dict[str, Any]]:
    if before is not None and after is not None:
        raise InvalidInputError("pass at most one of before= and after=")
    if after is not None:
        return "newer", {"after_at": after.at, "after_id": after.id}
    if before is not None:
        return "older", {"before_at": before.at, "before_id": before.id}
    top = _MAX_UUID if uuid_ids else 2**63 - 1
    return "older", {"before_at": _DISTANT_FUTURE, "before_id": top}


async def _keyset_page(
    source: AsyncEngine | MemoryStore,
    statements: tuple[str, str],
    params: Mapping[str, Any],
    *,
    before: Cursor | None,
    after: Cursor | None,
    limit: int,
    uuid_ids: bool,
    make: Callable[[Mapping[str, Any]], T],
    edge: Callable[[T], Cursor],
) -> Page[T]:
    """One newest-first keyset page: ``statements`` reads (older, newer) rows; ``limit`` is
    already clamped; ``make`` builds an item from a row, ``edge`` its cursor."""
    direction, keys = _keyset(before, after, uuid_ids=uuid_ids)
    statement = statements[0] if direction == "older" else statements[1]
    rows = await _rows(source, statement, {**params, **keys, "limit": limit + 1})
    return _page(
        [make(r) for r in rows],
        limit=limit,
        direction=direction,
        cursor_given=before is not None or after is not None,
        edge=edge,
    )


def _engine(source: AsyncEngine | MemoryStore) -> AsyncEngine:
    if isinstance(source, AsyncEngine):
        return source
    engine = getattr(source, "engine", None)
    if not isinstance(engine, AsyncEngine):
        raise InvalidInputError(
            f"expected an AsyncEngine or an open MemoryStore, got {type(source).__name__}"
        )
    return engine


async def _rows(
    source: AsyncEngine | MemoryStore, statement: str, params: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    """Run one read-only statement in autocommit and return its rows as mappings."""
    async with _engine(source).connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        result = await conn.execute(text(statement), dict(params))
        return [dict(row) for row in result.mappings().all()]


def _user(user_id: str) -> str:
    return check_name(user_id, what="user_id")


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


async def list_users(
    source: AsyncEngine | MemoryStore, *, after: str = "", limit: int | None = None
) -> UserPage:
    """Users found in any table (memories, audits, chat history, facts), in id order.

    Every table is walked with a skip scan (one index probe per distinct user), so a page costs
    about ``limit`` probes per table however many rows each user has.

    Args:
        source: the open store or its engine.
        after: list the users whose id sorts after this one ('' = from the start).
        limit: users per page (clamped to 1..MAX_PAGE).

    Returns:
        The page, each user with memory counts per collection, recall count and last activity.
    """
    limit = clamp_limit(limit)
    ids = [
        r["user_id"] for r in await _rows(source, q.USER_PAGE, {"after": after, "limit": limit + 1})
    ]
    more = len(ids) > limit
    ids = ids[:limit]
    if not ids:
        return UserPage([], None)
    counts = await _rows(source, q.USER_MEMORY_COUNTS, {"user_ids": ids})
    activity = {r["user_id"]: r for r in await _rows(source, q.USER_ACTIVITY, {"user_ids": ids})}
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


async def user_scopes(
    source: AsyncEngine | MemoryStore, user_id: str, *, limit: int | None = None
) -> list[ScopeSummary]:
    """The scopes a user's memories live in, most recently written first.

    Args:
        source: the open store or its engine.
        user_id: the user.
        limit: most scopes returned (clamped to 1..MAX_PAGE).

    Returns:
        One entry per (collection, application, agent, session).
    """
    rows = await _rows(
        source, q.USER_MEMORY_SCOPES, {"user_id": _user(user_id), "limit": clamp_limit(limit)}
    )
    return [ScopeSummary(**row) for row in rows]


async def user_sessions(
    source: AsyncEngine | MemoryStore, user_id: str, *, limit: int | None = None
) -> list[SessionSummary]:
    """A user's chat sessions (chat history), most recently active first.

    Args:
        source: the open store or its engine.
        user_id: the user.
        limit: most sessions returned (clamped to 1..MAX_PAGE).

    Returns:
        One entry per session.
    """
    rows = await _rows(
        source, q.USER_SESSIONS, {"user_id": _user(user_id), "limit": clamp_limit(limit)}
    )
    return [SessionSummary(**row) for row in rows]


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
    source: AsyncEngine | MemoryStore,
    user_id: str,
    collection: str,
    *,
    session_id: str | None = None,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
) -> Page[Memory]:
    """A page of a user's memories in a collection, newest first.

    Expired memories that :meth:`MemoryStore.expire` has not reclaimed yet are included: they
    are still stored (searches skip them).

    Args:
        source: the open store or its engine.
        user_id: the user.
        collection: the collection.
        session_id: only this session's memories (None: every session).
        before: continue with the memories older than this cursor (a page's ``older``).
        after: go back to the memories newer than this cursor (a page's ``newer``).
        limit: memories per page (clamped to 1..MAX_PAGE).

    Returns:
        The page.
    """
    return await _keyset_page(
        source,
        (q.USER_MEMORIES_OLDER, q.USER_MEMORIES_NEWER),
        {"user_id": _user(user_id), "collection": collection, "session_id": session_id},
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=True,
        make=_memory,
        edge=_memory_edge,
    )


async def get_memory(
    source: AsyncEngine | MemoryStore, user_id: str, memory_id: uuid.UUID
) -> Memory | None:
    """One of a user's memories, or None if it is not stored (never was, or deleted).

    Args:
        source: the open store or its engine.
        user_id: the user.
        memory_id: the memory's id.

    Returns:
        The memory or None.
    """
    rows = await _rows(source, q.USER_MEMORY, {"user_id": _user(user_id), "memory_id": memory_id})
    return _memory(rows[0]) if rows else None


# --- recalls ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecalledMemory:
    """A memory a recall returned, at its rank, as it is stored now.

    ``content`` and the other memory columns are None when the memory has been deleted since;
    ``deleted_at``/``deleted_by`` then tell when and how, if the audit still has it.
    """

    rank: int
    memory_id: uuid.UUID
    score: float
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
    source: AsyncEngine | MemoryStore, user_id: str, recall_ids: Sequence[int], per_recall: int
) -> dict[int, list[RecalledMemory]]:
    found: dict[int, list[RecalledMemory]] = {i: [] for i in recall_ids}
    if not recall_ids:
        return found
    rows = await _rows(
        source,
        q.RECALLED_MEMORIES,
        {"user_id": user_id, "recall_ids": list(recall_ids), "per_recall": per_recall},
    )
    for row in rows:
        found[row["recall_id"]].append(_recalled(row))
    return found


async def user_recalls(
    source: AsyncEngine | MemoryStore,
    user_id: str,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
    preview: int = RECALL_PREVIEW,
) -> Page[Recall]:
    """A page of a user's recalls, newest first, each with the first memories it returned.

    Args:
        source: the open store or its engine.
        user_id: the user.
        before: continue with older recalls (a page's ``older`` cursor).
        after: go back to newer recalls (a page's ``newer`` cursor).
        limit: recalls per page (clamped to 1..MAX_PAGE).
        preview: returned memories joined per recall (``Recall.returned`` counts them all).

    Returns:
        The page.
    """
    user_id = _user(user_id)
    page: Page[dict[str, Any]] = await _keyset_page(
        source,
        (q.USER_RECALLS_OLDER, q.USER_RECALLS_NEWER),
        {"user_id": user_id},
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=False,
        make=dict,
        edge=lambda r: Cursor(r["at"], r["id"]),
    )
    joined = await _recalled_memories(
        source, user_id, [r["id"] for r in page.items], max(0, min(preview, RECALL_DETAIL_MAX))
    )
    return Page(
        [_recall(r, joined[r["id"]]) for r in page.items], older=page.older, newer=page.newer
    )


async def get_recall(
    source: AsyncEngine | MemoryStore,
    user_id: str,
    recall_id: int,
    *,
    limit: int = RECALL_DETAIL_MAX,
) -> Recall | None:
    """One recall of a user with the memories it returned, in rank order, joined to the
    memories as they are stored now (deleted ones marked as such).

    Args:
        source: the open store or its engine.
        user_id: the user.
        recall_id: the recall-audit row's id.
        limit: most returned memories joined (``Recall.returned`` counts them all).

    Returns:
        The recall, or None if this user has no such recall.
    """
    user_id = _user(user_id)
    rows = await _rows(source, q.USER_RECALL, {"user_id": user_id, "recall_id": recall_id})
    if not rows:
        return None
    joined = await _recalled_memories(
        source, user_id, [recall_id], max(0, min(limit, RECALL_DETAIL_MAX))
    )
    return _recall(rows[0], joined[recall_id])


@dataclass(frozen=True, slots=True)
class MemoryRecall:
    """A recall that returned a given memory, with the memory's score and rank in it."""

    recall: Recall
    score: float
    rank: int


async def recalls_of_memory(
    source: AsyncEngine | MemoryStore,
    user_id: str,
    memory_id: uuid.UUID,
    *,
    limit: int | None = 20,
) -> list[MemoryRecall]:
    """The latest recalls of a user that returned this memory ("which answers used it").

    Args:
        source: the open store or its engine.
        user_id: the user.
        memory_id: the memory.
        limit: most recalls returned (clamped to 1..MAX_PAGE).

    Returns:
        Newest first.
    """
    rows = await _rows(
        source,
        q.RECALLS_OF_MEMORY,
        {"user_id": _user(user_id), "memory_id": memory_id, "limit": clamp_limit(limit)},
    )
    out = []
    for row in rows:
        data = dict(row)
        score, rank = float(data.pop("score")), int(data.pop("rank"))
        out.append(MemoryRecall(_recall(data), score, rank))
    return out


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
    source: AsyncEngine | MemoryStore,
    user_id: str,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
) -> Page[MemoryAuditEntry]:
    """A page of a user's memory write/delete audit, newest first.

    Args:
        source: the open store or its engine.
        user_id: the user.
        before: continue with older entries (a page's ``older`` cursor).
        after: go back to newer entries (a page's ``newer`` cursor).
        limit: entries per page (clamped to 1..MAX_PAGE).

    Returns:
        The page.
    """
    return await _keyset_page(
        source,
        (q.USER_MEMORY_AUDIT_OLDER, q.USER_MEMORY_AUDIT_NEWER),
        {"user_id": _user(user_id)},
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=False,
        make=lambda r: MemoryAuditEntry(**r),
        edge=lambda e: Cursor(e.at, e.id),
    )


async def memory_audit_trail(
    source: AsyncEngine | MemoryStore, user_id: str, memory_id: uuid.UUID, *, limit: int = 100
) -> list[MemoryAuditEntry]:
    """The audit entries of one memory, oldest first (its insert, then a delete or expiry).

    Args:
        source: the open store or its engine.
        user_id: the user.
        memory_id: the memory.
        limit: most entries returned (clamped to 1..MAX_PAGE).

    Returns:
        The entries.
    """
    rows = await _rows(
        source,
        q.MEMORY_AUDIT_TRAIL,
        {"user_id": _user(user_id), "memory_id": memory_id, "limit": clamp_limit(limit)},
    )
    return [MemoryAuditEntry(**r) for r in rows]


# --- facts -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FactSet:
    """A user's facts in one namespace and scope, as stored now."""

    application_id: str
    agent_id: str
    session_id: str
    namespace: str
    facts: dict[str, Any]
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class FactChange:
    """One fact that was set, changed or removed (values None once a user's erasure redacted them)."""

    id: int
    at: datetime
    application_id: str
    agent_id: str
    session_id: str
    namespace: str
    key: str
    old_value: Any
    new_value: Any
    actor: str


async def user_facts(
    source: AsyncEngine | MemoryStore, user_id: str, *, limit: int | None = None
) -> list[FactSet]:
    """A user's current facts, one entry per namespace and scope.

    Args:
        source: the open store or its engine.
        user_id: the user.
        limit: most entries returned (clamped to 1..MAX_PAGE).

    Returns:
        The fact sets, by namespace.
    """
    rows = await _rows(
        source, q.USER_FACTS, {"user_id": _user(user_id), "limit": clamp_limit(limit)}
    )
    return [FactSet(**r) for r in rows]


async def user_fact_history(
    source: AsyncEngine | MemoryStore,
    user_id: str,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
) -> Page[FactChange]:
    """A page of a user's fact changes (the fact audit), newest first.

    Args:
        source: the open store or its engine.
        user_id: the user.
        before: continue with older changes (a page's ``older`` cursor).
        after: go back to newer changes (a page's ``newer`` cursor).
        limit: changes per page (clamped to 1..MAX_PAGE).

    Returns:
        The page.
    """
    return await _keyset_page(
        source,
        (q.USER_FACT_AUDIT_OLDER, q.USER_FACT_AUDIT_NEWER),
        {"user_id": _user(user_id)},
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=False,
        make=lambda r: FactChange(**r),
        edge=lambda c: Cursor(c.at, c.id),
    )


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
    source: AsyncEngine | MemoryStore,
    user_id: str,
    session_id: str,
    *,
    after_seq: int | None = None,
    before_seq: int | None = None,
    limit: int | None = None,
) -> HistoryPage:
    """A page of a chat session's history in order (the store's own history statements).

    Args:
        source: the open store or its engine.
        user_id: the user the session belongs to.
        session_id: the session.
        after_seq: the messages after this seq (default: from the start).
        before_seq: instead, the page of messages just before this seq.
        limit: messages per page (clamped to 1..MAX_PAGE).

    Returns:
        The page and the session's message count.
    """
    user_id = _user(user_id)
    check_name(session_id, what="session_id")
    if after_seq is not None and before_seq is not None:
        raise InvalidInputError("pass at most one of after_seq= and before_seq=")
    limit = clamp_limit(limit)
    params: dict[str, Any] = {"user_id": user_id, "session_id": session_id, "limit": limit + 1}
    if before_seq is not None:
        rows = await _rows(source, q.READ_HISTORY_BEFORE, {**params, "before_seq": before_seq})
        more_before = len(rows) > limit
        page = [HistoryRow(**r) for r in rows[:limit]][::-1]
        more_after = True
    else:
        start = after_seq or 0
        rows = await _rows(source, q.READ_HISTORY, {**params, "after_seq": start})
        more_after = len(rows) > limit
        page = [HistoryRow(**r) for r in rows[:limit]]
        more_before = start > 0
    total = (await _rows(source, q.COUNT_HISTORY, params))[0]["count"]
    return HistoryPage(
        rows=page,
        next_after_seq=page[-1].seq if page and more_after else None,
        prev_before_seq=page[0].seq if page and more_before else None,
        total=int(total),
    )


# --- retention -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PruneRecord:
    """A past :func:`prune_audit`: when, by whom, its cutoff and counts."""

    id: int
    at: datetime
    actor: str
    cutoff: datetime | None
    deleted: dict[str, int]


async def prune_audit(
    source: AsyncEngine | MemoryStore,
    older_than: timedelta | datetime,
    *,
    actor: str | None = None,
    recall_audit: bool = True,
    memory_audit: bool = True,
    fact_audit: bool = True,
    now: datetime | None = None,
) -> dict[str, int]:
    """Delete audit rows older than a cutoff, in ONE transaction, and record that it happened.

    Memories, facts and chat history are untouched: only the recall audit, the memory
    write/delete audit and the fact audit lose rows written before the cutoff. The record
    of the prune (cutoff, counts, actor) is a row of ``pgmemory_fact_audit`` in the reserved
    namespace :data:`~pgmemory.store.queries.RETENTION_NAMESPACE` with an all-blank scope;
    later prunes keep those records. See :func:`list_prunes`.

    Args:
        source: the open store or its engine.
        older_than: an age (rows older than ``now - older_than`` go) or an aware datetime cutoff.
        actor: who asked, stored in the record.
        recall_audit: prune ``pgmemory_recall_audit``.
        memory_audit: prune ``pgmemory_memory_audit``.
        fact_audit: prune ``pgmemory_fact_audit``.
        now: the present, for an age (default: the current time).

    Returns:
        Rows deleted per table: ``{"recall_audit": n, "memory_audit": n, "fact_audit": n}``.

    Raises:
        InvalidInputError: a naive datetime, or a negative age.
    """
    check_optional_name(actor, what="actor")
    if isinstance(older_than, timedelta):
        if older_than < timedelta(0):
            raise InvalidInputError(f"older_than is {older_than}; expected an age >= 0")
        if now is not None and now.tzinfo is None:
            raise InvalidInputError("now has no time zone; pass an aware datetime")
        cutoff = (now or datetime.now(UTC)) - older_than
    elif isinstance(older_than, datetime):
        if older_than.tzinfo is None:
            raise InvalidInputError(
                f"older_than {older_than.isoformat()} has no time zone; pass an aware datetime"
            )
        cutoff = older_than
    else:
        raise InvalidInputError(
            f"older_than must be a timedelta or a datetime, got {type(older_than).__name__}"
        )
    params = {
        "cutoff": cutoff,
        "recall_audit": recall_audit,
        "memory_audit": memory_audit,
        "fact_audit": fact_audit,
        "actor": actor or "",
    }
    async with _engine(source).begin() as conn:
        await conn.execute(text(q.NO_STATEMENT_TIMEOUT))
        summary = (await conn.execute(text(q.PRUNE_AUDIT), params)).scalar_one()
    deleted = summary["deleted"]
    counts = {name: int(deleted[name]) for name in ("recall_audit", "memory_audit", "fact_audit")}
    logger.info("pruned audit rows older than %s: %s", cutoff.isoformat(), counts)
    return counts


async def list_prunes(
    source: AsyncEngine | MemoryStore, *, limit: int | None = 20
) -> list[PruneRecord]:
    """The latest audit prunes, newest first.

    Args:
        source: the open store or its engine.
        limit: most records returned (clamped to 1..MAX_PAGE).

    Returns:
        The records.
    """
    rows = await _rows(
        source,
        q.LIST_PRUNES,
        {"retention_namespace": q.RETENTION_NAMESPACE, "limit": clamp_limit(limit)},
    )
    out = []
    for row in rows:
        summary = (
            row["summary"]
            if isinstance(row["summary"], dict)
            else json.loads(row["summary"] or "{}")
        )
        cutoff = summary.get("cutoff")
        out.append(
            PruneRecord(
                id=row["id"],
                at=row["at"],
                actor=row["actor"],
                cutoff=datetime.fromisoformat(cutoff) if isinstance(cutoff, str) else None,
                deleted={k: int(v) for k, v in (summary.get("deleted") or {}).items()},
            )
        )
    return out


__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "Cursor",
    "FactChange",
    "FactSet",
    "HistoryPage",
    "MemoryAuditEntry",
    "MemoryRecall",
    "Page",
    "PruneRecord",
    "Recall",
    "RecalledMemory",
    "ScopeSummary",
    "SessionSummary",
    "UserPage",
    "UserSummary",
    "clamp_limit",
    "get_memory",
    "get_recall",
    "list_prunes",
    "list_users",
    "memory_audit_trail",
    "prune_audit",
    "recalls_of_memory",
    "session_history",
    "user_fact_history",
    "user_facts",
    "user_memories",
    "user_memory_audit",
    "user_recalls",
    "user_scopes",
    "user_sessions",
]
