"""Micro-batching: the texts of concurrent ``embed()`` calls go through the model together.

A local model embeds a batch of 32 short texts for a fraction of what 32 separate calls cost
(the weights are streamed through the CPU once per batch, not once per text). A web server
embeds one short query per request, from many requests at once; :class:`BatchingEmbedder`
turns those concurrent one-text calls into one model call, run on a dedicated worker thread
so the event loop never blocks and the model is only ever used from one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pgmemory.embedders.base import Embedder, WrappingEmbedder, as_matrix
from pgmemory.errors import InvalidInputError

#: A batch that ended longer ago than this (seconds) says nothing about the load any more.
_RECENT_S = 1.0
#: How often (seconds) the worker checks that the event loop of an async-only inner
#: embedder's call is still alive.
_LOOP_CHECK_S = 1.0


class _Request:
    """One ``embed()`` call waiting for its vectors, and the event loop it waits on."""

    __slots__ = ("future", "loop", "texts")

    def __init__(
        self, texts: list[str], loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]
    ) -> None:
        self.texts = texts
        self.loop = loop
        self.future = future


def _deliver(requests: list[_Request], outcome: np.ndarray | BaseException, rows: Any) -> None:
    """On the callers' event loop: give each caller its rows, or the exception."""
    for request, index in zip(requests, rows, strict=True):
        if request.future.done():  # cancelled meanwhile
            continue
        if isinstance(outcome, asyncio.CancelledError):
            request.future.cancel()
        elif isinstance(outcome, BaseException):
            request.future.set_exception(outcome)
        elif index is None:
            request.future.set_result(outcome)
        else:
            request.future.set_result(outcome[index])


