"""A user's facts as they are now, and their history (the fact audit)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgmemory.admin import statements as s
from pgmemory.admin.pages import Cursor, Page, check_user, clamp_limit, keyset_page, read_rows
from pgmemory.store._engine.database import Database

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


async def user_facts(db: Database, user_id: str, *, limit: int | None = None) -> list[FactSet]:
    """A user's current facts, one entry per namespace and scope.

    Args:
        db: the store's database.
        user_id: the user.
        limit: most entries returned (clamped to 1..MAX_PAGE).

    Returns:
        The fact sets, by namespace.
    """
    rows = await read_rows(
        db, s.USER_FACTS, {"user_id": check_user(user_id), "limit": clamp_limit(limit)}
    )
    return [FactSet(**r) for r in rows]


async def user_fact_history(
    db: Database,
    user_id: str,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
    limit: int | None = None,
) -> Page[FactChange]:
    """A page of a user's fact changes (the fact audit), newest first.

    Args:
        db: the store's database.
        user_id: the user.
        before: continue with older changes (a page's ``older`` cursor).
        after: go back to newer changes (a page's ``newer`` cursor).
        limit: changes per page (clamped to 1..MAX_PAGE).

    Returns:
        The page.
    """
    return await keyset_page(
        db,
        (s.USER_FACT_AUDIT_OLDER, s.USER_FACT_AUDIT_NEWER),
        {"user_id": check_user(user_id)},
        before=before,
        after=after,
        limit=clamp_limit(limit),
        uuid_ids=False,
        make=lambda r: FactChange(**r),
        edge=lambda c: Cursor(c.at, c.id),
    )
