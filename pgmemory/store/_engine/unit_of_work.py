"""A unit of work's one transaction, and the locks a write holds.

:class:`SharedTransaction` is what :meth:`pgmemory.store._engine.database.Database.unit_of_work` makes
the current task's writes join; :func:`locks` is the one statement that takes a write's erasure
and append locks, the one :func:`~pgmemory.store._engine.fastpath.lock_statement` chooses (also
for the fast path's pipeline). Both run their statements on the driver below them
(:mod:`pgmemory.store._engine.fastpath`) and take their connection from the database's
connections (:mod:`pgmemory.store._engine.connections`), also below them; nothing here calls
up into the database.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import psycopg
from psycopg import pq
from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction

from pgmemory.errors import TurnWriteFailedError
from pgmemory.store._engine import fastpath
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.connections import Connections
from pgmemory.store._engine.driver_errors import DRIVER_ERRORS, reraise


def locks(
    users: frozenset[str], sessions: frozenset[tuple[str, str]]
) -> tuple[TextClause, dict[str, Any]] | None:
    """The one statement (:func:`fastpath.lock_statement`) that holds the erasure lock of
    ``users`` (shared) and the append lock of ``sessions`` (exclusive) until the transaction
    ends, with its parameters; None for a write naming neither. The caller executes it
    (``await conn.execute(*held)``): no frame of its own on the write's stack."""
    if not (users or sessions):
        return None
    statement, params = fastpath.lock_statement(users, sessions)
    return clause(statement), params


