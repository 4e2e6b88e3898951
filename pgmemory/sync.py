"""A synchronous face over :class:`~pgmemory.MemoryStore`, for WSGI apps, scripts and notebooks.

:class:`SyncMemoryStore` takes the same arguments and has the same methods as ``MemoryStore``,
each blocking until done. It owns one event loop running in a background thread, and every call,
from any thread, is submitted to that loop: one facade is safe to share across the threads of a
Django, Flask or gunicorn worker, and its connection pool and embedder are shared by all of them.
Nothing is implemented twice: each blocking method, generated into :mod:`pgmemory.sync_generated`
by ``python -m pgmemory._sync_gen``, is a typed ``def`` with the async method's signature whose
body runs the async store's own method on that loop. The life cycle is written here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Coroutine
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any, TypeVar

from pgmemory.admin.admin import Admin
from pgmemory.errors import PgMemoryError, StoreClosedError
from pgmemory.store._engine import lifecycle
from pgmemory.store.store import MemoryStore
from pgmemory.sync_generated import SyncAdminMethods, SyncMemoryStoreMethods

if TYPE_CHECKING:
    from types import TracebackType

    from pgmemory.settings import Settings

T = TypeVar("T")


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


#: Held by a forked child while it makes its own loops (a child begins with one thread; this
#: lock is only ever taken in children, so a fork cannot leave it held).
_FORK_LOCK = threading.Lock()
#: Seconds close() waits for the loop to cancel what remains, and for its thread to end.
_STOP_TIMEOUT_S = 10.0


class _LoopThread:
    """An event loop running forever in a daemon thread; coroutines are submitted to it.

    It knows the calls in flight, so that :meth:`close` answers each of them, and the process
    it was made in: in a forked child (the parent's loop thread does not exist there) the
    first call makes a fresh loop and thread. The check is a pid comparison on each call
    rather than an ``os.register_at_fork`` hook: it sees every fork (servers such as uWSGI
    fork from C), costs one system call next to a database round trip, and does the work
    lazily, in the children that use the store, never inside the fork itself.
    """

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._calls: set[Future[Any]] = set()
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pgmemory-sync-loop", daemon=True
        )
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """This process's loop (a forked child's own)."""
        self._adopt()
        return self._loop

    @property
    def closed(self) -> bool:
        return self._closed

    def _adopt(self) -> None:
        """In a forked child: a fresh loop and thread. The parent's loop is kept, never closed:
        its selector and wake-up socket are the parent's too, and closing them here would
        unregister them from the parent's loop."""
        if self._pid == os.getpid():
            return
        with _FORK_LOCK:
            if self._pid == os.getpid():
                return
            lifecycle.keep_inherited((self._loop, self._thread, self._calls))
            self._lock = threading.Lock()
            self._calls = set()
            self._start()
            self._pid = os.getpid()

    def run(self, awaitable: Awaitable[T], /) -> T:
        """Run ``awaitable`` on the loop and wait for its result (or exception) in this thread.

        Raises:
            StoreClosedError: The store was closed before the call, or while it ran.
        """
        self._adopt()
        if threading.current_thread() is self._thread:
            _discard(awaitable)
            raise PgMemoryError(
                "a SyncMemoryStore method was called from inside its own event loop: use the "
                "async MemoryStore in async code"
            )
        with self._lock:
            if self._closed:
                _discard(awaitable)
                raise StoreClosedError(lifecycle.CLOSED)
            future = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._loop)
            self._calls.add(future)
        try:
            return future.result()
        except CancelledError:
            if not self._closed:
                raise
            raise StoreClosedError(
                "the store was closed while this call ran, and the call was cancelled (a write "
                "it made may or may not have taken effect): close the store only after its "
                "last call"
            ) from None
        finally:
            with self._lock:
                self._calls.discard(future)

    def close(self, closing: Coroutine[Any, Any, None]) -> None:
        """Refuse new calls, run ``closing`` (the store's close, which lets calls holding
        connections finish), cancel the calls still in flight (each raises StoreClosedError),
        then stop the loop and its thread. Calling it twice is harmless."""
        self._adopt()
        if threading.current_thread() is self._thread:
            closing.close()
            raise PgMemoryError("a SyncMemoryStore cannot be closed from inside its own loop")
        with self._lock:
            if self._closed:
                closing.close()
                return
            self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(closing, self._loop).result(
                timeout=lifecycle.CLOSE_GRACE_S + _STOP_TIMEOUT_S
            )
        finally:
            with self._lock:
                calls = list(self._calls)
            for call in calls:
                call.cancel()
            self._stop()

    def _stop(self) -> None:
        """Let cancelled calls unwind, stop the loop, join the thread, close the loop."""
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_others(), self._loop).result(
                timeout=_STOP_TIMEOUT_S
            )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=_STOP_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()


