"""The database's fast verbs: :meth:`FastVerbs.fetch`, and the driver connection it runs on.

:class:`~pgmemory.store.database.Database` has them from :class:`FastVerbs`, its base: a
statement as one prepared round trip on psycopg (:mod:`pgmemory.store.fastpath`), on a
connection the fast path holds between statements (:mod:`pgmemory.store.held`) or one
checked out raw; in a unit of work, a statement of its shared transaction
(:class:`~pgmemory.store.unit_of_work.SharedTransaction`), or one queued for its commit.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

import pgmemory.telemetry as telemetry
from pgmemory.settings import Settings
from pgmemory.store import fastpath
from pgmemory.store.connector import driver_error
from pgmemory.store.driver_errors import DRIVER_ERRORS, Step, reraise
from pgmemory.store.held import HeldConnections
from pgmemory.store.unit_of_work import Deferred, SharedTransaction

C = TypeVar("C")
R = TypeVar("R")


class FastVerbs:
    """The fast verbs of :class:`~pgmemory.store.database.Database` (on what it holds)."""

    settings: Settings
    distributed: bool
    _held: HeldConnections
    _shared: contextvars.ContextVar[SharedTransaction | None]

    if TYPE_CHECKING:  # Database's own, which these verbs use

        @property
        def engine(self) -> AsyncEngine: ...

        def _usable(self) -> None: ...

        async def _checkout(self, connect: Callable[[], Awaitable[C]]) -> C: ...

        async def note_write(
            self,
            conn: AsyncConnection | psycopg.AsyncConnection[Any],
            users: frozenset[str] | None,
        ) -> None: ...

    @contextlib.asynccontextmanager
    async def driver_autocommit(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection's own psycopg connection, in autocommit: what :meth:`fetch` runs
        on, skipping SQLAlchemy's statement handling (:mod:`pgmemory.store.fastpath`).

        It is one the fast path held since its last statement (:mod:`pgmemory.store.held`: no
        checkout at all), or else one checked out of the pool as a raw connection (the pool's
        events, its checks and its reset on return still apply), without a SQLAlchemy
        ``Connection`` around it: that wrapper cost a small search about 0.05 ms of its ~0.9 ms.
        When done, it is held again if it may be, else it goes back to the pool.

        Errors come out as from any other statement: a psycopg error raised in the block is
        re-raised as SQLAlchemy's ``DBAPIError`` (parameters hidden). When the connection was
        lost, the pool discards it and the error is ``connection_invalidated``, so
        :func:`pgmemory.store.retry.retried_read` runs the read once more.
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
            except psycopg.Error as exc:
                error = driver_error(exc, driver, self.engine.dialect)
                if (driver.broken or driver.closed) and pooled.is_valid:
                    await greenlet_spawn(pooled.invalidate)
                raise error from exc
            except DBAPIError:  # a psycopg error the block converted (_run_driver)
                if (driver.broken or driver.closed) and pooled.is_valid:
                    await greenlet_spawn(pooled.invalidate)
                raise
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
        statement: str,
        params: Mapping[str, Any],
        *,
        users: Sequence[str] = (),
        sessions: Sequence[tuple[str, str]] = (),
        wrote: bool = False,
        deferrable: Literal[False] = False,
        locking: bool = False,
    ) -> list[dict[str, Any]]: ...

    @overload
    async def fetch(
        self,
        statement: str,
        params: Mapping[str, Any],
        *,
        users: Sequence[str] = (),
        sessions: Sequence[tuple[str, str]] = (),
        wrote: bool = False,
        deferrable: bool,
        locking: bool = False,
    ) -> list[dict[str, Any]] | None: ...

    async def fetch(
        self,
        statement: str,
        params: Mapping[str, Any],
        *,
        users: Sequence[str] = (),
        sessions: Sequence[tuple[str, str]] = (),
        wrote: bool = False,
        deferrable: bool = False,
        locking: bool = False,
    ) -> list[dict[str, Any]] | None:
        """The fast verb: ``statement`` (``:name`` parameters) and the locks it needs in one
        prepared round trip on the primary's driver connection, its rows as dicts
        (:mod:`pgmemory.store.fastpath`): one implicit transaction, committed when it returns;
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
            locking: The statement takes the locks of ``users`` and ``sessions`` itself
                (:attr:`locks_in_statement`): no lock statement is sent.
        """
        shared = self._shared.get()
        if shared is not None:  # its errors are the unit of work's (translated there)
            return await shared.fetch(
                statement, params, frozenset(users), frozenset(sessions),
                deferrable=deferrable, locking=locking,
            )  # fmt: skip
        locks: tuple[Sequence[str], Sequence[tuple[str, str]]] = (
            ((), ()) if locking else (users, sessions)
        )
        return await self._on_driver(
            lambda conn: self._run_driver(conn, statement, params, *locks),
            wrote=wrote,
            users=frozenset(users) if wrote else None,
        )

    async def _send_deferred(
        self, writes: Sequence[Deferred], users: frozenset[str] | None
    ) -> None:
        """A deferred unit of work's commit: its queued ``writes`` of ``users`` (None: anyone's)
        in one round trip (:func:`fastpath.run_all`)."""

        async def commit(conn: psycopg.AsyncConnection[Any]) -> None:
            with telemetry.sql("statement"):
                try:
                    await fastpath.run_all(
                        conn,
                        writes,
                        prepare=self.settings.prepared_statements,
                        block=self._needs_block(),
                    )
                except psycopg.Error as exc:
                    raise driver_error(exc, conn, self.engine.dialect) from exc

        await self._on_driver(commit, wrote=True, users=users, step="commit")

    def _needs_block(self) -> bool:
        """Whether a deferred unit of work's commit needs an explicit transaction block
        (:func:`fastpath.run_all`'s ``block``): on Citus, or when the server's default
        isolation (what SQLAlchemy read on its first connection) is not READ COMMITTED."""
        return self.distributed or self.engine.dialect.default_isolation_level != "READ COMMITTED"

    @property
    def locks_in_statement(self) -> bool:
        """Whether a statement of one user takes its locks itself (migration 0022: an audited
        read's erasure guard, a history append's tail, a memory insert's lock step) instead
        of a lock statement before it: on one server in READ COMMITTED. Under another
        isolation a function's query gets no fresh snapshot, and Citus takes locks on the
        coordinator."""
        return not self._needs_block()

    @property
    def guards_reads(self) -> bool:
        """Whether an audited read of a user takes the user's erasure lock in its own statement
        (the queries' ``guarded``): where :attr:`locks_in_statement`, outside a unit of work
        (the guard may refuse the read, to be run again, which a unit of work's transaction
        could not)."""
        return self.locks_in_statement and self._shared.get() is None

    async def _on_driver(
        self,
        work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[R]],
        *,
        wrote: bool,
        users: frozenset[str] | None,
        step: Step = "statement",
    ) -> R:
        """``work`` on a :meth:`driver_autocommit` connection; when it ``wrote`` (``users``'
        data; None: anyone's), the write is noted for replicas, and a lost connection leaves
        its outcome unknown (``work`` commits as it runs: never retried). Errors come out as
        :func:`~pgmemory.store.driver_errors.translated` says (``step``: what ``work`` is)."""
        try:
            async with self.driver_autocommit() as conn:
                result = await work(conn)
                if wrote:
                    await self.note_write(conn, users)
                return result
        except DRIVER_ERRORS as exc:
            reraise(exc, step=step, outcome="unknown" if wrote else None)

    async def _run_driver(
        self,
        conn: psycopg.AsyncConnection[Any],
        statement: str,
        params: Mapping[str, Any],
        users: Iterable[str],
        sessions: Iterable[tuple[str, str]],
        *,
        begin: bool = False,
    ) -> list[dict[str, Any]]:
        """One statement and its locks on a driver connection (:func:`fastpath.run`); psycopg's
        errors come out as :func:`~pgmemory.store.connector.driver_error` says."""
        with telemetry.sql("statement"):
            try:
                return await fastpath.run(
                    conn,
                    statement,
                    params,
                    lock_users=tuple(users),
                    lock_sessions=tuple(sessions),
                    begin=begin,
                    prepare=self.settings.prepared_statements,
                )
            except psycopg.Error as exc:
                raise driver_error(exc, conn, self.engine.dialect) from exc
