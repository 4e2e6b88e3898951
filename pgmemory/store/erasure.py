"""Deleting memories: by id, by scope, once expired, and everything about a user.

Every memory deleted gets its audit row (by content hash, never the text) in the statement
that deletes it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import DBAPIError

import pgmemory.telemetry as telemetry
from pgmemory.errors import InvalidInputError, PgMemoryError, ScopeError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.catalogue import Catalogue
from pgmemory.store.records import MemoryScope, check_search_scope
from pgmemory.store.validation import check_aware, check_name, check_optional_name, describe

logger = logging.getLogger(__name__)


async def delete(
    db: Database,
    catalogue: Catalogue,
    collection: str,
    *,
    ids: Sequence[uuid.UUID | str] | None,
    scope: MemoryScope | None,
    actor: str | None,
    allow_unscoped: bool,
) -> int:
    """Delete a collection's memories by id within a scope, or every memory of a scope; returns
    the count.

    Ids are unique per user, not across users (a restored memory keeps its id, and the key
    holds ``user_id`` for sharding), so a delete by ids is always confined to a scope: the
    caller's, exactly as for a search. Whatever ids another tenant's rows share, they are never
    deleted.

    Raises:
        InvalidInputError: An id is not a UUID.
        ScopeError: No scope, or an empty one without ``allow_unscoped``.
    """
    with telemetry.operation(
        telemetry.DELETE_MEMORY, settings=db.settings, collection=collection, scope=scope
    ) as op:
        await catalogue.get(collection)
        check_optional_name(actor, what="actor")
        if scope is None:
            raise ScopeError(
                "pass scope= (the caller's MemoryScope): ids= alone would delete the rows of every "
                "user holding those ids; delete(collection, ids=[...], scope=MemoryScope(user_id=...))"
                if ids is not None
                else "pass ids= with scope=, or scope= alone to delete every memory of the scope"
            )
        check_search_scope(scope, allow_unscoped=allow_unscoped)
        dimensions = tuple(scope.as_dict())
        params: dict[str, Any] = dict(scope.as_dict())
        if ids is not None:
            params["ids"] = _id_list(ids)
            statement = db.deployment.built(q.delete_ids, dimensions)
        else:
            statement = q.delete_scope(dimensions)
        async with db.write() as conn:
            result = await conn.execute(
                clause(statement), {**params, "collection": collection, "actor": actor or ""}
            )
            count = len(result.all())
        logger.info("deleted %d memories from collection %s", count, collection)
        op.count("record.count", count)
        return count


def _audit_refusal(exc: DBAPIError) -> str | None:
    """The audit function's own refusal (``pgmemory: ...``, no user data in it), if that is
    what ``exc`` is: a write of the user committed while the erasure ran, the records user, a
    pseudonym."""
    message = getattr(getattr(exc.orig, "diag", None), "message_primary", None) or ""
    return message.removeprefix("pgmemory: ") if message.startswith("pgmemory: ") else None


def _id_list(ids: object) -> list[uuid.UUID]:
    """``ids`` as UUIDs, or an error naming the first that is not one."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise InvalidInputError(f"ids must be a list of UUIDs, got {describe(ids)}")
    id_list: list[uuid.UUID] = []
    for i, value in enumerate(ids):
        try:
            id_list.append(value if isinstance(value, uuid.UUID) else uuid.UUID(str(value)))
        except ValueError as exc:
            raise InvalidInputError(
                f"ids[{i}] is not a UUID ({describe(value)}); pass the ids add() returned"
            ) from exc
    return id_list


async def expire(
    db: Database,
    catalogue: Catalogue,
    collection: str | None,
    *,
    now: datetime | None,
    actor: str | None,
) -> int:
    """Delete memories whose ``expires_at`` has passed (of one collection, or all); returns
    the count."""
    if collection is not None:
        await catalogue.get(collection)
    check_optional_name(actor, what="actor")
    async with db.write() as conn:
        result = await conn.execute(
            clause(q.DELETE_EXPIRED),
            {
                "collection": collection,
                "now": check_aware(now, what="now") or datetime.now(UTC),
                "actor": actor or "",
            },
        )
        return len(result.all())


async def erase_user(db: Database, user_id: str, *, actor: str | None) -> dict[str, int]:
    """Erase everything stored about a user in ONE transaction; returns counts per kind.

    One call of ``pgmemory_erase_user`` (the owner's, SECURITY DEFINER) does it all: memories
    (each deletion audited), facts, chat history and pending derivation jobs are deleted; then every audit row of the
    user moves to a pseudonym (``erased:`` + a hash keyed with the user's secret: a copy under
    it with the same id and time, and the original deleted, because on Citus ``user_id`` is
    the distribution column and cannot be updated), the fact values and query texts the audits
    kept are blanked, the secret is deleted (so neither the pseudonym nor any content hash can
    be linked to the user or confirmed by a guess again) and the erasure is recorded.

    The interactive statement timeout does not apply (as for a bulk import): an erasure must not
    fail for the size of the user. If it fails otherwise, nothing of it is kept.
    """
    with telemetry.operation(
        telemetry.DELETE_MEMORY, settings=db.settings, user_id=user_id, kind="user"
    ) as op:
        check_name(user_id, what="user_id")
        check_optional_name(actor, what="actor")
        params = {"user_id": user_id, "actor": actor or ""}
        try:
            async with db.write() as conn:
                await conn.execute(clause(q.NO_STATEMENT_TIMEOUT))
                await conn.execute(clause(q.LOCK_USER_FOR_ERASURE), params)
                summary = (await conn.execute(clause(q.ERASE_USER), params)).scalar_one()
        except DBAPIError as exc:
            refusal = _audit_refusal(exc)
            if refusal is None:
                raise
            raise PgMemoryError(
                f"the erasure was refused and rolled back, nothing was erased: {refusal}"
            ) from None
        audit, erased = summary["pseudonymised"], summary["erased"]
        counts = {
            "memories": int(erased["memories"]),
            "facts": int(erased["facts"]),
            "history_messages": int(erased["history_messages"]),
            "derivation_jobs": int(erased["jobs"]),
            "memory_audit_rows_pseudonymised": int(audit["memory_audit"]),
            "recall_audit_rows_pseudonymised": int(audit["recall_audit"]),
            "fact_audit_rows_pseudonymised": int(audit["fact_audit"]),
        }
        logger.info("erased a user: %s", counts)
        for name, value in counts.items():
            op.count(f"erased.{name}", value)
        telemetry.ERASURES.add(1)
        return counts
