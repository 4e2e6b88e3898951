"""What a store does when it closes, and in a process forked after it was opened.

A store is closed once: from then on every call raises
:class:`~pgmemory.errors.StoreClosedError`, and the calls in flight are let finish (their
connections come back) for at most :data:`CLOSE_GRACE_S` before the pool goes.

A process forked from one that opened a store inherits its pools, whose connections are the
parent's sockets: using one from two processes mixes their conversations, and closing one ends
the parent's. The child therefore replaces each pool without closing it (SQLAlchemy's
``dispose(close=False)``, meant for this) and keeps what it inherited referenced, so that
nothing of it is collected (and closed) in the child.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection

from pgmemory.errors import StoreClosedError
from pgmemory.store._engine.retry import retried_read

logger = logging.getLogger(__name__)

#: Seconds a close waits for the connections of calls in flight to come back (the default
#: statement timeout: by then a call in flight has usually been answered by its database).
CLOSE_GRACE_S = 30.0
#: The message of StoreClosedError for a call made after close().
CLOSED = (
    "the store is closed: close() was called, and a closed store cannot be used again; open a "
    "new store (and close it once, at shut-down, after its last call)"
)
#: What forked children inherited and must neither use nor close, kept from collection.
_INHERITED: list[object] = []


def keep_inherited(thing: object) -> None:
    """Keep something a forked child inherited (a pool, an event loop) from being collected:
    collecting it would close what the parent still uses."""
    _INHERITED.append(thing)


def leave_pools_to_parent(engines: Iterable[AsyncEngine]) -> None:
    """In a forked child: give each engine a fresh pool, leaving the parent's connections
    untouched (neither used nor closed)."""
    for engine in engines:
        keep_inherited(engine.sync_engine.pool)
        engine.sync_engine.dispose(close=False)


def returned(conn: AsyncConnection | PoolProxiedConnection) -> bool:
    """Whether a connection handed out is back: a SQLAlchemy connection closed, or a raw
    pooled one checked in (or invalidated), which leaves it no DB-API connection."""
    if isinstance(conn, AsyncConnection):
        return conn.closed
    return conn.dbapi_connection is None


async def wait_returned(
    connections: Iterable[AsyncConnection | PoolProxiedConnection], grace_s: float
) -> None:
    """Wait until every connection handed out is closed (returned), at most ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while not all(returned(conn) for conn in list(connections)):
        if time.monotonic() > deadline:
            logger.warning("closing the store while calls still hold connections")
            return
        await asyncio.sleep(0.01)


def refuse_when_closed(cls: type, closed: Callable[[Any], bool], *, keep: Iterable[str]) -> None:
    """Make every public coroutine method of ``cls`` (but ``keep``'s) raise StoreClosedError
    when ``closed(self)`` is true, before doing anything: what a call would otherwise do
    after a close depends on its caches (a cached collection needs no database). A
    :func:`~pgmemory.store._engine.retry.retried_read` method gets one wrapper that does both (one
    frame on the stack of each read, not two)."""
    kept = set(keep)

    def check(self: Any) -> None:
        if closed(self):
            raise StoreClosedError(CLOSED)

    for name, method in list(vars(cls).items()):
        if name.startswith("_") or name in kept or not inspect.iscoroutinefunction(method):
            continue
        reader = getattr(method, "__retried_read__", None)
        if reader is not None:
            setattr(cls, name, retried_read(reader, check=check))
        else:
            setattr(cls, name, _refusing(method, check))


def _refusing(
    method: Callable[..., Coroutine[Any, Any, Any]], check: Callable[[Any], None]
) -> Callable[..., Coroutine[Any, Any, Any]]:
    @functools.wraps(method)
    async def checked(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        check(self)
        return await method(self, *args, **kwargs)

    return checked
