"""The store's database: where it is, its life cycle, and the verbs every statement runs by.

:class:`Database` resolves the URL (starting or reusing the embedded server when none is
given), optionally migrates, checks the schema, and holds the pooled engine. Every statement
of either plane (the store, and the operators' :mod:`pgmemory.admin`) runs through one of
these verbs, and nothing else touches the engine:

=====================  ===============================  ==========================  ==================
verb                   transaction                      retry                       replicas
=====================  ===============================  ==========================  ==================
:meth:`read`           autocommit, or one READ          the whole read method,      a hot standby when
                       COMMITTED transaction (for       once, after a lost          one may serve the
                       ``SET LOCAL``)                   connection (``retry.py``)   user; else primary
:meth:`fetch`          one statement, one prepared      as :meth:`read`             primary (its audit
                       round trip, its own commit;                                  row is a write)
                       joins the unit of work if one
                       is open
:meth:`read_rows`      a read-only statement's rows:    as :meth:`read`             as :meth:`read`
                       :meth:`fetch` without replicas,
                       else :meth:`read`
:meth:`audited`        a read and its recall audit      as :meth:`read`             a standby may serve
                       row, shaped and routed as                                    a search; its audit
                       ``deployment.py`` says                                       row then follows on
                                                                                    the primary
:meth:`write`          one transaction (joins the unit  never: a lost commit may    primary; notes the
                       of work if one is open)          have taken effect           WAL position for
                                                                                    read-your-writes
:meth:`unit_of_work`   makes the task's writes one      never                       primary
                       transaction, committed at the
                       end of the block
:meth:`ddl`            autocommit, for DDL that cannot  never                       primary
                       run in a transaction (``CREATE
                       INDEX CONCURRENTLY``)
=====================  ===============================  ==========================  ==================

Every verb gets a healthy connection: the pool replaces connections whose server went away (see
:func:`pgmemory.store._engine.connector.make_engine`), and when the embedded server itself is gone, it
is started again before connecting. Autocommit reads cost no BEGIN/COMMIT round trips and no
ROLLBACK, after which psycopg would drop its prepared statements.

Whatever the driver, SQLAlchemy or the pool raise comes out of a verb (and of opening) as a
:class:`~pgmemory.errors.DatabaseError` naming the step and, for a write, its outcome
(:mod:`pgmemory.store._engine.driver_errors`).

With read replicas (``Settings.read_urls``), :meth:`read` hands out a connection to a hot
standby when one is healthy and has replayed the reading user's own latest write (see
:mod:`pgmemory.store._engine.replicas`), else to the primary. For that, every committed :meth:`write`
notes the primary's WAL position for the users it names (``users=``; unnamed: for everyone).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import time
import weakref
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, Literal, TypeVar, overload

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

import pgmemory.telemetry as telemetry
from pgmemory.errors import DatabaseNotReadyError, InvalidInputError, StoreClosedError
from pgmemory.settings import Settings
from pgmemory.store import migrate as migrations, queries as q
from pgmemory.store._engine import fastpath, lifecycle
from pgmemory.store._engine.addresses import URL_SETTING
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.connector import (
    adopt_engine,
    check_database,
    driver_error,
    first_passes,
    is_distributed,
    make_engine,
)
from pgmemory.store._engine.deployment import (
    AuditedRead,
    AuditRoute,
    Deployment,
    Locking,
    TooFewRows,
)
from pgmemory.store._engine.driver_errors import DRIVER_ERRORS, Step, reraise, reraise_opening
from pgmemory.store._engine.held import HeldConnections
from pgmemory.store._engine.replicas import ReplicaSet, parse_lsn
from pgmemory.store._engine.unit_of_work import SharedTransaction, lock
from pgmemory.store.embedded import EmbeddedServer

logger = logging.getLogger(__name__)

C = TypeVar("C")

#: Why nothing opens when no URL is set and the embedded server may not start.
NO_URL_NO_EMBEDDED = (
    "no database URL is set and the embedded server is switched off (PGMEMORY_EMBEDDED=false): "
    "set PGMEMORY_DATABASE_URL, or pass a URL or an engine"
)


class Database:
    """A PostgreSQL database holding pgmemory's schema, reached through a pooled async engine.

    Args:
        url: A libpq or SQLAlchemy URL; None to use the embedded server under
            ``settings.data_dir``.
        settings: Pool sizes, timeouts, the data directory, whether an embedded server may start.
        migrate: Upgrade the schema to head when opening.
        engine: An application's own async engine to use instead of a URL (it stays the
            application's: closing the store does not dispose of it).
        read_urls: URLs of hot standbys of the primary that serve reads (see
            :meth:`read`); empty: the primary serves every read.
    """

    def __init__(
        self,
        url: str | None,
        *,
        settings: Settings,
        migrate: bool,
        engine: AsyncEngine | None = None,
        read_urls: Sequence[str] = (),
    ) -> None:
        if url is not None and engine is not None:
            raise InvalidInputError("pass a database URL or an engine, not both")
        self.settings = settings
        self._given_engine = engine
        if engine is not None:
            url = engine.url.render_as_string(hide_password=False)
        self._url = url
        #: The URL in use once open (the embedded server's when no URL was given).
        self._resolved_url: str | None = url
        self._migrate = migrate
        self._server: EmbeddedServer | None = None
        self._engine: AsyncEngine | None = None
        self._read_urls = tuple(read_urls)
        self._replicas: ReplicaSet | None = None
        self._closed = False
        #: How this database runs what the domain asks (read when the store opens).
        self.deployment = Deployment(durable_recall_audit=settings.durable_recall_audit)
        #: The two-phase path's first passes the memories keep (binary codes, half vectors:
        #: pgvector >= 0.7; read when the store opens).
        self.first_passes: tuple[q.FirstPass, ...] = ()
        #: The process the pools were made in: a forked child makes its own (see _usable).
        self._pid = os.getpid()
        #: A forked child's start of its own use of the embedded server (see _after_fork).
        self._child_server: asyncio.Future[str] | None = None
        self._child_server_due = False
        #: The connections handed out, so that close() can wait for those in flight.
        self._leases: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The fast path's connections kept between statements (none until open).
        self._held = HeldConnections(0)
        #: The shared transaction the current task's writes join, if any.
        self._shared: contextvars.ContextVar[SharedTransaction | None] = contextvars.ContextVar(
            f"pgmemory_shared_transaction_{id(self)}", default=None
        )

    async def open(self) -> None:
        """Connect (starting the embedded server if needed), optionally migrate, then check.

        Raises:
            DatabaseNotReadyError: pgvector or pgmemory's schema (at this version's head) is
                missing.
            MissingExtraError: No URL is set and the embedded server is not installed.
        """
        if self._closed:
            raise StoreClosedError(lifecycle.CLOSED)
        if self._engine is not None:
            return
        url = self._url
        if url is None:
            if not self.settings.embedded:
                raise DatabaseNotReadyError(NO_URL_NO_EMBEDDED)
            self._server = EmbeddedServer(self.settings.data_dir)
            logger.warning(
                "no database URL is set: using the embedded PostgreSQL server with data in %s "
                "(set PGMEMORY_DATABASE_URL for your own server, PGMEMORY_EMBEDDED=false to "
                "make a missing URL an error)",
                self.settings.data_dir,
            )
            url = await asyncio.to_thread(self._server.start)
        self._resolved_url = url
        try:
            if self._migrate:
                await asyncio.to_thread(migrations.upgrade, url)
            if self._given_engine is not None:
                self._engine = adopt_engine(self._given_engine, self.settings)
            else:
                self._engine = make_engine(url, self.settings)
            await check_database(self._engine, expected_revision=migrations.head_revision())
            distributed = await is_distributed(self._engine)
            if distributed and self._given_engine is None:
                # Citus plans no generic plan of a distributed statement (connector.GENERIC_PLANS)
                await self._engine.dispose()
                self._engine = make_engine(url, self.settings, generic_plans=False)
            self.first_passes = await first_passes(self._engine)
            # On an engine of its own only (an application's pool lends none), and never the
            # whole pool: one connection stays for the rest of the store and the engine's users.
            own = self._given_engine is None and self._idle_in_pool() is not None
            self._held = HeldConnections(self.settings.pool_size - 1 if own else 0)
            if self._read_urls:
                self._replicas = ReplicaSet(
                    self._read_urls, self.settings, generic_plans=not distributed
                )
            self.deployment = Deployment(
                distributed=distributed,
                replicated=self._replicas is not None,
                read_committed=self._engine.dialect.default_isolation_level == "READ COMMITTED",
                durable_recall_audit=self.settings.durable_recall_audit,
            )
        except BaseException as exc:
            await self._release()
            if isinstance(exc, DRIVER_ERRORS):
                reraise_opening(exc, url=url, setting=self._setting)
            raise

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (every statement then raises StoreClosedError)."""
        return self._closed

    async def close(self) -> None:
        """Refuse new statements, let those in flight finish, close the pool; release the
        embedded server (stopped when no process uses it).

        Then every verb raises :class:`~pgmemory.errors.StoreClosedError`; calls in flight keep
        their connections, awaited (at most ``CLOSE_GRACE_S``) before the pool goes. A dead
        server is fine. Calling it twice, or in a forked child (the parent's pool and server
        stay the parent's: see :mod:`pgmemory.store._engine.lifecycle`), is harmless.
        """
        if self._closed:
            return
        self._closed = True
        if self._pid != os.getpid():
            self._after_fork()
        await self._held.close()
        await lifecycle.wait_returned(self._leases, lifecycle.CLOSE_GRACE_S)
        await self._release()

    async def _release(self) -> None:
        """Close the pools and release the embedded server."""
        engine, self._engine = self._engine, None
        replicas, self._replicas = self._replicas, None
        if replicas is not None:
            await replicas.close()
        if engine is not None and engine is not self._given_engine:
            await engine.dispose()
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.stop)

    async def migrate(self) -> None:
        """Upgrade the schema to this version's head.

        Raises:
            RuntimeError: The URL is not known yet (the embedded server's is known once open).
        """
        if self._resolved_url is None:
            raise RuntimeError("open the store first (the embedded server's URL is known then)")
        try:
            await asyncio.to_thread(migrations.upgrade, self._resolved_url)
        except DRIVER_ERRORS as exc:
            reraise_opening(exc, url=self._resolved_url, setting=self._setting)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL in use (password included: don't log it)."""
        if self._resolved_url is None:
            raise RuntimeError("the store is not open yet: its embedded server has no URL")
        return self._resolved_url

    @property
    def engine(self) -> AsyncEngine:
        """The pooled async engine."""
        self._usable()
        if self._engine is None:
            raise RuntimeError("the store is not open: use `async with MemoryStore(...)`")
        return self._engine

    @property
    def replicas(self) -> ReplicaSet | None:
        """The read replicas, when ``read_urls`` named any (None before opening)."""
        return self._replicas

    def write(
        self,
        *,
        users: Iterable[str] | None = None,
        sessions: Iterable[tuple[str, str]] = (),
    ) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """The write verb: a connection in one transaction on the primary, committed when the
        block ends, rolled back on error; never retried.

        Inside a :meth:`unit_of_work` block it joins the unit's transaction instead: its work
        commits (or rolls back) with the rest of the block.

        Args:
            users: The users whose data the transaction writes: it holds their erasure lock,
                shared, and notes them for read-your-writes on replicas (``()`` for writes no
                read needs to see at once, such as recall audit rows). None, the safe
                default: it may write anyone's, so every read waits for it.
            sessions: The ``(user_id, session_id)`` chat-history sessions it appends to: it
                holds their append lock, exclusively, taken in the same statement as the
                erasure locks (:data:`~pgmemory.store.queries.LOCK_FOR_WRITE`).
        """
        named = None if users is None else frozenset(users)
        appended = frozenset(sessions)
        shared = self._shared.get()
        if shared is not None:
            return shared.join(named, appended)
        return self._own_transaction(named, appended)

    @contextlib.asynccontextmanager
    async def _own_transaction(
        self, users: frozenset[str] | None, sessions: frozenset[tuple[str, str]]
    ) -> AsyncIterator[AsyncConnection]:
        """A connection of its own in one transaction (see :meth:`write`)."""
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(telemetry.sql("transaction"))
            conn = await self._connect()
            stack.push_async_exit(conn)
            committing = False
            try:
                async with conn.begin():
                    await lock(conn, users or frozenset(), sessions)
                    yield conn
                    committing = True
            except DRIVER_ERRORS as exc:
                if committing:
                    reraise(exc, step="commit", outcome="unknown")
                reraise(exc, step="statement", outcome="not stored")
            await self.note_write(conn, users)

    async def note_write(
        self, conn: AsyncConnection | psycopg.AsyncConnection[Any], users: frozenset[str] | None
    ) -> None:
        """After a commit on ``conn`` (SQLAlchemy's, or a driver connection in autocommit):
        remember the primary's WAL position for ``users``' reads.

        Only with replicas, and only for transactions that name users or none (see
        :meth:`transaction`); one round trip, in autocommit. If the position cannot be read,
        reads go to the primary for ``replica_max_lag_s`` seconds.
        """
        if self._replicas is None or users == frozenset():
            return
        try:
            if isinstance(conn, AsyncConnection):
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                position = (await conn.execute(clause(q.WAL_POSITION))).scalar_one()
            else:
                position = (await fastpath.run(conn, q.WAL_POSITION, {}, prepare=False))[0]["lsn"]
        except (DBAPIError, psycopg.Error):
            self._replicas.marks.note_unknown(self.settings.replica_max_lag_s)
            return
        self._replicas.marks.note(users, parse_lsn(position))

    @contextlib.asynccontextmanager
    async def read(
        self, user: str | None, *, transaction: bool = False
    ) -> AsyncIterator[AsyncConnection]:
        """The read verb: a connection for a read of ``user``'s data, on a replica when one may
        serve it. The method doing the read is retried as a whole
        (:func:`pgmemory.store._engine.retry.retried_read`).

        A replica serves it when it is reachable, not lagging, and has replayed the user's
        latest write through this database (waiting at most ``replica_wait_ms``); otherwise,
        or without replicas, the primary does.

        Args:
            user: The user the read is confined to; None for a read that may cover several
                users (it waits for the latest write of anyone).
            transaction: Run the block in one transaction (committed at the end), for reads
                that need ``SET LOCAL``; otherwise the connection is in autocommit.
        """
        conn = None
        if self._replicas is not None:
            self._usable()
            conn = await self._replicas.acquire(user)
            if conn is not None:
                self._leases.add(conn)
        if conn is None:
            conn = await self._connect()
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_exit(conn)
            try:
                if transaction:
                    conn = await conn.execution_options(isolation_level="READ COMMITTED")
                    async with conn.begin():
                        yield conn
                else:
                    yield await conn.execution_options(isolation_level="AUTOCOMMIT")
            except DRIVER_ERRORS as exc:
                reraise(exc, step="statement", outcome=None)

    def read_rows(
        self, statement: str, params: Mapping[str, Any], *, user: str | None
    ) -> Coroutine[Any, Any, list[dict[str, Any]]]:
        """The rows of a read-only ``statement`` of ``user``'s data, as dicts: on a replica's
        connection when :meth:`read` may give one (replicas configured), else as :meth:`fetch`
        (one prepared round trip on the primary, no SQLAlchemy connection around it). It only
        chooses, as :meth:`audited` does: what it returns to await is the route's coroutine."""
        if self._replicas is None:
            return self.fetch(statement, params)
        return self._read_rows_on_replica(statement, params, user)

    async def _read_rows_on_replica(
        self, statement: str, params: Mapping[str, Any], user: str | None
    ) -> list[dict[str, Any]]:
        async with self.read(user) as conn:
            return [dict(row) for row in (await conn.execute(clause(statement), params)).mappings()]

    @contextlib.asynccontextmanager
    async def unit_of_work(self, *, deferred: bool = False) -> AsyncIterator[None]:
        """The unit-of-work verb: make the writes of the current task join ONE transaction
        until the block ends.

        ``deferred``: while its writes are ones whose rows the caller does not need
        (:meth:`fetch` with ``deferrable``), the block sends nothing and its end commits them
        in one round trip (see :class:`~pgmemory.store._engine.unit_of_work.SharedTransaction`);
        a block inside another one has the outer one's way.

        Every :meth:`write` (and :meth:`fetch`) started in this task (or in tasks it starts)
        while the block runs joins one transaction on one connection: when the block ends
        normally everything commits at once; when it raises, or one of its writes failed,
        everything rolls back (see :class:`~pgmemory.store._engine.unit_of_work.SharedTransaction`). The
        connection is taken, and the transaction begun, at the first write, so a block that
        writes nothing costs nothing. A block inside another one joins the outer one.

        :meth:`read` still uses connections of its own: they do not see the block's
        uncommitted writes. Creating a collection inside the block is not supported (the
        catalogue reads it back outside the block).

        Raises:
            Whatever the block raises, after rolling back; or the COMMIT's error.
            TurnWriteFailedError: A write of the block failed and the block caught its error
                (it rolled back).
        """
        if self._shared.get() is not None:
            yield
            return
        shared = SharedTransaction(
            self._connect,
            self.note_write,
            prepare=self.settings.prepared_statements,
            deferred=deferred,
        )
        token = self._shared.set(shared)
        try:
            yield
        except BaseException:
            self._shared.reset(token)
            await shared.finish(commit=False)
            raise
        self._shared.reset(token)
        queued = await shared.finish(commit=True)
        if queued:
            await self._send_deferred(queued, shared.users)

    @contextlib.asynccontextmanager
    async def ddl(self) -> AsyncIterator[AsyncConnection]:
        """The DDL verb: a primary connection in autocommit, each statement committing on its
        own, for DDL that cannot run in a transaction and the catalog probes around it; never
        retried."""
        async with contextlib.AsyncExitStack() as stack:
            conn = await self._connect()
            stack.push_async_exit(conn)
            try:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")
            except DRIVER_ERRORS as exc:
                reraise(exc, step="statement", outcome=None)

    @property
    def in_unit_of_work(self) -> bool:
        """Whether the current task is inside a :meth:`unit_of_work` block."""
        return self._shared.get() is not None

    def _usable(self) -> None:
        """Raise StoreClosedError once closed; in a forked child, leave the parent's pools (a
        pid check before every statement: one system call, and it sees every kind of fork)."""
        if self._closed:
            raise StoreClosedError(lifecycle.CLOSED)
        if self._pid != os.getpid():
            self._after_fork()

    def _after_fork(self) -> None:
        """In a forked child: fresh pools, and a handle of its own on the embedded server (taken
        at its first connection: the child counts as a user, and stops nothing of the parent's)."""
        self._pid = os.getpid()
        engines = [self._engine] if self._engine is not None else []
        if self._replicas is not None:
            engines += [replica.engine for replica in self._replicas.replicas]
        lifecycle.leave_pools_to_parent(engines)
        self._held.leave_to_parent()
        self._leases = weakref.WeakSet()
        if self._server is not None:
            lifecycle.keep_inherited(self._server)
            self._server = EmbeddedServer(self._server.data_dir)
            self._child_server, self._child_server_due = None, True

    async def _connect(self) -> AsyncConnection:
        """A started pooled connection (the caller closes it); see :meth:`_checkout`.

        When the pool has no idle connection left, one the fast path holds goes back to it
        first, so that no statement of the store waits for a connection that sits idle."""
        if len(self._held) and self._idle_in_pool() == 0:
            await self._held.release_one()
        return await self._checkout(self.engine.connect)

    def _idle_in_pool(self) -> int | None:
        """How many connections wait idle in the primary's pool (None: a pool that does not
        say, which then lends none to the fast path)."""
        checkedin = getattr(self.engine.sync_engine.pool, "checkedin", None)
        return checkedin() if callable(checkedin) else None

    async def _checkout(self, connect: Callable[[], Awaitable[C]]) -> C:
        """A connection from ``connect`` (the pool's: a started ``AsyncConnection``, or a raw
        pooled one), kept among the leases that close() waits for.

        The pool has already replaced connections whose server went away; when no new one can
        be made and the embedded server is ours, that server is started again (it died) and
        the connection made once more.
        """
        self._usable()
        if self._child_server_due and self._server is not None:
            if self._child_server is None:  # one start, whichever task connects first
                self._child_server = asyncio.ensure_future(asyncio.to_thread(self._server.start))
            try:
                await asyncio.shield(self._child_server)
            except Exception:
                self._child_server = None  # the next connection tries again
                raise
            self._child_server_due = False
        try:
            try:
                conn = await connect()
            except (DBAPIError, psycopg.Error) as exc:
                if self._server is None:
                    raise
                logger.warning(
                    "cannot connect to the embedded server (%s); starting it again",
                    type(getattr(exc, "orig", exc)).__name__,
                )
                await asyncio.to_thread(self._server.ensure_running)
                conn = await connect()
        except DRIVER_ERRORS as exc:
            reraise(
                exc,
                step="connect",
                outcome="not stored",
                url=self._resolved_url,
                setting=self._setting,
            )
        self._leases.add(conn)
        return conn

    @property
    def _setting(self) -> str:
        """What names the database, for the fix of a connection that failed."""
        if self._server is not None:
            return f"the embedded server (data in {self.settings.data_dir})"
        return URL_SETTING

    @contextlib.asynccontextmanager
    async def driver_autocommit(
        self,
        *,
        wrote: bool = False,
        users: frozenset[str] | None = None,
        step: Step = "statement",
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection's own psycopg connection, in autocommit: what :meth:`fetch` runs
        on, skipping SQLAlchemy's statement handling (:mod:`pgmemory.store._engine.fastpath`).

        It is one the fast path held since its last statement (:mod:`pgmemory.store._engine.held`: no
        checkout at all), or else one checked out of the pool as a raw connection (the pool's
        events, its checks and its reset on return still apply), without a SQLAlchemy
        ``Connection`` around it: that wrapper cost a small search about 0.05 ms of its ~0.9 ms.
        When done, it is held again if it may be, else it goes back to the pool.

        Args:
            wrote: The block writes ``users``' data (None: anyone's), committing as it runs:
                after it the write is noted for replicas, and a lost connection leaves its
                outcome unknown (never retried).
            users: See ``wrote``.
            step: What the block is, for its errors (``statement`` or ``commit``).

        Errors come out as :func:`~pgmemory.store._engine.driver_errors.translated` says: when the
        connection was lost, the pool discards it and the error is ``connection_invalidated``,
        so :func:`pgmemory.store._engine.retry.retried_read` runs a read once more.
        """
        self._usable()
        taken = await self._held.take()
        if taken is None:
            pooled = await self._checkout(self.engine.raw_connection)
            leased_at = time.monotonic()
            driver = pooled.driver_connection
            assert driver is not None
        else:
            pooled, driver, leased_at = taken
        kept = False
        try:
            if not driver.autocommit:
                await driver.set_autocommit(True)
            try:
                yield driver
                if wrote:  # on this connection, before another task may take it
                    await self.note_write(driver, users)
            except DRIVER_ERRORS as exc:  # fastpath.run's DBAPIError, or psycopg's own
                error = driver_error(exc, driver) if isinstance(exc, psycopg.Error) else exc
                if (driver.broken or driver.closed) and pooled.is_valid:
                    await greenlet_spawn(pooled.invalidate)
                reraise(error, step=step, outcome="unknown" if wrote else None)
            finally:
                if pooled.is_valid:
                    kept = self._held.keep(pooled, driver, leased_at)
                    if not kept:
                        try:
                            await driver.set_autocommit(False)
                        except psycopg.Error:  # e.g. cancelled mid-statement: not reusable
                            await greenlet_spawn(pooled.invalidate)
        finally:
            if not kept and pooled.is_valid:
                await greenlet_spawn(pooled.close)

    @overload
    async def fetch(
        self,
        statement: str | Locking,
        params: Mapping[str, Any],
        *,
        users: Sequence[str] = (),
        sessions: Sequence[tuple[str, str]] = (),
        wrote: bool = False,
        deferrable: Literal[False] = False,
    ) -> list[dict[str, Any]]: ...

    @overload
    async def fetch(
        self,
        statement: str | Locking,
        params: Mapping[str, Any],
        *,
        users: Sequence[str] = (),
        sessions: Sequence[tuple[str, str]] = (),
        wrote: bool = False,
        deferrable: bool,
    ) -> list[dict[str, Any]] | None: ...

    async def fetch(
        self,
        statement: str | Locking,
        params: Mapping[str, Any],
        *,
        users: Sequence[str] = (),
        sessions: Sequence[tuple[str, str]] = (),
        wrote: bool = False,
        deferrable: bool = False,
    ) -> list[dict[str, Any]] | None:
        """The fast verb: ``statement`` (``:name`` parameters) and the locks it needs in one
        prepared round trip on the primary's driver connection, its rows as dicts
        (:mod:`pgmemory.store._engine.fastpath`): one implicit transaction, committed when it returns;
        in a :meth:`unit_of_work`, part of the unit's transaction (the locks it holds already
        not taken again).

        Args:
            users: The users whose rows the statement writes: their erasure lock is held,
                shared, as :meth:`write` holds it.
            sessions: The chat-history sessions it appends to (their append lock, exclusive).
            wrote: It writes ``users``' data: with replicas their reads wait for it (as after
                :meth:`write`); a lost connection leaves the outcome unknown (never retried).
            deferrable: The caller can do without its rows: in a deferred unit of work that
                has sent nothing yet it is queued for the commit, and None is returned.

        A :class:`~pgmemory.store._engine.deployment.Locking` statement runs in the form the
        deployment chooses: where locks are taken in the statement, no lock statement is sent.
        """
        if isinstance(statement, Locking):
            statement, extra, locking = self.deployment.write_statement(statement, users)
            if extra:
                params = {**params, **extra}
        else:
            locking = False
        shared = self._shared.get()
        if shared is not None:  # its errors are the unit of work's (translated there)
            return await shared.fetch(
                statement, params, frozenset(users), frozenset(sessions),
                deferrable=deferrable, locking=locking,
            )  # fmt: skip
        locks: tuple[Sequence[str], Sequence[tuple[str, str]]] = (
            ((), ()) if locking else (users, sessions)
        )
        named = frozenset(users) if wrote else None
        async with self.driver_autocommit(wrote=wrote, users=named) as conn:
            return await fastpath.run(
                conn, statement, params, lock_users=tuple(locks[0]),
                lock_sessions=tuple(locks[1]), prepare=self.settings.prepared_statements,
            )  # fmt: skip

    async def _send_deferred(
        self, writes: Sequence[fastpath.Deferred], users: frozenset[str] | None
    ) -> None:
        """A deferred unit of work's commit: its queued ``writes`` of ``users`` (None: anyone's)
        in one round trip (:func:`fastpath.run_all`)."""
        async with self.driver_autocommit(wrote=True, users=users, step="commit") as conn:
            with telemetry.sql("statement"):
                await fastpath.run_all(
                    conn,
                    writes,
                    prepare=self.settings.prepared_statements,
                    block=self.deployment.needs_block,
                )

    @property
    def distributed(self) -> bool:
        """Whether the memories table is distributed by Citus (read when the store opens)."""
        return self.deployment.distributed

    @property
    def locks_in_statement(self) -> bool:
        """Whether a statement of one user takes its locks itself
        (:attr:`Deployment.locks_in_statement <pgmemory.store._engine.deployment.Deployment>`)."""
        return self.deployment.locks_in_statement

    @property
    def guards_reads(self) -> bool:
        """Whether an audited read of a user takes the user's erasure lock in its own statement
        now (:meth:`Deployment.shape <pgmemory.store._engine.deployment.Deployment.shape>`'s
        ``guarded``): where locks are taken in the statement, outside a unit of work."""
        return self.deployment.guards_reads(in_unit_of_work=self.in_unit_of_work)

    def audited(self, read: AuditedRead) -> Coroutine[Any, Any, Sequence[Any]]:
        """The audited-read verb: ``read``'s statement, in the shape and on the route the
        deployment chooses (:mod:`pgmemory.store._engine.deployment`), its recall audit row committed
        with it: in the statement itself, one prepared round trip (:meth:`fetch`, holding the
        user's erasure lock unless the statement takes it); apart from it in one transaction
        holding that lock (Citus); or, when a hot standby served it, inserted on the primary
        after it (:meth:`insert_audit`). With ``settings``, the read runs in a transaction of
        its own after them.

        It only chooses (a plain function): what it returns to await is the chosen route's
        coroutine, :meth:`fetch` itself for the one round trip.

        Raises:
            TooFewRows: Fewer rows than ``read.wanted`` (nothing of the read committed).
        """
        route = self.deployment.audit_route(read)
        shape = self.deployment.shape(read, route, in_unit_of_work=self.in_unit_of_work)
        statement = read.build(shape)
        if route is AuditRoute.INLINE and read.settings is None:
            user = read.user
            users = (user,) if read.audit and user and not shape.guarded else ()
            return self.fetch(statement, read.params, users=users)
        return self._audited_in_transaction(read, route, statement)

    async def _audited_in_transaction(
        self, read: AuditedRead, route: AuditRoute, statement: str
    ) -> Sequence[Any]:
        """The routes of :meth:`audited` that need a transaction or a second statement."""
        user = read.user
        if route is AuditRoute.AFTER:
            async with self.read(user, transaction=read.settings is not None) as conn:
                rows = await _read_rows(conn, statement, read)
            if read.audit:
                await self.insert_audit(read.audit_row(rows))
            return rows
        if route is AuditRoute.APART:
            async with self.write(users=(user,) if user else ()) as conn:
                rows = await _read_rows(conn, statement, read)
                # Not relaxed: the setting would not reach the worker that commits the row.
                row = read.audit_row(rows)
                await conn.execute(clause(q.record_recall(relax_commit=False)), row)
            return rows
        async with self.write(users=()) as conn:  # inline, after the read's settings
            return await _read_rows(conn, statement, read)

    async def insert_audit(self, row: Mapping[str, Any]) -> None:
        """Insert one recall audit row (:func:`~pgmemory.store.queries.record_recall`'s
        parameters) on the primary, holding its user's erasure lock; no read waits for it on a
        replica. Outside a unit of work: one prepared round trip, committed without waiting
        for the disk flush unless ``durable_recall_audit``; inside one, with the block."""
        relax = self.deployment.relaxes_audit(in_unit_of_work=self.in_unit_of_work)
        user = row["user_id"]
        await self.fetch(q.record_recall(relax_commit=relax), row, users=(user,) if user else ())


async def _read_rows(conn: AsyncConnection, statement: str, read: AuditedRead) -> Sequence[Any]:
    """``read``'s statement on ``conn`` (after its ``settings``), at least ``wanted`` rows."""
    if read.settings is not None:
        await conn.execute(clause(read.settings[0]), read.settings[1])
    rows = (await conn.execute(clause(statement), read.params)).mappings().all()
    if len(rows) < read.wanted:
        raise TooFewRows(f"{len(rows)} of {read.wanted} rows")
    return rows
