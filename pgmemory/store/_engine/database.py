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
:meth:`written`        a :class:`Write` (users' data),  never: a lost connection    primary; notes the
                       as :meth:`fetch` runs it, in     leaves its outcome          write for
                       the form the deployment picks;   unknown                     read-your-writes
                       queued by a deferred unit
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

Every verb takes its connections from :class:`~pgmemory.store._engine.connections.Connections`
(where the database is, its pools, the embedded server started again when it died), below it
as the unit of work is. Autocommit reads cost no BEGIN/COMMIT round trips and no ROLLBACK,
after which psycopg would drop its prepared statements.

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
from collections.abc import (
    AsyncIterator,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

import pgmemory.telemetry as telemetry
from pgmemory.errors import InvalidInputError
from pgmemory.settings import Settings
from pgmemory.store import migrate as migrations, queries as q
from pgmemory.store._engine import fastpath
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.connections import Connections
from pgmemory.store._engine.connector import (
    check_database,
    first_passes,
    is_distributed,
)
from pgmemory.store._engine.deployment import (
    AuditedRead,
    AuditRoute,
    Deployment,
    TooFewRows,
    Write,
)
from pgmemory.store._engine.driver_errors import DRIVER_ERRORS, reraise, reraise_opening
from pgmemory.store._engine.replicas import ReplicaSet
from pgmemory.store._engine.unit_of_work import SharedTransaction, locks
from pgmemory.store._ranking.candidates import FirstPass


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
        if engine is not None:
            url = engine.url.render_as_string(hide_password=False)
        self._migrate = migrate
        self._own_engine = engine is None
        #: Where the database is and every connection to it (below the verbs).
        self.connections = Connections(url, settings=settings, engine=engine, read_urls=read_urls)
        #: How this database runs what the domain asks (read when the store opens).
        self.deployment = Deployment(durable_recall_audit=settings.durable_recall_audit)
        #: The two-phase path's first passes the memories keep (binary codes, half vectors:
        #: pgvector >= 0.7; read when the store opens).
        self.first_passes: tuple[FirstPass, ...] = ()
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
        connections = self.connections
        if connections.opened and not connections.closed:
            return
        url = await connections.start()
        try:
            if self._migrate:
                await asyncio.to_thread(migrations.upgrade, url)
            engine = await connections.open_engine()
            await check_database(engine, expected_revision=migrations.head_revision())
            distributed = await is_distributed(engine)
            if distributed and self._own_engine:
                # Citus plans no generic plan of a distributed statement (connector.GENERIC_PLANS)
                engine = await connections.open_engine(generic_plans=False)
            self.first_passes = await first_passes(engine)
            connections.open_pools(distributed=distributed)
            self.deployment = Deployment(
                distributed=distributed,
                replicated=connections.replicas is not None,
                read_committed=engine.dialect.default_isolation_level == "READ COMMITTED",
                durable_recall_audit=self.settings.durable_recall_audit,
            )
        except BaseException as exc:
            await connections.release()
            if isinstance(exc, DRIVER_ERRORS):
                reraise_opening(exc, url=url, setting=connections.setting)
            raise

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (every statement then raises StoreClosedError)."""
        return self.connections.closed

    async def close(self) -> None:
        """Refuse new statements, let those in flight finish, close the pool; release the
        embedded server (stopped when no process uses it).

        Then every verb raises :class:`~pgmemory.errors.StoreClosedError`; calls in flight keep
        their connections, awaited (at most ``CLOSE_GRACE_S``) before the pool goes. A dead
        server is fine. Calling it twice, or in a forked child (the parent's pool and server
        stay the parent's: see :mod:`pgmemory.store._engine.lifecycle`), is harmless.
        """
        await self.connections.close()

    async def migrate(self) -> None:
        """Upgrade the schema to this version's head.

        Raises:
            RuntimeError: The URL is not known yet (the embedded server's is known once open).
        """
        url = self.connections.url
        if url is None:
            raise RuntimeError("open the store first (the embedded server's URL is known then)")
        try:
            await asyncio.to_thread(migrations.upgrade, url)
        except DRIVER_ERRORS as exc:
            reraise_opening(exc, url=url, setting=self.connections.setting)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL in use (password included: don't log it)."""
        url = self.connections.url
        if url is None:
            raise RuntimeError("the store is not open yet: its embedded server has no URL")
        return url

    @property
    def engine(self) -> AsyncEngine:
        """The pooled async engine."""
        return self.connections.engine

    @property
    def replicas(self) -> ReplicaSet | None:
        """The read replicas, when ``read_urls`` named any (None before opening)."""
        return self.connections.replicas

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
            conn = await self.connections.connect()
            stack.push_async_exit(conn)
            committing = False
            try:
                async with conn.begin():
                    if (held := locks(users or frozenset(), sessions)) is not None:
                        await conn.execute(*held)
                    yield conn
                    committing = True
            except DRIVER_ERRORS as exc:
                if committing:
                    reraise(exc, step="commit", outcome="unknown")
                reraise(exc, step="statement", outcome="not stored")
            await self.connections.note_write(conn, users)

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
        conn = await self.connections.for_read(user)
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
        if self.connections.replicas is None:
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
        (:meth:`written`, ``Write.deferrable``), the block sends nothing and its end commits them
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
            self.connections,
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
            conn = await self.connections.connect()
            stack.push_async_exit(conn)
            try:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")
            except DRIVER_ERRORS as exc:
                reraise(exc, step="statement", outcome=None)

    @property
    def in_unit_of_work(self) -> bool:
        """Whether the current task is inside a :meth:`unit_of_work` block."""
        return self._shared.get() is not None

    async def fetch(
        self, statement: str, params: Mapping[str, Any], *, users: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """The fast verb: ``statement`` (``:name`` parameters) and the erasure locks of
        ``users`` (held, shared, for its transaction) in one prepared round trip on the
        primary's driver connection, its rows as dicts (:mod:`pgmemory.store._engine.fastpath`):
        one implicit transaction, committed when it returns; in a :meth:`unit_of_work`, part of
        the unit's transaction (the locks it holds already not taken again). A write of users'
        data is :meth:`written` instead."""
        shared = self._shared.get()
        if shared is not None:  # its errors are the unit of work's (translated there)
            rows = await shared.fetch(statement, params, frozenset(users), frozenset())
            assert rows is not None  # only a deferrable write is queued
            return rows
        async with self.connections.driver_autocommit() as conn:
            return await fastpath.run(
                conn,
                statement,
                params,
                lock_users=tuple(users),
                prepare=self.settings.prepared_statements,
            )

    async def written(self, write: Write) -> list[dict[str, Any]] | None:
        """The fast write verb: ``write``'s statement in the form the deployment chooses
        (where locks are taken in the statement, no lock statement is sent) with the locks it
        needs, as :meth:`fetch` runs a statement; its users' write is noted for replicas, and a
        lost connection's outcome is unknown. Returns its rows, or None when a deferred unit of
        work queued it for its commit (``write.deferrable``)."""
        statement, extra, locking = self.deployment.write_statement(write.statement, write.users)
        params = {**write.params, **extra} if extra else write.params
        shared = self._shared.get()
        if shared is not None:  # its errors are the unit of work's (translated there)
            return await shared.fetch(
                statement,
                params,
                frozenset(write.users),
                frozenset(write.sessions),
                deferrable=write.deferrable,
                locking=locking,
            )
        users, sessions = ((), ()) if locking else (write.users, write.sessions)
        async with self.connections.driver_autocommit(
            wrote=True, users=frozenset(write.users)
        ) as conn:
            return await fastpath.run(
                conn,
                statement,
                params,
                lock_users=tuple(users),
                lock_sessions=tuple(sessions),
                prepare=self.settings.prepared_statements,
            )

    async def _send_deferred(
        self, writes: Sequence[fastpath.Deferred], users: frozenset[str] | None
    ) -> None:
        """A deferred unit of work's commit: its queued ``writes`` of ``users`` (None: anyone's)
        in one round trip (:func:`fastpath.run_all`)."""
        async with self.connections.driver_autocommit(
            wrote=True, users=users, step="commit"
        ) as conn:
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
