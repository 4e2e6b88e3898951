"""Pages of operator reads: page sizes, keyset cursors, and the one way they read.

Every list an operator sees is a page: at most ``limit`` rows (clamped to :data:`MAX_PAGE`),
walked with an opaque :class:`Cursor` (the time and id of the row a page ends on), so a user
with a hundred thousand memories costs one index range per page, never a full read. Every
read goes through :meth:`Database.read <pgmemory.store._engine.database.Database.read>` (replica
routing, read-your-writes), confined to the user its parameters name.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pgmemory.errors import InvalidInputError
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.reads import DISTANT_FUTURE
from pgmemory.store.validation import check_name

#: Rows a page shows unless asked otherwise.
DEFAULT_PAGE = 50
#: Most rows one page may hold, whatever the caller asks.
MAX_PAGE = 200
#: The highest id a keyset walk of memories starts below.
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


def make_page(
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


def keyset(
    before: Cursor | None, after: Cursor | None, *, uuid_ids: bool
) -> tuple[Direction, dict[str, Any]]:
    if before is not None and after is not None:
        raise InvalidInputError("pass at most one of before= and after=")
    if after is not None:
        return "newer", {"after_at": after.at, "after_id": after.id}
    if before is not None:
        return "older", {"before_at": before.at, "before_id": before.id}
    top = _MAX_UUID if uuid_ids else 2**63 - 1
    return "older", {"before_at": DISTANT_FUTURE, "before_id": top}


async def keyset_page(
    db: Database,
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
    direction, keys = keyset(before, after, uuid_ids=uuid_ids)
    statement = statements[0] if direction == "older" else statements[1]
    rows = await read_rows(db, statement, {**params, **keys, "limit": limit + 1})
    return make_page(
        [make(r) for r in rows],
        limit=limit,
        direction=direction,
        cursor_given=before is not None or after is not None,
        edge=edge,
    )


async def read_rows(
    db: Database, statement: str, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Run one read-only statement and return its rows as dicts, on a connection for the user
    ``params`` names (``user_id``; none: a read across users)."""
    user = params.get("user_id")
    async with db.read(user if isinstance(user, str) else None) as conn:
        result = await conn.execute(clause(statement), dict(params))
        return [dict(row) for row in result.mappings().all()]


def check_user(user_id: str) -> str:
    """``user_id``, checked (a pgmemory error naming it when unusable)."""
    return check_name(user_id, what="user_id")
