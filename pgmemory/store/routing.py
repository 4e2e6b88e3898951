"""How pgmemory's data and statements spread over a sharded (Citus) database, by user.

Every per-user table has ``user_id`` in its primary key and in every unique index, so Citus can
distribute them all by ``user_id``, co-located (a user's memories, audit rows, history and
facts share one shard group); the collections catalogue is small and read by every statement,
so it is a reference table (copied to every node). :func:`pgmemory.admin.distribution.distribute`
(``pgmemory db distribute``) does exactly that on a database where Citus is installed.

Every statement in :mod:`pgmemory.store.queries` that touches a per-user table names one user
(:func:`names_one_user`: a ``user_id = :param`` filter, or one user's value in an INSERT), so
Citus routes it to one shard; the exceptions are listed here, each with why, in
:data:`FAN_OUT` (runs on every shard) and :data:`CONSTANT_USER` (one shard, named by a
constant); the admin plane's statements have their own two lists beside them
(:mod:`pgmemory.admin.statements`). ``tests/store/test_routing.py`` reads every statement of
both planes and fails on one that is in neither list. The lists live beside the statements,
not on them, so that editing a statement and classifying it stay separate changes.
"""

from __future__ import annotations

import re

#: Tables holding one user's rows each; distributed by ``user_id``, co-located with the first.
PER_USER_TABLES = (
    "pgmemory_memories",
    "pgmemory_memory_audit",
    "pgmemory_recall_audit",
    "pgmemory_chat_messages",
    "pgmemory_facts",
    "pgmemory_fact_audit",
    "pgmemory_jobs",
    "pgmemory_user_secrets",
    "pgmemory_deleted_memories",
)

#: pgmemory's own SQL functions (migrations 0006, 0014, 0022) that read or write per-user
#: tables. The first argument of the first five is the user, so a call with a bound first
#: argument names one user (an erasure also writes the pseudonym's rows and the records
#: user's); the prune takes a cutoff and sweeps every user's audit rows.
PER_USER_FUNCTIONS = (
    "pgmemory_keyed_sha256",
    "pgmemory_erase_user",
    "pgmemory_erasure_stamp",
    "pgmemory_erasure_guard",
    "pgmemory_history_tail",
    "pgmemory_erase_user_audit",
    "pgmemory_prune_audit",
)

#: Per-user tables distributed in a co-location group of their own: the per-user secrets are
#: read and created by the owner's keyed-hash function inside the application role's
#: transactions, and Citus refuses a transaction in which two users change one shard group.
SEPARATELY_COLOCATED = ("pgmemory_user_secrets",)

#: Small tables every statement may join: copied to every node.
REFERENCE_TABLES = ("pgmemory_collections",)

#: Tables of no user that stay where they are, on the coordinator (Citus: a local table): the
#: operators' access tokens, read and written only by the admin plane, never joined with
#: per-user tables.
COORDINATOR_TABLES = ("pgmemory_access_tokens",)

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
    "INSERT_MEMORIES_LOCKING": "INSERT_MEMORIES taking its locks itself: one server only",
    "INSERT_FROM_STAGING": "bulk import from the local staging table: rows of any users",
    "INSERT_FROM_STAGING_UNKEYED": "bulk import from the local staging table: rows of any users",
    "DELETE_EXPIRED": "the expiry sweep: every user's expired rows, on every shard",
    "delete_ids": "deleting by id in a scope without a user (session, agent or application)",
    "delete_scope": "erasing a session, agent or application scope (no user): any user's rows",
    "search_memories": "a search of a scope without a user (session, agent or application)",
    "recall_memories": "a recall of a scope without a user (session, agent or application)",
    "list_memories": "listing a scope without a user (session, agent or application)",
    "count_memories": "counting a scope without a user (session, agent or application)",
    "ANN_INDEX_DDL": "DDL: the approximate index is built on every shard",
    "ANN_IVFFLAT_DDL": "DDL: the approximate index is built on every shard",
    "ANN_COLLECTION_ROWS": "enable_ann: the collection's size for an IVFFlat index's lists",
    "MEMORIES_RELKIND": "pgmemory db partition, enable_ann: the catalog's kind of the table, no rows",
    "MEMORIES_DISTRIBUTED": "opening a store: whether Citus distributes the table, no rows",
    "FIRST_PASSES": (
        "opening a store: whether the table keeps codes and half vectors (the catalog), no rows"
    ),
    "ANALYSED_ROWS": "after a bulk import: the table's row estimate from the catalog, no rows",
    "VACUUM_ANALYZE_MEMORIES": (
        "after a bulk import: the table vacuumed and its statistics refreshed, on every shard"
    ),
    "ANN_LARGE_USERS": "the approximate-index probe: the large users' scopes and their sizes (all users)",
    "SHORTLIST_LARGE_USERS": "the two-phase probe: which users' scopes are large (all users)",
    "JOBS_DUE_USERS": "a worker's scan for the users whose derivation jobs are due (all users)",
    "JOBS_PENDING": "how many derivation jobs are pending, for flush() and the worker's report",
    "DROP_FAILED_JOBS": "the worker's sweep of jobs out of attempts past their keep time (all users)",
}

#: Statements that touch one shard, that of the ``''`` (no user) rows, naming it by a constant.
CONSTANT_USER: dict[str, str] = {}

_PER_USER = re.compile(r"\b(?:" + "|".join(PER_USER_TABLES + PER_USER_FUNCTIONS) + r")\b")
#: A ``user_id = :param`` filter, with or without a table alias.
_USER_FILTER = re.compile(r"\buser_id\s*=\s*:\w+")
#: One user's value bound in an INSERT.
_USER_VALUE = re.compile(r"\bINSERT\b.*:(?:audit_)?user_id\b", re.DOTALL | re.IGNORECASE)
#: A call of one of the user-first functions with the user bound.
_USER_CALL = re.compile(
    r"\b(?:" + "|".join(PER_USER_FUNCTIONS[:5]) + r")\(\s*:(?:audit_)?user_id\b"
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
