"""Opt-in hash partitioning of the memories table by user (``pgmemory db partition``).

On one server with heavy users, a memories table hash-partitioned by ``user_id`` imports and
answers large scopes faster (a user's rows sit in one smaller partition with smaller indexes),
at the cost of a slower ``VACUUM ANALYZE`` and small or mid-sized scopes equal or slightly
slower: see docs/scaling.md for the measured figures. It is therefore a choice
the operator makes once, on an EMPTY table, right after ``pgmemory db upgrade``:
:func:`partition_memories` replaces the table by one partitioned into N hash partitions of
``user_id``, keeping every column, default, check, storage setting, key, foreign key and index.

The count reaches the DDL only as a validated int, through a transaction-local setting that
the DDL reads (DDL takes no bind parameters); the whole change runs in one transaction under
the migration advisory lock (:data:`pgmemory.store.migrate.MIGRATION_LOCK_KEY`), so it
either happens completely or not at all, and never beside a migration.

The approximate path (``enable_ann``) builds its index with ``CREATE INDEX CONCURRENTLY``,
which PostgreSQL refuses on a partitioned table: on a partitioned memories table it is refused
with an error saying so (every search stays exact, over the user's one partition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pgmemory.errors import DatabaseNotReadyError, InvalidInputError

if TYPE_CHECKING:
    from pgmemory.store._engine.database import Database

# The database modules are imported where they are used, so that the command line's
# parser (which shows MIN_PARTITIONS and MAX_PARTITIONS) loads no driver.

#: The fewest and the most hash partitions :func:`partition_memories` makes.
MIN_PARTITIONS = 2
MAX_PARTITIONS = 256
#: The table this module partitions.
MEMORIES_TABLE = "pgmemory_memories"


@dataclass(frozen=True)
class PartitionReport:
    """What :func:`partition_memories` did."""

    #: The table now partitioned.
    table: str
    #: Its number of hash partitions (named ``pgmemory_memories_p0`` ...).
    partitions: int
    #: The partition key.
    key: str = "user_id"

    def as_dict(self) -> dict[str, str | int]:
        """The report for ``--json``."""
        return {"table": self.table, "partitions": self.partitions, "key": self.key}


def check_partitions(partitions: object) -> int:
    """``partitions`` as a validated partition count.

    Raises:
        InvalidInputError: Not an int from MIN_PARTITIONS to MAX_PARTITIONS.
    """
    if (
        isinstance(partitions, bool)
        or not isinstance(partitions, int)
        or not MIN_PARTITIONS <= partitions <= MAX_PARTITIONS
    ):
        raise InvalidInputError(
            f"partitions must be an int from {MIN_PARTITIONS} to {MAX_PARTITIONS}, got "
            f"{partitions!r}: pass e.g. partitions=16 (--partitions 16)"
        )
    return partitions


async def partition_memories(db: Database, partitions: int = 16) -> PartitionReport:
    """Replace the EMPTY memories table by one hash-partitioned by ``user_id``.

    Args:
        db: The database (migrated to head).
        partitions: The number of hash partitions, from 2 to 256.

    Returns:
        What was done.

    Raises:
        InvalidInputError: A bad count; nothing was changed.
        DatabaseNotReadyError: The table is missing (run the migrations first), already
            partitioned, or holds rows, or the database has Citus (there the tables are
            distributed instead); nothing was changed.
    """
    from pgmemory.admin import statements as s
    from pgmemory.store import queries as q
    from pgmemory.store._engine.clauses import clause
    from pgmemory.store.migrate import MIGRATION_LOCK_KEY

    count = check_partitions(partitions)
    async with db.write() as conn:
        if (await conn.execute(clause(q.CITUS_INSTALLED))).scalar():
            raise DatabaseNotReadyError(
                "this database has the citus extension: on Citus pgmemory's tables are "
                "distributed by user_id (`pgmemory db distribute`), which splits a heavy user's "
                "rows by shard instead; partitioning is for one server. Nothing was changed"
            )
        await conn.execute(clause(q.MIGRATION_XACT_LOCK), {"key": MIGRATION_LOCK_KEY})
        kind = (await conn.execute(clause(q.MEMORIES_RELKIND))).scalar()
        if kind is None:
            raise DatabaseNotReadyError(
                f"there is no {MEMORIES_TABLE} table to partition: run `pgmemory db upgrade` "
                "first; nothing was changed"
            )
        if kind == "p":
            made = (await conn.execute(clause(s.MEMORIES_PARTITIONS))).scalar_one()
            raise DatabaseNotReadyError(
                f"{MEMORIES_TABLE} is already partitioned ({made} partitions); nothing was "
                "changed. To repartition, start from an empty database"
            )
        if (await conn.execute(clause(s.MEMORIES_ANY_ROW))).scalar_one():
            raise DatabaseNotReadyError(
                f"{MEMORIES_TABLE} holds memories, and only an empty table is partitioned in "
                "place; nothing was changed. Partition a new database right after `pgmemory db "
                "upgrade`, then import the memories into it (export/import)"
            )
        await conn.execute(clause(s.SET_PARTITION_COUNT), {"partitions": count})
        await conn.execute(clause(s.PARTITION_MEMORIES))
        made = (await conn.execute(clause(s.MEMORIES_PARTITIONS))).scalar_one()
    assert made == count, (made, count)
    return PartitionReport(table=MEMORIES_TABLE, partitions=count)
