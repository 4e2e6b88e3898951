"""Micro-batching: the texts of concurrent ``embed()`` calls go through the model together.

A local model embeds a batch of 32 short texts for a fraction of what 32 separate calls cost
(the weights are streamed through the CPU once per batch, not once per text). A web server
embeds one short query per request, from many requests at once; :class:`BatchingEmbedder`
turns those concurrent one-text calls into one model call, run on a dedicated worker thread
so the event loop never blocks and the model is only ever used from one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pgmemory.embedders.base import Embedder, as_matrix
from pgmemory.errors import InvalidInputError

#: A batch that ended longer ago than this (seconds) says nothing about the load any more.
_RECENT_S = 1.0


class _Request:
    """One ``embed()`` call waiting for its vectors."""

    __slots__ = ("future", "texts")

    def __init__(self, texts: list[str], future: asyncio.Future[np.ndarray]) -> None:
        self.texts = texts
        self.future = future


class _Queue:
    """One event loop's waiting requests and the task that feeds them to the model."""

    __slots__ = (
        "full",
        "last_batch_end",
        "last_batch_requests",
        "pending",
        "pending_texts",
        "task",
    )

    def __init__(self) -> None:
        self.pending: deque[_Request] = deque()
        self.pending_texts = 0
        self.task: asyncio.Task[None] | None = None
        self.full: asyncio.Future[None] | None = None
        self.last_batch_requests = 0
        self.last_batch_end = 0.0


def _release(future: asyncio.Future[None]) -> None:
    """Wake the dispatcher lingering on ``future`` (the wait window is over)."""
    if not future.done():
        future.set_result(None)


