"""How pgmemory's data and statements spread over a sharded (Citus) database, by user.

Every per-user table has ``user_id`` in its primary key and in every unique index, so Citus can
distribute them all by ``user_id``, co-located (a user's memories, audit rows, history and
facts share one shard group); the collections catalogue is small and read by every statement,
so it is a reference table (copied to every node). :func:`pgmemory.admin.distribution.distribute`
(``pgmemory db distribute``) does exactly that on a database where Citus is installed.

Every statement of either plane (:mod:`pgmemory.store.queries`, :mod:`pgmemory.admin.statements`)
that touches a per-user table names one user (:func:`names_one_user`: a ``user_id = :param``
filter, or one user's value in an INSERT), so Citus routes it to one shard; the exceptions say
so, with why, where they are defined: ``fan_out=`` (runs on every shard) or ``constant_user=``
(one shard, named by a constant), on the :class:`~pgmemory.store._engine.statement.Statement`
or the statement builder (:func:`~pgmemory.store._engine.statement.builds`).
``tests/store/test_routing.py`` walks the registry of both planes and fails on a statement
whose classification is missing or stale.
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
