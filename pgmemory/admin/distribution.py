"""Distribution over Citus: ``pgmemory db distribute``, all or nothing.

On a Citus coordinator, :func:`distribute` makes the collections catalogue a reference table
and every per-user table distributed by ``user_id``, co-located, in one transaction. Which
tables those are, and how the data plane's statements spread over the shards, is the store's
(:mod:`pgmemory.store.routing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError

from pgmemory.admin import statements as s
from pgmemory.errors import DatabaseNotReadyError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.routing import (
    DISTRIBUTION_COLUMN,
    PER_USER_TABLES,
    REFERENCE_TABLES,
    SEPARATELY_COLOCATED,
)


@dataclass
class Distribution:
    """What :func:`distribute` found and did."""

    #: Tables made distributed now (already distributed ones are not repeated).
    distributed: list[str] = field(default_factory=list)
    #: Tables made reference tables now.
    reference: list[str] = field(default_factory=list)
    #: Tables that already were distributed or reference tables.
    unchanged: list[str] = field(default_factory=list)


def _wrong_layout(found: dict[str, tuple[str, str]]) -> list[str]:
    """The tables Citus already manages in a way :func:`distribute` would not make them."""
    wrong = [
        f"{table} is a {kind} table"
        for table, (kind, _column) in found.items()
        if table in REFERENCE_TABLES and kind not in ("reference", "local")
    ]
    for table, (kind, column) in found.items():
        if table not in PER_USER_TABLES:
            continue
        if kind == "distributed" and column != DISTRIBUTION_COLUMN:
            wrong.append(f"{table} is distributed by {column}, not {DISTRIBUTION_COLUMN}")
        elif kind not in ("distributed", "local"):
            wrong.append(f"{table} is a {kind} table")
    return wrong


def _citus_failure(exc: DBAPIError, step: str) -> DatabaseNotReadyError:
    """Citus's refusal of ``step``, with its DETAIL and HINT, as a pgmemory error."""
    diag = getattr(exc.orig, "diag", None)
    primary = getattr(diag, "message_primary", None) or str(exc.orig).splitlines()[0]
    parts = [f"pgmemory db distribute failed at {step}: {primary}"]
    for label, attribute in (("DETAIL", "message_detail"), ("HINT", "message_hint")):
        value = getattr(diag, attribute, None)
        if value:
            parts.append(f"{label}: {value}")
    parts.append("nothing was changed (the whole distribution was rolled back)")
    return DatabaseNotReadyError(". ".join(part.rstrip(".") for part in parts))


async def distribute(db: Database) -> Distribution:
    """Make the catalogue a reference table and the per-user tables distributed by user.

    Runs ``create_reference_table`` for :data:`REFERENCE_TABLES`, then
    ``create_distributed_table(table, 'user_id', colocate_with => ...)`` for
    :data:`PER_USER_TABLES` (each co-located with the first), all in **one transaction**:
    either every table ends up managed by Citus or, on any failure, none is changed. Run it
    on the coordinator, after ``pgmemory db upgrade``; running it again is harmless (tables
    already distributed by ``user_id``, or already a reference table, are left as they are).

    Three things Citus does on the way are handled here:

    - Making the catalogue a reference table turns every table with a foreign key to it
      (``pgmemory_memories``) into a Citus *local* table (a coordinator-only table in Citus's
      metadata). A ``local`` per-user table is not done: it is distributed like the others.
    - Citus refuses to distribute a table that has triggers (the audit tables' guard triggers
      of migration 0006, which refuse UPDATE, DELETE and TRUNCATE of audit rows) unless
      ``citus.enable_unsafe_triggers`` is on. It is set for this transaction only
      (``SET LOCAL``), so Citus creates each trigger on every shard, where it keeps guarding
      the rows it holds. A later migration that creates a trigger on a distributed table needs
      the same setting.
    - Distributing a table that holds rows copies them to the shards and leaves the originals
      on the coordinator's disk, where no query sees them and no erasure reaches them. They
      are dropped (``truncate_local_data_after_distributing_table``) in the same transaction,
      the audit tables' with the owner's sanctioned bypass of their guard.

    Args:
        db: The coordinator's database (a connection from its pool).

    Returns:
        What was done.

    Raises:
        DatabaseNotReadyError: The ``citus`` extension is not installed in the database, a
            table is already managed by Citus in another way (e.g. distributed by another
            column), or Citus refused a step: the message names the step and carries
            Citus's DETAIL and HINT. In every case nothing is changed.
    """
    async with db.ddl() as conn:
        database = (await conn.execute(clause(s.CURRENT_DATABASE))).scalar_one()
        if not (await conn.execute(clause(q.CITUS_INSTALLED))).scalar():
            raise DatabaseNotReadyError(
                f"the citus extension is not installed in database {database!r}, so "
                "pgmemory's tables cannot be distributed; nothing was changed. Install "
                "Citus on every node, run CREATE EXTENSION citus on the coordinator and "
                "add the workers (citus_add_node), then run `pgmemory db distribute` again"
            )
    done = Distribution()
    step = "the check of how Citus manages the tables"
    try:
        async with db.write() as conn:
            # A table of a later migration than the database's (distributed at an older
            # revision) is left to that migration, which distributes it like the memories.
            tables = list(
                (
                    await conn.execute(
                        clause(s.EXISTING_TABLES), {"tables": [*REFERENCE_TABLES, *PER_USER_TABLES]}
                    )
                ).scalars()
            )
            found: dict[str, tuple[str, str]] = {
                name: (kind, column)
                for name, kind, column in await conn.execute(
                    clause(s.CITUS_TABLES), {"tables": tables}
                )
            }
            wrong = _wrong_layout(found)
            if wrong:
                raise DatabaseNotReadyError(
                    f"database {database!r} is already sharded in a way pgmemory does not "
                    "use: " + "; ".join(wrong) + "; nothing was changed. Undo it "
                    "(undistribute_table) and run `pgmemory db distribute` again"
                )
            for setting in s.DISTRIBUTE_SETTINGS:
                await conn.execute(clause(setting))
            for table in (t for t in REFERENCE_TABLES if t in tables):
                if found.get(table, ("", ""))[0] == "reference":
                    done.unchanged.append(table)
                    continue
                step = f"create_reference_table({table})"
                await conn.execute(clause(s.CITUS_REFERENCE_TABLE), {"table": table})
                done.reference.append(table)
            first = PER_USER_TABLES[0]
            for table in (t for t in PER_USER_TABLES if t in tables):
                if found.get(table, ("", ""))[0] == "distributed":
                    done.unchanged.append(table)
                    continue
                step = f"create_distributed_table({table}, {DISTRIBUTION_COLUMN!r})"
                await conn.execute(
                    clause(s.CITUS_DISTRIBUTE_TABLE),
                    {
                        "table": table,
                        "column": DISTRIBUTION_COLUMN,
                        "colocate_with": "none"
                        if table in SEPARATELY_COLOCATED
                        else "default"
                        if table == first
                        else first,
                    },
                )
                done.distributed.append(table)
            # The copied rows' originals on the coordinator go (they would outlive erasure).
            await conn.execute(clause(s.SANCTION_AUDIT_CHANGE))
            for table in done.distributed:
                step = f"truncate_local_data_after_distributing_table({table})"
                await conn.execute(clause(s.CITUS_DROP_LOCAL_ROWS), {"table": table})
            step = "the commit"
    except DBAPIError as exc:
        raise _citus_failure(exc, step) from exc
    return done