class BatchingEmbedder:
    """Gathers the texts of concurrent :meth:`embed` calls into one model call.

    The first call to arrive while the model is idle is dispatched at once (on the next turn
    of the event loop, so calls made in the same turn join it) — unless the previous batch
    served several callers within the last second: under load the dispatcher then lingers up
    to ``wait_ms`` for more callers, or until ``max_batch`` texts are waiting. Calls that
    arrive while a batch runs wait for it to finish and then go together, up to ``max_batch``
    texts per model call. A lone client therefore never waits: its calls never find company.

    The model runs on one dedicated worker thread (never on the event loop) through the inner
    embedder's blocking ``embed_sync(texts)`` when it has one, as the local embedders do;
    otherwise the inner ``embed()`` is awaited with the whole batch. Identical texts in a
    batch are embedded once. Results are the inner embedder's, row for row: every text is
    embedded independently of its batch-mates.

    If the model call fails, every caller of that batch gets the exception. A caller
    cancelled while waiting is dropped from the queue; one cancelled while its batch runs is
    simply not answered. Put a :class:`~pgmemory.embedders.cache.CachedEmbedder` in front
    (as :func:`~pgmemory.embedders.factory.make_embedder` does) so repeated texts cost
    nothing.

    ``batches``, ``texts`` and ``largest_batch`` count model calls and the texts sent to them,
    for tests and tuning.

    Args:
        inner: the embedder that does the work (a local model, usually).
        max_batch: most texts per model call (a single call with more goes alone, whole).
        wait_ms: longest a call waits for company while the model is idle and the load is
            high; 0 never waits.

    Raises:
        InvalidInputError: ``max_batch`` is below 1 or ``wait_ms`` is negative.
    """

    def __init__(self, inner: Embedder, *, max_batch: int = 32, wait_ms: float = 2.0) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidInputError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not wait_ms >= 0:
            raise InvalidInputError(f"wait_ms must be >= 0, got {wait_ms!r}")
        self.inner = inner
        self.max_batch = max_batch
        self.wait_ms = float(wait_ms)
        sync = getattr(inner, "embed_sync", None)
        self._sync: Callable[[list[str]], Any] | None = sync if callable(sync) else None
        self._executor: ThreadPoolExecutor | None = None
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Queue] = (
            weakref.WeakKeyDictionary()
        )
        self.batches = 0
        self.texts = 0
        self.largest_batch = 0

    @property
    def model_id(self) -> str:
        """The inner embedder's model id."""
        return self.inner.model_id

    @property
    def dimensions(self) -> int:
        """The inner embedder's vector length."""
        return self.inner.dimensions

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
                raise InvalidInputError(
                    f"texts[{position}] is {type(text).__name__}, expected str"
                )
        if not items:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = _Queue()
        request = _Request(items, loop.create_future())
        queue.pending.append(request)
        queue.pending_texts += len(items)
        if queue.task is None:
            queue.task = loop.create_task(self._drain(queue), name="pgmemory-embed-batcher")
        elif queue.full is not None and queue.pending_texts >= self.max_batch:
            _release(queue.full)
        try:
            return await request.future
        except asyncio.CancelledError:
            # Still queued: take it out, so the model does not embed texts nobody waits for.
            with contextlib.suppress(ValueError):
                queue.pending.remove(request)
                queue.pending_texts -= len(items)
            raise

    async def warm_up(self) -> None:
        """Load the model and run one tiny batch on the worker thread, so no caller pays later.

        Call it once at start-up (e.g. in a web application's lifespan).
        """
        if self._sync is None:
            from pgmemory.embedders.base import warm_up

            await warm_up(self.inner)
            return
        await self.embed(["warm-up"])

    def close(self) -> None:
        """Stop the worker thread once its current batch is done (it restarts if needed)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)

    # --- the dispatcher ---------------------------------------------------------------------

    async def _drain(self, queue: _Queue) -> None:
        """Feed the queue to the model, batch after batch, until nobody waits."""
        try:
            if (
                self.wait_ms > 0
                and queue.last_batch_requests > 1
                and time.monotonic() - queue.last_batch_end < _RECENT_S
            ):
                await self._linger(queue)
            while queue.pending:
                batch = self._take(queue)
                if batch:
                    await self._run(batch)
                    queue.last_batch_requests = len(batch)
                    queue.last_batch_end = time.monotonic()
        finally:
            queue.task = None
            # Only left non-empty when this task was cancelled (its event loop is closing).
            while queue.pending:
                queue.pending.popleft().future.cancel()
            queue.pending_texts = 0

    async def _linger(self, queue: _Queue) -> None:
        """Wait up to ``wait_ms`` for more callers, or until a full batch is waiting."""
        if queue.pending_texts >= self.max_batch:
            return
        loop = asyncio.get_running_loop()
        queue.full = loop.create_future()
        timer = loop.call_later(self.wait_ms / 1000.0, _release, queue.full)
        try:
            await queue.full
        finally:
            timer.cancel()
            queue.full = None

    def _take(self, queue: _Queue) -> list[_Request]:
        """The oldest waiting calls, up to ``max_batch`` texts (at least one call)."""
        batch: list[_Request] = []
        size = 0
        while queue.pending:
            request = queue.pending[0]
            if batch and size + len(request.texts) > self.max_batch:
                break
            queue.pending.popleft()
            queue.pending_texts -= len(request.texts)
            if request.future.done():  # cancelled while queued
                continue
            batch.append(request)
            size += len(request.texts)
        return batch

    async def _run(self, batch: list[_Request]) -> None:
        """One model call for the whole batch; each caller gets its rows or the error."""
        unique = list(dict.fromkeys(text for request in batch for text in request.texts))
        try:
            vectors = await self._call(unique)
        except asyncio.CancelledError:
            for request in batch:
                request.future.cancel()
            raise
        except Exception as exc:
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        self.batches += 1
        self.texts += len(unique)
        self.largest_batch = max(self.largest_batch, len(unique))
        if len(batch) == 1 and len(unique) == len(batch[0].texts):
            if not batch[0].future.done():
                batch[0].future.set_result(vectors)
            return
        # Each caller gets its own rows (a copy: a view would keep the whole batch alive).
        row = {text: i for i, text in enumerate(unique)}
        for request in batch:
            if not request.future.done():
                request.future.set_result(vectors[[row[text] for text in request.texts]])

    async def _call(self, texts: list[str]) -> np.ndarray:
        """Run the model on ``texts``: on the worker thread if the inner embedder can block."""
        if self._sync is None:
            vectors = await self.inner.embed(texts)
        else:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="pgmemory-embed"
                )
            loop = asyncio.get_running_loop()
            vectors = await loop.run_in_executor(self._executor, self._sync, texts)
        return as_matrix(
            vectors, rows=len(texts), dimensions=self.dimensions, model_id=self.model_id
        )


__all__ = ["BatchingEmbedder"]
