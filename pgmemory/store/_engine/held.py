"""The fast path's held connections: pooled connections kept between statements, in autocommit.

Checking a connection out of SQLAlchemy's pool and back in costs a small search about a tenth
of a millisecond: the pool's bookkeeping and events, run through a greenlet each way, its
reset on return, and autocommit switched on and off. :meth:`Connections.driver_autocommit
<pgmemory.store._engine.connections.Connections.driver_autocommit>` therefore keeps the connections it is
done with here, still checked out and in autocommit, and hands them to the next statement.

What keeps that safe for everything else the pool serves:

* at most :attr:`HeldConnections.capacity` are held (the pool's size less one, so a pool of
  one holds none), and only on an engine pgmemory made: an application's own engine lends none;
* before any other checkout of the store finds no idle connection in the pool, one held
  connection goes back first (:meth:`HeldConnections.release_one`);
* a connection idle here for :data:`IDLE_S` goes back to the pool, so code using the engine
  itself waits at most that long for one;
* a connection held for :data:`LEASE_S` in all goes back to the pool at its next return, so
  the pool's recycling and checkout checks apply to it as to any other;
* a held connection that was closed, broke, or whose socket turned readable (its server ended
  the session, or said something) is taken by none: it goes back to the pool, whose checkout
  check pings or replaces it, or is invalidated when it is already lost;
* a store closing returns them all; a forked child never touches its parent's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from pgmemory.store._engine import lifecycle
from pgmemory.store._engine.connector import socket_readable

#: Seconds a held connection may stay idle before it goes back to the pool.
IDLE_S = 1.0
#: Seconds a connection may stay checked out for the fast path before it goes back to the pool
#: (which may then recycle it: ``pool_recycle``).
LEASE_S = 60.0


@dataclass(slots=True)
class _Held:
    pooled: PoolProxiedConnection
    #: ``pooled``'s psycopg connection (kept: SQLAlchemy's property is a chain of lookups).
    driver: psycopg.AsyncConnection[Any]
    leased_at: float
    idle_since: float


class HeldConnections:
    """The idle fast-path connections of one pool, newest first out.

    Args:
        capacity: How many it may hold (0: none, every statement checks out of the pool).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, 0)
        self._idle: list[_Held] = []
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._trimming: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._idle)

    async def take(
        self,
    ) -> tuple[PoolProxiedConnection, psycopg.AsyncConnection[Any], float] | None:
        """A healthy held connection (in autocommit), its psycopg connection and when it was
        checked out of the pool, or None when there is none."""
        while self._idle:
            held = self._idle.pop()
            driver = held.driver
            if driver.closed or driver.broken:
                await greenlet_spawn(held.pooled.invalidate)
                continue
            try:
                readable = socket_readable(driver.pgconn.socket)
            except psycopg.OperationalError:
                await greenlet_spawn(held.pooled.invalidate)
                continue
            if readable:
                await _release(held.pooled)
                continue
            return held.pooled, driver, held.leased_at
        return None

    def keep(
        self,
        pooled: PoolProxiedConnection,
        driver: psycopg.AsyncConnection[Any],
        leased_at: float,
    ) -> bool:
        """Hold ``pooled`` (a connection the fast path is done with; ``driver`` its psycopg
        connection) if it may be held: idle, in autocommit, within its lease, and while there
        is room. Returns whether it was."""
        now = time.monotonic()
        if (
            self._closed
            or len(self._idle) >= self.capacity
            or now - leased_at > LEASE_S
            or driver.closed
            or not driver.autocommit
            # the status from libpq itself (``driver.info`` makes an object per call)
            or driver.pgconn.transaction_status != TransactionStatus.IDLE
        ):
            return False
        self._idle.append(_Held(pooled, driver, leased_at, now))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(IDLE_S, self._trim_soon)
        return True

    async def release_one(self) -> None:
        """Give the connection idle longest back to the pool (another checkout needs one)."""
        if self._idle:
            await _release(self._idle.pop(0).pooled)

    async def close(self) -> None:
        """Hold nothing from now on; give every held connection back to the pool."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        idle, self._idle = self._idle, []
        for held in idle:
            await _release(held.pooled)

    def leave_to_parent(self) -> None:
        """In a forked child: forget the held connections (the parent's) without closing them,
        and keep them referenced so that nothing of them is collected and closed here."""
        lifecycle.keep_inherited(self._idle)
        self._idle = []
        self._timer = None
        self._trimming = set()

    def _trim_soon(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self._trim())
        self._trimming.add(task)
        task.add_done_callback(self._trimming.discard)

    async def _trim(self) -> None:
        """Give the connections idle for IDLE_S back to the pool; look again later if any stay."""
        now = time.monotonic()
        stale = [held for held in self._idle if now - held.idle_since >= IDLE_S]
        self._idle = [held for held in self._idle if now - held.idle_since < IDLE_S]
        for held in stale:
            await _release(held.pooled)
        if self._idle and self._timer is None and not self._closed:
            wait = IDLE_S - (time.monotonic() - self._idle[0].idle_since)
            self._timer = asyncio.get_running_loop().call_later(max(wait, 0.0), self._trim_soon)


async def _release(pooled: PoolProxiedConnection) -> None:
    """Back to the pool, out of autocommit as the pool's connections are (invalidated when that
    fails: the connection is lost)."""
    driver: Any = pooled.driver_connection
    try:
        await driver.set_autocommit(False)
    except psycopg.Error:
        await greenlet_spawn(pooled.invalidate)
        return
    await greenlet_spawn(pooled.close)
