"""How pgmemory's data and statements spread over a sharded (Citus) database, by user.

Every per-user table has ``user_id`` in its primary key and in every unique index, so Citus can
distribute them all by ``user_id``, co-located (a user's memories, audit rows, history and
facts share one shard group); the collections catalogue is small and read by every statement,
so it is a reference table (copied to every node). :func:`distribute` does exactly that on a
database where the ``citus`` extension is installed.

Every statement in :mod:`pgmemory.store.queries` that touches a per-user table names one user
(:func:`names_one_user`: a ``user_id = :param`` filter, or one user's value in an INSERT), so
Citus routes it to one shard; the exceptions are listed here, each with why, in
:data:`FAN_OUT` (runs on every shard) and :data:`CONSTANT_USER` (one shard, named by a
constant). ``tests/store/test_routing.py`` reads every statement and fails on one that is in
neither. The lists live here, not on the statements, so that editing a statement and
classifying it stay separate changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from pgmemory.errors import DatabaseNotReadyError
from pgmemory.store import queries as q
from pgmemory.store.database import Database

#: Tables holding one user's rows each; distributed by ``user_id``, co-located with the first.
PER_USER_TABLES = (
    "pgmemory_memories",
    "pgmemory_memory_audit",
    "pgmemory_recall_audit",
    "pgmemory_chat_messages",
    "pgmemory_facts",
    "pgmemory_fact_audit",
    "pgmemory_user_secrets",
)

#: pgmemory's own SQL functions (migration 0006) that read or write per-user tables. The first
#: argument of the first two is the user, so a call with a bound first argument names one user;
#: the prune takes a cutoff and sweeps every user's audit rows.
PER_USER_FUNCTIONS = ("pgmemory_keyed_sha256", "pgmemory_erase_user_audit", "pgmemory_prune_audit")

#: Small tables every statement may join: copied to every node.
REFERENCE_TABLES = ("pgmemory_collections",)

#: The column the per-user tables are distributed by.
DISTRIBUTION_COLUMN = "user_id"

#: Statements (names in :mod:`pgmemory.store.queries`; statement builders by function name,
#: for the scopes without a user) that touch per-user tables without naming one user, so that
#: on Citus they run on every shard (or on several), and why that is acceptable.
FAN_OUT: dict[str, str] = {
    "INSERT_MEMORIES": (
        "one batch may hold several users' rows (INSERT ... SELECT from arrays): each row goes "
        "to its user's shard; a batch of one user's rows touches one shard"
    ),
    "INSERT_FROM_STAGING": "bulk import from the local staging table: rows of any users",
    "INSERT_FROM_STAGING_UNKEYED": "bulk import from the local staging table: rows of any users",
    "DELETE_EXPIRED": "the expiry sweep: every user's expired rows, on every shard",
    "delete_ids": "deleting by id in a scope without a user (session, agent or application)",
    "delete_scope": "erasing a session, agent or application scope (no user): any user's rows",
    "search_memories": "a search of a scope without a user (session, agent or application)",
    "list_memories": "listing a scope without a user (session, agent or application)",
    "count_memories": "counting a scope without a user (session, agent or application)",
    "ANN_INDEX_DDL": "DDL: the approximate index is built on every shard",
    "MEMORIES_RELKIND": "pgmemory db partition, enable_ann: the catalog's kind of the table, no rows",
    "MEMORIES_ANY_ROW": "pgmemory db partition: refused unless the table is empty (any user)",
    "PARTITION_MEMORIES": "DDL: pgmemory db partition rebuilds the whole (empty) table",
    "MEMORIES_PARTITIONS": "pgmemory db partition: the catalog's count of partitions, no rows",
    "ANN_LARGE_USERS": "the approximate-index probe: which users' scopes are large (all users)",
    "ANN_PROBE_SAMPLE": "the approximate-index probe: sample vectors from the large scopes",
    "USER_PAGE": "the operator's user directory: a page of user ids across all tables",
    "USER_MEMORY_COUNTS": "the operator's user directory: counts for one page of users",
    "USER_ACTIVITY": "the operator's user directory: activity for one page of users",
    "PRUNE_AUDIT": "audit retention (pgmemory_prune_audit): rows older than a cutoff, of every user",
    "audit_row_check": "pgmemory audit verify rechecks every row hash of an audit table",
    "audit_guard_probe": "pgmemory audit verify's rolled-back UPDATE of an audit table's newest row",
    "UNRECORDED_PSEUDONYMS": "pgmemory audit verify: erased users' pseudonyms across all audits",
}

#: Statements that touch one shard, that of the ``''`` (no user) rows, naming it by a constant.
CONSTANT_USER: dict[str, str] = {
    "LIST_PRUNES": "the records of audit prunes, kept under user '' (one shard)",
}

_PER_USER = re.compile(r"\b(?:" + "|".join(PER_USER_TABLES + PER_USER_FUNCTIONS) + r")\b")
#: A ``user_id = :param`` filter, with or without a table alias.
_USER_FILTER = re.compile(r"\buser_id\s*=\s*:\w+")
#: One user's value bound in an INSERT.
_USER_VALUE = re.compile(r"\bINSERT\b.*:(?:audit_)?user_id\b", re.DOTALL | re.IGNORECASE)
#: A call of one of the user-first functions with the user bound.
_USER_CALL = re.compile(
    r"\b(?:" + "|".join(PER_USER_FUNCTIONS[:2]) + r")\(\s*:(?:audit_)?user_id\b"
)


def touches_per_user_tables(statement: str) -> bool:
    """Whether ``statement`` reads or writes a per-user table (or calls a function that does)."""
    return bool(_PER_USER.search(statement))


def names_one_user(statement: str) -> bool:
    """Whether ``statement`` is confined to one user's rows, so Citus routes it to one shard:
    it filters on ``user_id = :param``, inserts one user's value (``:user_id``), or calls a
    user-first function of :data:`PER_USER_FUNCTIONS` for one bound user."""
    return bool(
        _USER_FILTER.search(statement)
        or _USER_VALUE.search(statement)
        or _USER_CALL.search(statement)
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


#: Settings of the one transaction :func:`distribute` runs in (``SET LOCAL``: they end with it).
_DISTRIBUTE_SETTINGS = (
    # The audit tables' guard triggers (migration 0006): Citus refuses to distribute a table
    # with triggers unless this is on; with it, each trigger is created on every shard too.
    "SET LOCAL citus.enable_unsafe_triggers = on",
    # Tables with a foreign key to a reference table made in the same transaction must be
    # distributed over one connection per node.
    "SET LOCAL citus.multi_shard_modify_mode = 'sequential'",
)

#: How Citus manages each of some tables now: ``{table: (type, distribution column)}``.
_CITUS_TABLES = """
SELECT CAST(table_name AS text), CAST(citus_table_type AS text), distribution_column
FROM citus_tables WHERE CAST(table_name AS text) = ANY(:tables)
"""


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

    Two things Citus does on the way are handled here:

    - Making the catalogue a reference table turns every table with a foreign key to it
      (``pgmemory_memories``) into a Citus *local* table (a coordinator-only table in Citus's
      metadata). A ``local`` per-user table is not done: it is distributed like the others.
    - Citus refuses to distribute a table that has triggers (the audit tables' guard triggers
      of migration 0006, which refuse UPDATE, DELETE and TRUNCATE of audit rows) unless
      ``citus.enable_unsafe_triggers`` is on. It is set for this transaction only
      (``SET LOCAL``), so Citus creates each trigger on every shard, where it keeps guarding
      the rows it holds. A later migration that creates a trigger on a distributed table needs
      the same setting.

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
    async with db.autocommit() as conn:
        database = (await conn.execute(text(q.CURRENT_DATABASE))).scalar_one()
        if not (await conn.execute(text(q.CITUS_INSTALLED))).scalar():
            raise DatabaseNotReadyError(
                f"the citus extension is not installed in database {database!r}, so "
                "pgmemory's tables cannot be distributed; nothing was changed. Install "
                "Citus on every node, run CREATE EXTENSION citus on the coordinator and "
                "add the workers (citus_add_node), then run `pgmemory db distribute` again"
            )
    tables = list(REFERENCE_TABLES + PER_USER_TABLES)
    done = Distribution()
    step = "the check of how Citus manages the tables"
    try:
        async with db.transaction() as conn:
            found: dict[str, tuple[str, str]] = {
                name: (kind, column)
                for name, kind, column in await conn.execute(
                    text(_CITUS_TABLES), {"tables": tables}
                )
            }
            wrong = _wrong_layout(found)
            if wrong:
                raise DatabaseNotReadyError(
                    f"database {database!r} is already sharded in a way pgmemory does not "
                    "use: " + "; ".join(wrong) + "; nothing was changed. Undo it "
                    "(undistribute_table) and run `pgmemory db distribute` again"
                )
            for setting in _DISTRIBUTE_SETTINGS:
                await conn.execute(text(setting))
            for table in REFERENCE_TABLES:
                if found.get(table, ("", ""))[0] == "reference":
                    done.unchanged.append(table)
                    continue
                step = f"create_reference_table({table})"
                await conn.execute(text(q.CITUS_REFERENCE_TABLE), {"table": table})
                done.reference.append(table)
            first = PER_USER_TABLES[0]
            for table in PER_USER_TABLES:
                if found.get(table, ("", ""))[0] == "distributed":
                    done.unchanged.append(table)
                    continue
                step = f"create_distributed_table({table}, {DISTRIBUTION_COLUMN!r})"
                await conn.execute(
                    text(q.CITUS_DISTRIBUTE_TABLE),
                    {
                        "table": table,
                        "column": DISTRIBUTION_COLUMN,
                        "colocate_with": "default" if table == first else first,
                    },
                )
                done.distributed.append(table)
            step = "the commit"
    except DBAPIError as exc:
        raise _citus_failure(exc, step) from exc
    return done
