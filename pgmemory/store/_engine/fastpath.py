"""The fast path: a statement as one prepared round trip, on psycopg directly.

A small scope's search takes well under a millisecond in the server; what a caller waited for
was everything around it: SQLAlchemy turning ``clause()`` into the driver's statement and
processing the result on every call (about a millisecond of Python), and the audited
transaction's four round trips (BEGIN, ``SET LOCAL synchronous_commit``, the statement,
COMMIT), each a wake-up of the server and of the caller. Here the statement is translated to
the server's own ``$n`` placeholders once per statement text (:func:`driver_statement`: psycopg
would split a long one again on every run), prepared server-side on its first run on each
connection, and run in autocommit: one round trip, its own transaction. An audited search
statement relaxes its own commit (:func:`pgmemory.store._ranking.search.search_memories` with
``relax_commit``), so the audit row is written in the same statement and committed with it,
as before: nothing is deferred, batched or written later. A caller's own recall record
(:func:`pgmemory.store.recall.record`) is one such statement too, and so are the writes of
memories and chat history. On one server in READ COMMITTED those statements take their locks
themselves (migration 0022; ``Database.locks_in_statement``); elsewhere the locks a statement
needs and the statement go in one pipeline, one round trip, committed as one implicit
transaction (or, in a unit of work, part of its transaction: see
:meth:`pgmemory.store._engine.database.Database.fetch`).

What a lost connection does: the statement is its own commit, so when the connection is lost
while it runs, its audit row may have committed or not; :meth:`Database.read <pgmemory.store._engine.database.Database.read>` runs the search
once more (see :meth:`pgmemory.store._engine.database.Database.fetch`), so the recall that
returned is audited, and a lost attempt may leave an audit row of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import pq
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg

import pgmemory.telemetry as telemetry
from pgmemory.store import queries as q
from pgmemory.store._engine.binary import ARRAY_TYPES, ArrayParameter
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.connector import driver_error

_DIALECT = PGDialectAsync_psycopg()


@dataclass(frozen=True)
class Deferred:
    """A write a deferred unit of work sends with its commit: its statement, its parameters
    and the locks it takes that the writes queued before it did not."""

    statement: str
    params: Mapping[str, Any]
    lock_users: tuple[str, ...]
    lock_sessions: tuple[tuple[str, str], ...]


def lock_statement(
    users: Iterable[str], sessions: Iterable[tuple[str, str]] = ()
) -> tuple[str, dict[str, Any]]:
    """The statement that takes these locks, and its parameters: one user's erasure lock alone
    is :data:`~pgmemory.store.queries.LOCK_USER_SHARED`; any other set is
    :data:`~pgmemory.store.queries.LOCK_FOR_WRITE`, each kind in sorted order (so two writes
    naming the same users or sessions never wait for each other in a cycle)."""
    named = sorted(users)
    ordered = sorted(sessions)
    if len(named) == 1 and not ordered:
        return q.LOCK_USER_SHARED, {"user_id": named[0]}
    return q.LOCK_FOR_WRITE, {
        "users": named,
        "session_users": [user for user, _ in ordered],
        "sessions": [session for _, session in ordered],
    }


#: A parameter as SQLAlchemy compiles ``:name`` (``%(name)s``), or an escaped ``%``.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
#: A parameter cast to an array type, as SQLAlchemy compiles ``CAST(:name AS type[])``.
_ARRAY_PARAMETER = re.compile(r"CAST\(%\((\w+)\)s AS ([a-z0-9_ ]+)\[\]\)")


@dataclass(frozen=True, slots=True)
class DriverStatement:
    """A statement as the server parses it: ``$n`` placeholders, sent as it is.

    psycopg keeps its own translation of ``%(name)s`` placeholders only for statements of up to
    4,096 bytes and 50 parameters; a recall (~21 KB) or a hybrid search (~12 KB) was split
    again on every run (with its parameters, 0.16 and 0.10 ms of Python a run; 0.02 now). This
    one is made once per statement text (:func:`driver_statement`) and run on a raw cursor.

    Attributes:
        sql: The statement, ``$1``, ``$2``... in place of its ``:name`` parameters.
        names: The parameter each ``$n`` stands for (``names[n - 1]``).
        arrays: The parameters cast to an array type, each with the class it is sent as
            (:mod:`pgmemory.store._engine.binary`: the cast's element type, in binary).
    """

    sql: str
    names: tuple[str, ...]
    arrays: Mapping[str, type[ArrayParameter]]
    #: Its result's column names, by the result's number of columns (read once: psycopg's
    #: ``dict_row`` decodes every name again for every result, ~5 µs for a search's).
    _columns: dict[int, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        """``params`` in placeholder order, each array parameter as its cast's class."""
        arrays = self.arrays
        out = []
        for name in self.names:
            value = params[name]
            if name in arrays and value is not None and not isinstance(value, ArrayParameter):
                value = arrays[name](value)
            out.append(value)
        return out

    async def rows(self, cursor: psycopg.AsyncRawCursor[Any]) -> list[dict[str, Any]]:
        """The rows of this statement's result on ``cursor``, as dicts by column name; none
        when it returned no rows. Asked of the result's status: ``cursor.description`` would
        build a column object per column on every call (~20 µs)."""
        result = cursor.pgresult
        if result is None or result.status != pq.ExecStatus.TUPLES_OK:
            return []
        columns = self._columns.get(result.nfields)
        if columns is None:
            columns = tuple((result.fname(i) or b"").decode() for i in range(result.nfields))
            self._columns[result.nfields] = columns
        return [dict(zip(columns, row, strict=True)) for row in await cursor.fetchall()]


@lru_cache(maxsize=256)
def driver_statement(statement: str) -> DriverStatement:
    """``statement`` (``:name`` parameters, ``::`` casts) as the server takes it, compiled as
    SQLAlchemy itself would send it; translated once per statement text."""
    compiled = clause(statement).compile(dialect=_DIALECT).string
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    arrays: dict[str, type[ArrayParameter]] = {}
    for name, element in _ARRAY_PARAMETER.findall(compiled):
        if element not in ARRAY_TYPES:
            raise ValueError(
                f"no array parameter class for {element}[] (pgmemory.store._engine.binary)"
            )
        arrays[name] = ARRAY_TYPES[element]
    return DriverStatement(
        sql=_PLACEHOLDER.sub(number, compiled), names=tuple(names), arrays=arrays
    )


#: Where a connection keeps its own cursor (:func:`own_cursor`).
_CURSOR = "_pgmemory_cursor"


def own_cursor(conn: psycopg.AsyncConnection[Any]) -> psycopg.AsyncRawCursor[Any]:
    """``conn``'s own raw cursor, made on its first statement and used for every statement
    after it (a connection runs one statement or pipeline at a time).

    A new cursor per statement cost ~17 µs of a small search's ~0.3 ms round trip (measured):
    its adapters map, and its transformer, which psycopg keeps between two runs of the same
    statement on one cursor, with the loaders of the result's columns. The cursor holds its
    last result until the connection's next statement, as a connection's result would.
    """
    kept: psycopg.AsyncRawCursor[Any] | None = getattr(conn, _CURSOR, None)
    if kept is None or kept.closed:
        kept = psycopg.AsyncRawCursor(conn)
        setattr(conn, _CURSOR, kept)
    return kept


async def run(
    conn: psycopg.AsyncConnection[Any],
    statement: str,
    params: Mapping[str, Any],
    *,
    lock_users: Sequence[str] = (),
    lock_sessions: Sequence[tuple[str, str]] = (),
    begin: bool = False,
    prepare: bool = True,
) -> list[dict[str, Any]]:
    """Run ``statement`` (``:name`` parameters) on ``conn`` as one prepared round trip, in a
    ``statement`` span; psycopg's errors come out as
    :func:`~pgmemory.store._engine.connector.driver_error` says (SQLAlchemy's ``DBAPIError``,
    ``connection_invalidated`` when the connection was lost).

    Args:
        conn: A psycopg connection in autocommit (:meth:`Connections.driver_autocommit
            <pgmemory.store._engine.connections.Connections.driver_autocommit>`).
        statement: One statement from :mod:`pgmemory.store.queries`.
        params: Its parameters.
        lock_users: Users whose erasure lock the statement holds, shared, for its transaction
            (an audited recall writes an audit row under its user, which an erasure running
            at the same time must either see and pseudonymise, or precede). The lock and the
            statement go in one pipeline, one implicit transaction: still one round trip, and
            the statement's snapshot is taken after the lock is held.
        lock_sessions: ``(user_id, session_id)`` chat-history sessions whose append lock the
            statement holds, exclusively (taken in the same lock statement).
        begin: Open a transaction first, in the same pipeline, which stays open after the
            statement (``conn`` is in autocommit with none open: a unit of work's first
            statement, one round trip where psycopg's own BEGIN would take one more).
        prepare: prepare it on the connection (``Settings.prepared_statements``); unprepared,
            it is parsed and planned on every run, as a transaction-mode pooler needs.

    Returns:
        Its rows, as dicts by column name (none for a statement that returns no rows).
    """
    cursor = own_cursor(conn)
    sent = driver_statement(statement)
    with telemetry.sql("statement"):
        try:
            if not (lock_users or lock_sessions or begin):
                await cursor.execute(sent.sql, sent.values(params), prepare=prepare)
                return await sent.rows(cursor)
            # All go before one Sync: in autocommit the server runs the lock and the statement
            # as one implicit transaction, so the lock holds until the statement's commit (and
            # the statement's snapshot is taken after it); after BEGIN, or in a transaction,
            # they are part of it.
            async with conn.pipeline():
                if begin:
                    await cursor.execute(_begin(conn), prepare=False)
                await _send_locked(cursor, sent, params, lock_users, lock_sessions, prepare)
            return await sent.rows(cursor)
        except psycopg.Error as exc:
            raise driver_error(exc, conn) from exc


async def run_all(
    conn: psycopg.AsyncConnection[Any],
    writes: Sequence[Deferred],
    *,
    prepare: bool = True,
    block: bool = True,
) -> None:
    """Commit ``writes`` as ONE transaction in one round trip: each write's locks and
    statement before one Sync (a deferred unit of work's commit: their rows are not read).

    On an error nothing is written: the server skips the rest, and the failed transaction is
    rolled back (a round trip more when it was a block) before the error is raised, so
    ``conn`` can be reused.

    Args:
        conn: A psycopg connection in autocommit, with no transaction open.
        writes: What the unit of work queued, in order.
        prepare: As for :func:`run`.
        block: Between BEGIN (the connection's isolation level) and COMMIT. Without, the
            writes are the implicit transaction of the statements before a Sync, in the
            session's default isolation: one transaction all the same, two statements fewer.
            Citus needs the block (it coordinates a transaction across statements only inside
            one), and so does a session whose default isolation is not READ COMMITTED (each
            lock is taken before the snapshot of the statement it guards).
    """
    cursor = own_cursor(conn)
    try:
        async with conn.pipeline():
            if block:
                await cursor.execute(_begin(conn), prepare=False)
            for write in writes:
                await _send_locked(
                    cursor,
                    driver_statement(write.statement),
                    write.params,
                    write.lock_users,
                    write.lock_sessions,
                    prepare,
                )
            if block:
                await cursor.execute("COMMIT", prepare=False)
    except psycopg.Error:
        if not conn.broken and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                await conn.execute("ROLLBACK")
        raise


async def _send_locked(
    cursor: psycopg.AsyncRawCursor[Any],
    sent: DriverStatement,
    params: Mapping[str, Any],
    lock_users: Sequence[str],
    lock_sessions: Sequence[tuple[str, str]],
    prepare: bool,
) -> None:
    """In an open pipeline, on ``cursor``: the lock statement of ``lock_users`` and
    ``lock_sessions`` (when there are any), then ``sent`` with ``params``. One cursor serves
    the pipeline's statements (making one costs more Python than a small statement's own): its
    result is the last statement's, as a pipeline's statements before it return nothing
    that is read."""
    if lock_users or lock_sessions:
        lock, values = lock_statement(lock_users, lock_sessions)
        locking = driver_statement(lock)
        await cursor.execute(locking.sql, locking.values(values), prepare=prepare)
    await cursor.execute(sent.sql, sent.values(params), prepare=prepare)


def _begin(conn: psycopg.AsyncConnection[Any]) -> str:
    """The BEGIN psycopg itself would send: with the connection's isolation level."""
    level = conn.isolation_level
    if level is None:
        return "BEGIN"
    return "BEGIN ISOLATION LEVEL " + psycopg.IsolationLevel(level).name.replace("_", " ")
