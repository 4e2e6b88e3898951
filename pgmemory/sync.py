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
import threading
from collections.abc import Awaitable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

from pgmemory.admin.admin import Admin
from pgmemory.errors import PgMemoryError
from pgmemory.store.store import MemoryStore
from pgmemory.sync_generated import SyncAdminMethods, SyncMemoryStoreMethods

if TYPE_CHECKING:
    from types import TracebackType

    from pgmemory.settings import Settings

T = TypeVar("T")


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


class _LoopThread:
    """An event loop running forever in a daemon thread; coroutines are submitted to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="pgmemory-sync-loop", daemon=True
        )
        self._thread.start()

    def run(self, awaitable: Awaitable[T], /) -> T:
        """Run ``awaitable`` on the loop and wait for its result (or exception) in this thread."""
        if threading.current_thread() is self._thread:
            if isinstance(awaitable, Coroutine):
                awaitable.close()
            raise PgMemoryError(
                "a SyncMemoryStore method was called from inside its own event loop: use the "
                "async MemoryStore in async code"
            )
        future: Future[T] = asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop)
        return future.result()

    def stop(self) -> None:
        """Stop the loop, join the thread, close the loop."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


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
        """The event loop the store runs on."""
        return self._portal.loop

    def open(self) -> SyncMemoryStore:
        """Connect (starting the embedded server if needed); see :meth:`MemoryStore.open`."""
        self._portal.run(self.async_store.open())
        return self

    def close(self) -> None:
        """Close the store, then stop the background loop. Calling it twice is harmless."""
        if self._portal.loop.is_closed():
            return
        try:
            self._portal.run(self.async_store.close())
        finally:
            self._portal.stop()

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