class BatchingEmbedder(WrappingEmbedder):
    """Gathers the texts of concurrent :meth:`embed` calls into one model call.

    One worker thread owns the model. A call that finds it idle is embedded at once; calls
    that arrive while a batch runs queue up, and the worker takes them all as its next batch
    the moment it is free (up to ``max_batch`` texts per model call), without waiting for the
    event loop. Only when the previous batch served several callers within the last second
    (the server is busy) does an idle worker linger up to ``wait_ms`` for company, or until
    ``max_batch`` texts are waiting. A lone client therefore never waits.

    The worker runs the inner embedder's blocking ``embed_sync(texts)`` when it has one, as
    the local embedders do; an inner embedder with only an async ``embed()`` is run on the
    event loop of the batch's callers (a batch then holds calls from one loop only).
    Identical texts in a batch are embedded once. Results are the inner embedder's, row for
    row: every text is embedded independently of its batch-mates.

    If the model call fails, every caller of that batch gets the exception. A caller
    cancelled while queued is dropped from the queue; one cancelled while its batch runs is
    simply not answered. Put a :class:`~pgmemory.embedders.cache.CachedEmbedder` in front (as
    :func:`~pgmemory.embedders.factory.make_embedder` does) so repeated texts cost nothing.
    One instance may serve several event loops and threads.

    ``batches``, ``texts`` and ``largest_batch`` count model calls and the texts sent to them,
    for tests and tuning.

    Args:
        inner: the embedder that does the work (a local model, usually).
        max_batch: most texts per model call (a single call with more goes alone, whole).
        wait_ms: longest an idle worker waits for company when the server is busy; 0 never
            waits.

    Raises:
        InvalidInputError: ``max_batch`` is below 1 or ``wait_ms`` is negative.
    """

    def __init__(self, inner: Embedder, *, max_batch: int = 32, wait_ms: float = 2.0) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidInputError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not wait_ms >= 0:
            raise InvalidInputError(f"wait_ms must be >= 0, got {wait_ms!r}")
        super().__init__(inner)
        self.max_batch = max_batch
        self.wait_ms = float(wait_ms)
        sync = getattr(inner, "embed_sync", None)
        self._sync: Callable[[list[str]], Any] | None = sync if callable(sync) else None
        self._cond = threading.Condition(threading.Lock())
        self._pending: deque[_Request] = deque()
        self._pending_texts = 0
        self._busy = False  # the worker is taking or running batches
        self._worker: threading.Thread | None = None
        self._last_batch_requests = 0
        self._last_batch_end = 0.0
        self.batches = 0
        self.texts = 0
        self.largest_batch = 0

    def __repr__(self) -> str:
        return (
            f"BatchingEmbedder({self.inner!r}, max_batch={self.max_batch}, "
            f"wait_ms={self.wait_ms:g})"
        )

    # --- public API -------------------------------------------------------------------------

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch, together with whatever other callers are embedding now.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), dimensions)`` float32 array, row ``i`` the vector of ``texts[i]``.

        Raises:
            InvalidInputError: ``texts`` is a bare string or holds a non-string.
            EmbeddingError: the model failed on the batch this call was part of.
        """
        if isinstance(texts, (str, bytes)):
            raise InvalidInputError("texts must be a sequence of strings, not a single string")
        items = list(texts)
        for position, text in enumerate(items):
            if not isinstance(text, str):
                raise InvalidInputError(f"texts[{position}] is {type(text).__name__}, expected str")
        if not items:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        loop = asyncio.get_running_loop()
        request = _Request(items, loop, loop.create_future())
        with self._cond:
            self._pending.append(request)
            self._pending_texts += len(items)
            self._busy = True
            self._start_worker()
            self._cond.notify()
        try:
            result: np.ndarray = await request.future
        except asyncio.CancelledError:
            # Still queued: take it out, so the model does not embed texts nobody waits for.
            with self._cond, contextlib.suppress(ValueError):
                self._pending.remove(request)
                self._pending_texts -= len(items)
            raise
        return result

    async def warm_up(self) -> None:
        """Load the model and run one tiny batch on the worker thread, so no caller pays later.

        Call it once at start-up (e.g. in a web application's lifespan).

        Raises:
            EmbeddingError: the model could not be loaded or run.
        """
        if self._sync is None:
            from pgmemory.embedders.base import warm_up

            await warm_up(self.inner)
            return
        await self.embed(["warm-up"])

    # --- the worker thread ------------------------------------------------------------------

    def _start_worker(self) -> None:
        """Start the worker thread unless it runs (holding the lock; e.g. not after a fork)."""
        if self._worker is None or not self._worker.is_alive():
            # A daemon: an idle worker must never keep the interpreter from exiting.
            self._worker = threading.Thread(target=self._work, name="pgmemory-embed", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        """Take batches and run them, for as long as the thread lives."""
        while True:
            with self._cond:
                idle = False
                while not self._busy:
                    idle = True
                    self._cond.wait()
                if idle:
                    self._linger()
                batch = self._take()
                if not batch:
                    self._busy = False
                    continue
            self._run(batch)

    def _linger(self) -> None:
        """Back from idle but busy lately: wait up to ``wait_ms`` for a full batch.

        Called holding the lock, only when the worker was idle: calls that queued up while a
        batch ran never wait for more company.
        """
        if (
            self.wait_ms <= 0
            or self._last_batch_requests <= 1
            or time.monotonic() - self._last_batch_end >= _RECENT_S
        ):
            return
        self._cond.wait_for(
            lambda: self._pending_texts >= self.max_batch, timeout=self.wait_ms / 1000.0
        )

    def _take(self) -> list[_Request]:
        """The oldest waiting calls, up to ``max_batch`` texts (holding the lock).

        At least one call (even if it alone exceeds ``max_batch``); with an async-only inner
        embedder, only calls from the first call's event loop.
        """
        batch: list[_Request] = []
        size = 0
        skipped: list[_Request] = []
        while self._pending:
            request = self._pending[0]
            if batch and size + len(request.texts) > self.max_batch:
                break
            self._pending.popleft()
            if request.future.done():  # cancelled while queued
                self._pending_texts -= len(request.texts)
                continue
            if self._sync is None and batch and request.loop is not batch[0].loop:
                skipped.append(request)
                continue
            self._pending_texts -= len(request.texts)
            batch.append(request)
            size += len(request.texts)
        self._pending.extendleft(reversed(skipped))
        return batch

    def _run(self, batch: list[_Request]) -> None:
        """One model call for the whole batch; each caller gets its rows or the exception."""
        unique = list(dict.fromkeys(text for request in batch for text in request.texts))
        outcome: np.ndarray | BaseException
        try:
            vectors = self._call(unique, batch[0].loop)
            outcome = as_matrix(
                vectors, rows=len(unique), dimensions=self.dimensions, model_id=self.model_id
            )
        except BaseException as exc:  # handed to every caller of the batch
            outcome = exc
        else:
            self.batches += 1
            self.texts += len(unique)
            self.largest_batch = max(self.largest_batch, len(unique))
        with self._cond:
            self._last_batch_requests = len(batch)
            self._last_batch_end = time.monotonic()
        rows: dict[asyncio.AbstractEventLoop, tuple[list[_Request], list[Any]]] = {}
        if isinstance(outcome, BaseException) or (
            len(batch) == 1 and len(unique) == len(batch[0].texts)
        ):
            for request in batch:
                group = rows.setdefault(request.loop, ([], []))
                group[0].append(request)
                group[1].append(None)
        else:
            # Each caller gets its own rows (a copy: a view would keep the whole batch alive).
            position = {text: i for i, text in enumerate(unique)}
            for request in batch:
                group = rows.setdefault(request.loop, ([], []))
                group[0].append(request)
                group[1].append([position[text] for text in request.texts])
        for loop, (requests, indices) in rows.items():
            with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody waits
                loop.call_soon_threadsafe(_deliver, requests, outcome, indices)

    def _call(self, texts: list[str], loop: asyncio.AbstractEventLoop) -> Any:
        """Run the model on ``texts`` (worker thread side)."""
        if self._sync is not None:
            return self._sync(texts)
        future = asyncio.run_coroutine_threadsafe(self._embed_async(texts), loop)
        while True:
            try:
                return future.result(timeout=_LOOP_CHECK_S)
            except concurrent.futures.TimeoutError:
                if loop.is_closed():
                    future.cancel()
                    raise asyncio.CancelledError from None

    async def _embed_async(self, texts: list[str]) -> np.ndarray:
        """The inner embedder's async ``embed`` (a coroutine for ``run_coroutine_threadsafe``)."""
        return await self.inner.embed(texts)


__all__ = ["BatchingEmbedder"]
