"""Micro-batching of concurrent embed() calls: same vectors, fewer model calls, safe failures."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from pgmemory.embedders import (
    BatchingEmbedder,
    CachedEmbedder,
    MiniLMEmbedder,
    USEEmbedder,
    make_embedder,
    warm_up,
)
from pgmemory.errors import EmbeddingError, InvalidInputError
from pgmemory.settings import Settings

WORDS = [
    "I",
    "can't",
    "eat",
    "spicy",
    "food,",
    "my",
    "sister",
    "lives",
    "in",
    "Lyon",
    "and",
    "works",
    "nights",
    "as",
    "a",
    "nurse;",
    "remind",
    "me",
    "about",
    "the",
    "quarterly",
    "budget",
    "meeting",
    "tomorrow",
    "at",
    "noon.",
    "我不能吃辣",
    "Das",
    "Wetter",
    "ist",
    "heute",
    "schön",
    "und",
    "wir",
    "gehen",
    "später",
    "in",
    "den",
    "Park",
    "spazieren.",
]


def _texts(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 60))) for _ in range(count)]


class FakeModel:
    """A blocking model: row = [text id, len(text), 1]; records each call and its thread."""

    model_id = "fake"
    dimensions = 3

    def __init__(
        self, delay_s: float = 0.0, fail_on: str | None = None, hold_first: bool = False
    ) -> None:
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.calls: list[list[str]] = []
        self.threads: set[int] = set()
        self.started = threading.Event()  # the first call is running
        self.release = threading.Event()  # ... and may finish (with hold_first)
        if not hold_first:
            self.release.set()

    async def busy(self) -> None:
        """Wait until the model runs its first call (held until ``release`` is set)."""
        while not self.started.is_set():
            await asyncio.sleep(0.001)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        self.threads.add(threading.get_ident())
        self.started.set()
        self.release.wait(timeout=30)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_on is not None and self.fail_on in texts:
            raise EmbeddingError(f"model failed on a batch with {self.fail_on!r}")
        return np.array(
            [[float(t.split(":")[0]) if ":" in t else 0.0, len(t), 1.0] for t in texts],
            dtype=np.float32,
        )

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await asyncio.to_thread(self.embed_sync, list(texts))


@pytest.fixture(scope="module")
def use_model() -> USEEmbedder:
    return USEEmbedder()


async def test_batched_vectors_equal_unbatched_ones(use_model: USEEmbedder) -> None:
    """100 concurrent calls of 1-3 texts of mixed lengths: each gets exactly its own rows."""
    texts = _texts(180)
    rng = random.Random(3)
    calls: list[list[str]] = []
    i = 0
    while i < len(texts) and len(calls) < 100:
        n = rng.randint(1, 3)
        calls.append(texts[i : i + n])
        i += n
    expected = [use_model.embed_sync(call) for call in calls]  # one call at a time
    batcher = BatchingEmbedder(use_model, max_batch=32)
    results = await asyncio.gather(*(batcher.embed(call) for call in calls))
    for call, got, want in zip(calls, results, expected, strict=True):
        assert got.shape == (len(call), 512) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert batcher.batches < len(calls) / 4, "concurrent calls should share model calls"
    assert batcher.largest_batch <= 32


async def test_minilm_batched_vectors_equal_unbatched_ones() -> None:
    model = MiniLMEmbedder()
    texts = _texts(40, seed=11)
    expected = [model.embed_sync([t]) for t in texts]
    batcher = BatchingEmbedder(model, max_batch=16)
    results = await asyncio.gather(*(batcher.embed([t]) for t in texts))
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert batcher.batches < len(texts)


async def test_concurrent_calls_keep_their_order_and_share_one_worker_thread() -> None:
    model = FakeModel(delay_s=0.002)
    batcher = BatchingEmbedder(model, max_batch=32)
    rng = random.Random(5)
    calls = [
        [f"{c * 10 + k}:" + "x" * rng.randint(0, 40) for k in range(rng.randint(1, 4))]
        for c in range(100)
    ]
    results = await asyncio.gather(*(batcher.embed(call) for call in calls))
    for call, got in zip(calls, results, strict=True):
        assert got[:, 0].tolist() == [float(t.split(":")[0]) for t in call]
        assert got[:, 1].tolist() == [float(len(t)) for t in call]
    assert sum(len(c) for c in model.calls) == sum(len(c) for c in calls)
    assert all(len(c) <= 32 for c in model.calls)
    assert len(model.calls) < 100 / 4
    assert len(model.threads) == 1 and threading.get_ident() not in model.threads


async def test_identical_texts_in_a_batch_are_embedded_once() -> None:
    model = FakeModel(hold_first=True)
    batcher = BatchingEmbedder(model)
    busy = asyncio.ensure_future(batcher.embed(["0:busy"]))  # the next calls queue behind it
    await model.busy()
    calls = [
        asyncio.ensure_future(batcher.embed(texts))
        for texts in (["1:a", "2:b"], ["2:b"], ["1:a", "1:a"])
    ]
    await asyncio.sleep(0.01)
    model.release.set()
    results = await asyncio.gather(*calls)
    await busy
    assert model.calls == [["0:busy"], ["1:a", "2:b"]]
    assert [r[:, 0].tolist() for r in results] == [[1.0, 2.0], [2.0], [1.0, 1.0]]


async def test_a_failure_reaches_every_caller_of_its_batch_and_only_them() -> None:
    model = FakeModel(fail_on="2:bad", hold_first=True)
    batcher = BatchingEmbedder(model, max_batch=3)
    # The first call runs alone; the next three wait for it and then go together (and fail);
    # the last one does not fit in that batch (max_batch=3) and succeeds.
    first = asyncio.ensure_future(batcher.embed(["1:first"]))
    await model.busy()
    rest = [asyncio.ensure_future(batcher.embed([t])) for t in ("2:bad", "3:ok", "4:ok", "5:ok")]
    await asyncio.sleep(0.01)
    model.release.set()
    assert (await first)[0, 0] == 1.0
    outcomes = await asyncio.gather(*rest, return_exceptions=True)
    assert [type(o) for o in outcomes[:3]] == [EmbeddingError] * 3
    assert "2:bad" in str(outcomes[0])
    assert isinstance(outcomes[3], np.ndarray) and outcomes[3][0, 0] == 5.0
    # The batcher keeps working after a failure.
    assert (await batcher.embed(["6:later"]))[0, 0] == 6.0


async def test_a_cancelled_caller_is_dropped_and_the_others_are_served() -> None:
    model = FakeModel(hold_first=True)
    batcher = BatchingEmbedder(model)
    running = asyncio.ensure_future(batcher.embed(["1:running"]))
    await model.busy()
    queued = asyncio.ensure_future(batcher.embed(["2:queued"]))
    kept = asyncio.ensure_future(batcher.embed(["3:kept"]))
    await asyncio.sleep(0)
    queued.cancel()
    running.cancel()  # cancelled while its batch runs: the batch finishes, nobody is answered
    await asyncio.sleep(0)
    model.release.set()
    assert (await kept)[0, 0] == 3.0
    with pytest.raises(asyncio.CancelledError):
        await queued
    with pytest.raises(asyncio.CancelledError):
        await running
    assert ["2:queued"] not in model.calls and all("2:queued" not in c for c in model.calls)
    assert (await batcher.embed(["4:after"]))[0, 0] == 4.0


async def test_a_lone_caller_never_waits_for_company() -> None:
    """Even with a huge wait window, one sequential client goes straight to the model."""
    batcher = BatchingEmbedder(FakeModel(), wait_ms=10_000)
    start = time.perf_counter()
    for i in range(20):
        await batcher.embed([f"{i}:alone"])
    assert time.perf_counter() - start < 2.0  # 20 calls: far below one wait window
    assert batcher.batches == 20


async def test_under_load_the_wait_window_is_bounded_and_a_full_batch_ends_it() -> None:
    model = FakeModel()
    batcher = BatchingEmbedder(model, max_batch=4, wait_ms=10_000)
    await asyncio.gather(
        *(batcher.embed([f"{i}:burst"]) for i in range(4))
    )  # busy: several callers
    # The next call lingers for company; a full batch (4 texts) releases it at once.
    start = time.perf_counter()
    await asyncio.gather(*(batcher.embed([f"{i}:next"]) for i in range(4)))
    assert time.perf_counter() - start < 2.0
    short = BatchingEmbedder(FakeModel(), wait_ms=50)
    await asyncio.gather(*(short.embed([f"{i}:burst"]) for i in range(3)))
    start = time.perf_counter()
    await short.embed(["1:late"])
    assert time.perf_counter() - start < 1.0  # waited at most the 50 ms window (plus noise)


async def test_an_inner_embedder_without_embed_sync_is_awaited_with_the_batch() -> None:
    seen: list[list[str]] = []

    class AsyncOnly:
        model_id = "async-only"
        dimensions = 2

        async def embed(self, texts: Sequence[str]) -> np.ndarray:
            seen.append(list(texts))
            await asyncio.sleep(0.005)
            return np.array([[len(t), 0.0] for t in texts], dtype=np.float32)

    batcher = BatchingEmbedder(AsyncOnly())
    results = await asyncio.gather(*(batcher.embed(["x" * n]) for n in range(1, 11)))
    assert [r[0, 0] for r in results] == [float(n) for n in range(1, 11)]
    assert len(seen) < 10


async def test_bad_input_fails_only_its_caller() -> None:
    batcher = BatchingEmbedder(FakeModel())
    with pytest.raises(InvalidInputError, match="not a single string"):
        await batcher.embed("oops")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"texts\[1\] is int"):
        await batcher.embed(["ok", 3])  # type: ignore[list-item]
    assert (await batcher.embed([])).shape == (0, 3)
    with pytest.raises(InvalidInputError):
        BatchingEmbedder(FakeModel(), max_batch=0)
    with pytest.raises(InvalidInputError):
        BatchingEmbedder(FakeModel(), wait_ms=-1)


def test_one_batcher_serves_several_event_loops() -> None:
    batcher = BatchingEmbedder(FakeModel())
    for i in range(3):
        assert asyncio.run(batcher.embed([f"{i}:loop"]))[0, 0] == float(i)

    def in_thread(out: list[float]) -> None:
        out.append(float(asyncio.run(batcher.embed(["9:thread"]))[0, 0]))

    out: list[float] = []
    thread = threading.Thread(target=in_thread, args=(out,))
    thread.start()
    thread.join()
    assert out == [9.0]


async def test_the_cache_in_front_survives_concurrent_eviction() -> None:
    cache = CachedEmbedder(BatchingEmbedder(FakeModel(delay_s=0.005)), max_entries=2)
    await cache.embed(["1:a"])
    # Each call hits "1:a" and misses a new text; the others' inserts evict "1:a" meanwhile.
    results = await asyncio.gather(*(cache.embed(["1:a", f"{i}:n"]) for i in range(2, 12)))
    assert [r[:, 0].tolist() for r in results] == [[1.0, float(i)] for i in range(2, 12)]


async def test_warm_up_loads_the_model_before_the_first_call() -> None:
    model = USEEmbedder()
    batcher = BatchingEmbedder(model)
    await warm_up(CachedEmbedder(batcher))
    assert model._model is not None and batcher.batches == 1
    start = time.perf_counter()
    await batcher.embed(["first real call"])
    assert time.perf_counter() - start < 1.0  # no model load

    class Plain:
        model_id = "plain"
        dimensions = 1
        calls = 0

        async def embed(self, texts: Sequence[str]) -> np.ndarray:
            Plain.calls += 1
            return np.zeros((len(texts), 1), dtype=np.float32)

    await warm_up(Plain())
    assert Plain.calls == 1


def test_make_embedder_batches_local_models_unless_told_not_to() -> None:
    default = make_embedder(Settings(_env_file=None))  # type: ignore[call-arg]
    assert isinstance(default, CachedEmbedder) and isinstance(default.inner, BatchingEmbedder)
    assert isinstance(default.inner.inner, USEEmbedder)
    assert (default.inner.max_batch, default.inner.wait_ms) == (32, 2.0)
    tuned = make_embedder(
        Settings(_env_file=None, embed_batch_max=8, embed_batch_wait_ms=0),  # type: ignore[call-arg]
        cache=False,
    )
    assert isinstance(tuned, BatchingEmbedder) and (tuned.max_batch, tuned.wait_ms) == (8, 0.0)
    off = make_embedder(Settings(_env_file=None, embed_batching=False))  # type: ignore[call-arg]
    assert isinstance(off, CachedEmbedder) and isinstance(off.inner, USEEmbedder)
    minilm = make_embedder(Settings(_env_file=None, embedder="minilm"), cache=False)  # type: ignore[call-arg]
    assert isinstance(minilm, BatchingEmbedder) and minilm.dimensions == 384