def _discard(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will not run (no "never awaited" warning)."""
    if isinstance(awaitable, Coroutine):
        awaitable.close()


async def _cancel_others() -> None:
    """Cancel every other task of the running loop and wait for them (a bounded wait: the
    caller times it out)."""
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class SyncMemoryStore(SyncMemoryStoreMethods):
    """:class:`~pgmemory.MemoryStore` with blocking methods, safe to share across threads.

    Use it as a context manager, or call :meth:`open` once at start-up and :meth:`close` at
    shut-down::

        with SyncMemoryStore(migrate=True) as store:
            store.create_collection("chat")
            store.add("chat", [MemoryRecord(content="I can't eat spicy food",
                                            scope=MemoryScope(user_id="alice"))])
            hits = store.search("chat", MemoryScope(user_id="alice"), query="order food")

    Args:
        *args: passed to :class:`~pgmemory.MemoryStore` (the database URL).
        **kwargs: passed to :class:`~pgmemory.MemoryStore` (``settings``, ``embedder``,
            ``migrate``, ...).
    """

    _portal: _LoopThread

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._portal = _LoopThread()
        #: The async store every call runs on (usable from async code on ``loop`` only).
        self.async_store = MemoryStore(*args, **kwargs)

    @property
    def settings(self) -> Settings:
        """The async store's :attr:`~MemoryStore.settings`."""
        return self.async_store.settings

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the store runs on (in a process forked after opening, its own)."""
        return self._portal.loop

    def open(self) -> SyncMemoryStore:
        """Connect (starting the embedded server if needed); see :meth:`MemoryStore.open`."""
        self._portal.run(self.async_store.open())
        return self

    def close(self) -> None:
        """Close the store for good, then stop the background loop.

        Later calls raise :class:`~pgmemory.errors.StoreClosedError`. Calls in flight are
        answered: those holding a database connection may finish (for at most
        ``lifecycle.CLOSE_GRACE_S``), the others are cancelled and raise StoreClosedError.
        Calling it twice is harmless; in a process forked after opening, it closes only that
        process's pool and loop (the parent's stay the parent's).
        """
        self._portal.close(self.async_store.close())

    def shared_transaction(self) -> None:
        """Not available on the sync face: blocking calls run one by one on the background
        loop, so they cannot join one transaction. Use :meth:`MemoryStore.shared_transaction`
        from async code (``self.async_store`` on ``self.loop``).

        Raises:
            PgMemoryError: Always.
        """
        raise PgMemoryError(
            "SyncMemoryStore has no shared_transaction(): its blocking calls cannot join one "
            "transaction; use MemoryStore.shared_transaction() from async code"
        )

    def __enter__(self) -> SyncMemoryStore:
        return self.open()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SyncAdmin(SyncAdminMethods):
    """:class:`~pgmemory.admin.Admin` with blocking methods, on a :class:`SyncMemoryStore`'s
    loop (for WSGI apps, scripts and notebooks)::

        with SyncMemoryStore() as store:
            report = SyncAdmin(store).verify_audit()

    Args:
        store: The sync store whose database and event loop it uses.
    """

    _portal: _LoopThread

    def __init__(self, store: SyncMemoryStore) -> None:
        self._portal = store._portal
        #: The async admin plane every call runs on.
        self.async_admin = Admin(store.async_store)


__all__ = ["SyncAdmin", "SyncMemoryStore"]
