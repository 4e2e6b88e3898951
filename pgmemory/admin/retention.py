"""Audit retention: pruning audit rows older than a cutoff, and the record each prune keeps."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pgmemory.telemetry as telemetry
from pgmemory.admin import statements as s
from pgmemory.admin.pages import clamp_limit, read_rows
from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.validation import check_optional_name

logger = logging.getLogger(__name__)


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
    db: Database,
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
    namespace :data:`~pgmemory.admin.statements.RETENTION_NAMESPACE` with an all-blank scope;
    later prunes keep those records. See :func:`list_prunes`.

    Args:
        db: the store's database.
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
    with telemetry.operation(telemetry.DELETE_MEMORY, settings=db.settings, kind="audit") as op:
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
        if cutoff > datetime.now(UTC):
            raise InvalidInputError(
                f"the cutoff {cutoff.isoformat()} is in the future: audit rows are pruned only once "
                "they are older than it; pass an age or a past instant"
            )
        params = {
            "cutoff": cutoff,
            "recall_audit": recall_audit,
            "memory_audit": memory_audit,
            "fact_audit": fact_audit,
            "actor": actor or "",
        }
        async with db.write() as conn:
            await conn.execute(clause(q.NO_STATEMENT_TIMEOUT))
            summary = (await conn.execute(clause(s.PRUNE_AUDIT), params)).scalar_one()
        deleted = summary["deleted"]
        counts = {
            name: int(deleted[name]) for name in ("recall_audit", "memory_audit", "fact_audit")
        }
        logger.info("pruned audit rows older than %s: %s", cutoff.isoformat(), counts)
        for name, value in counts.items():
            op.count(f"pruned.{name}", value)
        return counts


async def list_prunes(db: Database, *, limit: int | None = 20) -> list[PruneRecord]:
    """The latest audit prunes, newest first.

    Args:
        db: the store's database.
        limit: most records returned (clamped to 1..MAX_PAGE).

    Returns:
        The records.
    """
    rows = await read_rows(
        db,
        s.LIST_PRUNES,
        {"retention_namespace": s.RETENTION_NAMESPACE, "limit": clamp_limit(limit)},
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