async def _driver(conn: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under a SQLAlchemy connection (in its transaction, if begun)."""
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    return driver  # type: ignore[no-any-return]


class SharedTransaction:
    """One connection and transaction that the writes of a ``Database.unit_of_work``
    block join; writers from concurrent tasks take turns.

    A joined write runs in the transaction itself, with no savepoint around it (a savepoint
    costs two round trips): a lock it takes is held until the end, so each user's erasure
    lock and each session's append lock is taken once per block. A write that fails therefore
    fails the block: later writes are refused and the block rolls back
    (:class:`~pgmemory.errors.TurnWriteFailedError`). Only a write nested in another write of
    the same task is a savepoint of its own.

    A ``deferred`` block sends nothing while its writes are ones whose rows their callers do
    not need (``Database.written`` of a ``Write`` that is ``deferrable``): it queues them, and :meth:`finish` hands
    them back, for the database to send as one transaction in one round trip.
    The first other write (a :meth:`join`, or a statement whose rows are needed) sends the
    queued ones first, in order, in the shared transaction, and the block goes on as an
    undeferred one. A queued write's error comes out of the commit (nothing is written).

    Args:
        connections: The database's connections: the block's one is taken there at its first
            write, and its commit noted there for read-your-writes on replicas.
        prepare: Prepare statements on the connection (``Settings.prepared_statements``).
        deferred: Queue the writes whose rows are not needed for the commit.
    """

    def __init__(
        self,
        connections: Connections,
        *,
        prepare: bool,
        deferred: bool = False,
    ) -> None:
        self._connections = connections
        self._prepare = prepare
        self._defers = deferred
        #: The writes queued for the commit (while nothing has been sent).
        self._deferred: list[fastpath.Deferred] = []
        #: The users the joined writes named (None once one named none: everyone).
        self._users: frozenset[str] | None = frozenset()
        #: The users and sessions whose locks the transaction holds.
        self._locked_users: set[str] = set()
        self._locked_sessions: set[tuple[str, str]] = set()
        self._conn: AsyncConnection | None = None
        self._outer: AsyncTransaction | None = None
        #: The driver connection switched to autocommit for the BEGIN it sent itself (see
        #: fetch), switched back when the transaction has ended.
        self._autocommit: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._owner: asyncio.Task[object] | None = None
        self._closed = False
        #: Why the block can only roll back (a joined write failed), or None.
        self._failed: str | None = None

    @contextlib.asynccontextmanager
    async def join(
        self, users: frozenset[str] | None, sessions: frozenset[tuple[str, str]]
    ) -> AsyncIterator[AsyncConnection]:
        """The shared connection, its needed locks held (see ``Database.write``).

        Raises:
            TurnWriteFailedError: An earlier write of the block failed.
        """
        if self._users is not None:
            self._users = None if users is None else self._users | users
        task = asyncio.current_task()
        if task is not None and task is self._owner:  # a write nested in this task's write
            assert self._conn is not None
            async with self._conn.begin_nested():
                if (held := locks(users or frozenset(), sessions)) is not None:
                    await self._conn.execute(*held)
                yield self._conn
            return
        async with self._lock:
            conn = await self._enter()
            self._owner = task
            try:
                await self._send_queued(conn)
                new_users = (users or frozenset()) - self._locked_users
                new_sessions = sessions - self._locked_sessions
                if (held := locks(frozenset(new_users), frozenset(new_sessions))) is not None:
                    await conn.execute(*held)
                self._locked_users |= new_users
                self._locked_sessions |= new_sessions
                yield conn
            except BaseException as exc:
                self._failed = type(exc).__name__
                if isinstance(exc, DRIVER_ERRORS):  # before the commit: nothing is committed
                    reraise(exc, step="statement", outcome="not stored")
                raise
            finally:
                self._owner = None

    async def fetch(
        self,
        statement: str,
        params: Mapping[str, Any],
        users: frozenset[str],
        sessions: frozenset[tuple[str, str]],
        *,
        deferrable: bool = False,
        locking: bool = False,
    ) -> list[dict[str, Any]] | None:
        """One statement in the shared transaction, on its driver connection: the locks the
        transaction does not hold yet and the statement in one round trip (``Database.fetch``).
        A statement of a task's own write block is one of that write's (its savepoint). With
        ``locking`` the statement takes its locks itself: none is sent before it.

        Returns:
            Its rows; None when it was queued for the commit (``deferrable``, in a deferred
            block that has sent nothing yet).

        Raises:
            TurnWriteFailedError: An earlier write of the block failed.
        """
        task = asyncio.current_task()
        if task is not None and task is self._owner:
            async with self.join(users, sessions) as conn:
                return await fastpath.run(
                    await _driver(conn), statement, params, prepare=self._prepare
                )
        if self._users is not None:
            self._users = self._users | users
        async with self._lock:
            new_users = users - self._locked_users
            new_sessions = sessions - self._locked_sessions
            # What the statement itself locks is held once it has run (or, queued, once it
            # runs: before the queued writes after it).
            sent_users, sent_sessions = (
                (frozenset[str](), frozenset[tuple[str, str]]())
                if locking
                else (new_users, new_sessions)
            )
            if deferrable and self._defers and self._conn is None:
                self._refuse_if_ended()
                self._deferred.append(
                    fastpath.Deferred(
                        statement, params, tuple(sorted(sent_users)), tuple(sorted(sent_sessions))
                    )
                )
                self._locked_users |= new_users
                self._locked_sessions |= new_sessions
                return None
            conn = await self._enter()
            await self._send_queued(conn)
            rows = await self._on_driver(
                await _driver(conn), statement, params, sent_users, sent_sessions
            )
            self._locked_users |= new_users
            self._locked_sessions |= new_sessions
            return rows

    async def _on_driver(
        self,
        driver: psycopg.AsyncConnection[Any],
        statement: str,
        params: Mapping[str, Any],
        users: Iterable[str],
        sessions: Iterable[tuple[str, str]],
    ) -> list[dict[str, Any]]:
        """Run a statement of the block on its driver connection (called holding ``_lock``)."""
        # Nothing sent yet: the statement's pipeline opens the transaction itself, in
        # autocommit (psycopg would send its own BEGIN and wait for it: a round trip more);
        # the server then holds the transaction open, and finish() ends it.
        begin = driver.info.transaction_status == pq.TransactionStatus.IDLE
        if begin:
            await driver.set_autocommit(True)
            self._autocommit = driver
        try:
            return await fastpath.run(
                driver,
                statement,
                params,
                lock_users=tuple(users),
                lock_sessions=tuple(sessions),
                begin=begin,
                prepare=self._prepare,
            )
        except BaseException as exc:
            self._failed = type(exc).__name__
            if isinstance(exc, DRIVER_ERRORS):  # before the commit: nothing is committed
                reraise(exc, step="statement", outcome="not stored")
            raise

    async def _send_queued(self, conn: AsyncConnection) -> None:
        """Send the queued writes, in order, before the block's first other statement (called
        holding ``_lock``, the shared connection taken): from then on nothing is queued."""
        queued, self._deferred = self._deferred, []
        if not queued:
            return
        driver = await _driver(conn)
        for write in queued:
            await self._on_driver(
                driver, write.statement, write.params, write.lock_users, write.lock_sessions
            )

    async def _enter(self) -> AsyncConnection:
        """The shared connection for the next write (called holding ``_lock``), taken and its
        transaction begun at the first.

        Raises:
            TurnWriteFailedError: An earlier write of the block failed.
        """
        self._refuse_if_ended()
        if self._conn is None:
            self._conn = await self._connections.connect()
            self._outer = await self._conn.begin()
        return self._conn

    def _refuse_if_ended(self) -> None:
        if self._closed:
            raise RuntimeError(
                "the shared transaction has ended; a task started inside the block wrote after it"
            )
        self._refuse_if_failed()

    def _refuse_if_failed(self) -> None:
        if self._failed is not None:
            raise TurnWriteFailedError(
                f"an earlier write in this shared transaction failed ({self._failed}); "
                "the block rolls back and writes nothing"
            )

    @property
    def users(self) -> frozenset[str] | None:
        """The users the block's writes named (None: one named none, so anyone's)."""
        return self._users

    async def finish(self, *, commit: bool) -> list[fastpath.Deferred]:
        """Commit or roll back the shared transaction (if it began), and return the connection;
        or, in a deferred block that sent nothing else, hand back the queued writes for the
        caller to send with their commit (none when rolling back).

        Raises:
            TurnWriteFailedError: Asked to commit after a joined write failed (it rolls back).
            The COMMIT's error, or a queued write's (nothing of the block is written). A failed
                ROLLBACK is not raised: the block's own error is the one that matters, and a
                transaction whose connection failed is not committed.
        """
        async with self._lock:
            self._closed = True
            conn, outer = self._conn, self._outer
            self._conn = self._outer = None
            queued, self._deferred = self._deferred, []
            if conn is None or outer is None:
                return queued if commit else []
            try:
                if commit and self._failed is None:
                    # Statements joined here keep the server's synchronous_commit: none relaxes
                    # its own commit inside a unit of work (see Database.in_unit_of_work).
                    try:
                        await outer.commit()
                    except DRIVER_ERRORS as exc:
                        reraise(exc, step="commit", outcome="unknown")
                    await self._connections.note_write(conn, self._users)
                else:
                    with contextlib.suppress(Exception):
                        await outer.rollback()
                    if commit:
                        self._refuse_if_failed()
            finally:
                with contextlib.suppress(Exception):
                    if self._autocommit is not None:
                        await self._autocommit.set_autocommit(False)
                with contextlib.suppress(Exception):
                    await conn.close()
        return []
