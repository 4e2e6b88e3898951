"""The store's connections: where the database is, its pools, and every connection handed out.

:class:`Connections` owns what a connection comes from: the URL (or the embedded server it
starts), the primary's pooled engine, the read replicas, and the fast path's held connections
(:mod:`pgmemory.store._engine.held`). It hands out a started SQLAlchemy connection
(:meth:`Connections.connect`), a replica's or the primary's for a read
(:meth:`Connections.for_read`) and a raw psycopg one in autocommit
(:meth:`Connections.driver_autocommit`), keeps every one of them among the leases that
closing waits for, and notes a committed write's WAL position for read-your-writes on
replicas (:meth:`Connections.note_write`).

It is below the verbs and the unit of work (:mod:`pgmemory.store._engine.database`,
:mod:`pgmemory.store._engine.unit_of_work`), which both take their connections here: nothing
here calls up into them.

Every connection is a healthy one: the pool replaces connections whose server went away (see
:func:`pgmemory.store._engine.connector.make_engine`), and when the embedded server itself is
gone, it is started again before connecting. A forked child leaves its parent's pools alone
(:mod:`pgmemory.store._engine.lifecycle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from pgmemory.errors import DatabaseNotReadyError, StoreClosedError
from pgmemory.settings import Settings
from pgmemory.store import queries as q
from pgmemory.store._engine import fastpath, lifecycle
from pgmemory.store._engine.addresses import URL_SETTING
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.connector import adopt_engine, driver_error, make_engine
from pgmemory.store._engine.driver_errors import DRIVER_ERRORS, Step, reraise
from pgmemory.store._engine.held import HeldConnections
from pgmemory.store._engine.replicas import ReplicaSet, parse_lsn
from pgmemory.store.embedded import EmbeddedServer

logger = logging.getLogger(__name__)

C = TypeVar("C")

#: Why nothing opens when no URL is set and the embedded server may not start.
NO_URL_NO_EMBEDDED = (
    "no database URL is set and the embedded server is switched off (PGMEMORY_EMBEDDED=false): "
    "set PGMEMORY_DATABASE_URL, or pass a URL or an engine"
)


class Connections:
    """Where a store's database is, and the connections to it (see the module).

    Args:
        url: A SQLAlchemy URL; None to use the embedded server under ``settings.data_dir``.
        settings: Pool sizes, timeouts, the data directory, whether an embedded server may start.
        engine: An application's own async engine (it stays the application's: closing does
            not dispose of it); ``url`` is then its URL.
        read_urls: URLs of hot standbys of the primary that serve reads.
    """

    def __init__(
        self,
        url: str | None,
        *,
        settings: Settings,
        engine: AsyncEngine | None = None,
        read_urls: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self._url = url
        self._given_engine = engine
        #: The URL in use once started (the embedded server's when no URL was given).
        self._resolved_url: str | None = url
        self._server: EmbeddedServer | None = None
        self._engine: AsyncEngine | None = None
        self._read_urls = tuple(read_urls)
        self._replicas: ReplicaSet | None = None
        self._closed = False
        #: The process the pools were made in: a forked child makes its own (see usable).
        self._pid = os.getpid()
        #: A forked child's start of its own use of the embedded server (see _after_fork).
        self._child_server: asyncio.Future[str] | None = None
        self._child_server_due = False
        #: The connections handed out, so that close() can wait for those in flight.
        self._leases: weakref.WeakSet[Any] = weakref.WeakSet()
        #: The fast path's connections kept between statements (none until open).
        self.held = HeldConnections(0)

    # --- life cycle ---------------------------------------------------------------------------

    async def start(self) -> str:
        """The URL to use: the given one, or the embedded server's, started now.

        Raises:
            DatabaseNotReadyError: No URL is set and the embedded server is switched off.
            StoreClosedError: Closed already.
        """
        if self._closed:
            raise StoreClosedError(lifecycle.CLOSED)
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
        return url

    async def open_engine(self, *, generic_plans: bool = True) -> AsyncEngine:
        """The primary's pooled engine, made (again, when ``generic_plans`` changes: Citus
        plans no generic plan of a distributed statement) or the application's adopted."""
        if self._given_engine is not None:
            self._engine = adopt_engine(self._given_engine, self.settings)
            return self._engine
        if self._engine is not None:
            await self._engine.dispose()
        assert self._resolved_url is not None, "start() first"
        self._engine = make_engine(self._resolved_url, self.settings, generic_plans=generic_plans)
        return self._engine

    def open_pools(self, *, distributed: bool) -> None:
        """With the engine open: the fast path's held connections and the read replicas.

        On an engine of its own only (an application's pool lends none), and never the whole
        pool: one connection stays for the rest of the store and the engine's users."""
        own = self._given_engine is None and self.idle_in_pool() is not None
        self.held = HeldConnections(self.settings.pool_size - 1 if own else 0)
        if self._read_urls:
            self._replicas = ReplicaSet(
                self._read_urls, self.settings, generic_plans=not distributed
            )

    @property
    def opened(self) -> bool:
        """Whether the engine is open."""
        return self._engine is not None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (every connection then raises StoreClosedError)."""
        return self._closed

    async def close(self) -> None:
        """Refuse new connections, let those in flight come back (at most ``CLOSE_GRACE_S``),
        close the pools, release the embedded server (see ``Database.close``)."""
        if self._closed:
            return
        self._closed = True
        if self._pid != os.getpid():
            self._after_fork()
        await self.held.close()
        await lifecycle.wait_returned(self._leases, lifecycle.CLOSE_GRACE_S)
        await self.release()

    async def release(self) -> None:
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

    @property
    def url(self) -> str | None:
        """The URL in use (None before an embedded server started; password included)."""
        return self._resolved_url

    @property
    def engine(self) -> AsyncEngine:
        """The primary's pooled async engine."""
        self.usable()
        if self._engine is None:
            raise RuntimeError("the store is not open: use `async with MemoryStore(...)`")
        return self._engine

    @property
    def replicas(self) -> ReplicaSet | None:
        """The read replicas, when ``read_urls`` named any (None before opening)."""
        return self._replicas

    # --- connections --------------------------------------------------------------------------

    def usable(self) -> None:
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
        self.held.leave_to_parent()
        self._leases = weakref.WeakSet()
        if self._server is not None:
            lifecycle.keep_inherited(self._server)
            self._server = EmbeddedServer(self._server.data_dir)
            self._child_server, self._child_server_due = None, True

    async def for_read(self, user: str | None) -> AsyncConnection:
        """A started connection for a read of ``user``'s data: a replica's when one may serve
        it (see :meth:`pgmemory.store._engine.replicas.ReplicaSet.acquire`), else the
        primary's (the caller closes it)."""
        if self._replicas is not None:
            self.usable()
            conn = await self._replicas.acquire(user)
            if conn is not None:
                self._leases.add(conn)
                return conn
        return await self.connect()

    async def connect(self) -> AsyncConnection:
        """A started pooled connection (the caller closes it); see :meth:`_checkout`.

        When the pool has no idle connection left, one the fast path holds goes back to it
        first, so that no statement of the store waits for a connection that sits idle."""
        if len(self.held) and self.idle_in_pool() == 0:
            await self.held.release_one()
        return await self._checkout(self.engine.connect)

    def idle_in_pool(self) -> int | None:
        """How many connections wait idle in the primary's pool (None: a pool that does not
        say, which then lends none to the fast path)."""
        engine = self._engine
        checkedin = None if engine is None else getattr(engine.sync_engine.pool, "checkedin", None)
        return checkedin() if callable(checkedin) else None

    async def _checkout(self, connect: Callable[[], Awaitable[C]]) -> C:
        """A connection from ``connect`` (the pool's: a started ``AsyncConnection``, or a raw
        pooled one), kept among the leases that close() waits for.

        The pool has already replaced connections whose server went away; when no new one can
        be made and the embedded server is ours, that server is started again (it died) and
        the connection made once more.
        """
        self.usable()
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
                setting=self.setting,
            )
        self._leases.add(conn)
        return conn

    @property
    def setting(self) -> str:
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
        """A pooled connection's own psycopg connection, in autocommit: what
        :meth:`Database.fetch <pgmemory.store._engine.database.Database.fetch>` runs on, skipping SQLAlchemy's statement handling (:mod:`pgmemory.store._engine.fastpath`).

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
        self.usable()
        taken = await self.held.take()
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
                    kept = self.held.keep(pooled, driver, leased_at)
                    if not kept:
                        try:
                            await driver.set_autocommit(False)
                        except psycopg.Error:  # e.g. cancelled mid-statement: not reusable
                            await greenlet_spawn(pooled.invalidate)
        finally:
            if not kept and pooled.is_valid:
                await greenlet_spawn(pooled.close)

    async def note_write(
        self, conn: AsyncConnection | psycopg.AsyncConnection[Any], users: frozenset[str] | None
    ) -> None:
        """After a commit on ``conn`` (SQLAlchemy's, or a driver connection in autocommit):
        remember the primary's WAL position for ``users``' reads.

        Only with replicas, and only for transactions that name users or none (``users``; None: anyone's); one round trip, in autocommit. If the position cannot be read,
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
