"""Concurrent batches of the same messages in opposite orders: none deadlocks, none is lost.

Rows are inserted in message-key order whatever the record order (``add`` sorts before it
chunks; the statements sort too), so two writers claim the same ids in one order: one waits for
the other instead of both waiting for each other.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio

from pgmemory.settings import Settings
from pgmemory.store import writes
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import unique

DIM = 16


@pytest_asyncio.fixture
async def busy_store(database_url: str) -> AsyncIterator[MemoryStore]:
    """A store with a pool big enough for a dozen concurrent batches."""
    settings = Settings(_env_file=None, pool_size=12, max_overflow=4)  # type: ignore[call-arg]
    async with MemoryStore(database_url, settings=settings) as store:
        yield store


def _records(scope: MemoryScope, message_ids: list[str], seed: int) -> list[MemoryRecord]:
    vectors = (
        np.random.default_rng(seed).standard_normal((len(message_ids), DIM)).astype(np.float32)
    )
    return [
        MemoryRecord(content=f"message {m}", scope=scope, message_id=m, embedding=v)
        for m, v in zip(message_ids, vectors, strict=True)
    ]


def _failures(results: list[object]) -> list[str]:
    return [
        f"{type(r).__name__}: {getattr(r, 'orig', r)!r}"
        for r in results
        if isinstance(r, BaseException)
    ]


def _start_together(monkeypatch: pytest.MonkeyPatch, parties: int) -> None:
    """Make ``parties`` concurrent adds send their inserts at once (checks take a while, so
    batches started together would otherwise reach the server one after the other)."""
    barrier = asyncio.Barrier(parties)
    prepare = writes.prepare

    async def prepared_together(*args: object, **kwargs: object) -> object:
        rows = await prepare(*args, **kwargs)  # type: ignore[arg-type]
        await barrier.wait()
        return rows

    monkeypatch.setattr(writes, "prepare", prepared_together)


@pytest.mark.parametrize("chunk_rows", [1_000, 7], ids=["one-statement", "many-chunks"])
async def test_opposite_orders_never_deadlock(
    busy_store: MemoryStore, monkeypatch: pytest.MonkeyPatch, chunk_rows: int
) -> None:
    monkeypatch.setattr(writes, "INSERT_CHUNK_ROWS", chunk_rows)
    collection = unique("c")
    await busy_store.create_collection(collection, dimensions=DIM, embedding_model="test")
    message_ids = [f"m{i:03d}" for i in range(100)]
    scopes = [MemoryScope(user_id=unique("u"), session_id="s") for _ in range(6)]
    results: list[object] = []
    _start_together(monkeypatch, 12)
    for round_, scope in enumerate(scopes):
        batches = [
            busy_store.add(
                collection,
                _records(
                    scope,
                    message_ids if task % 2 == 0 else message_ids[::-1],
                    seed=round_ * 100 + task,
                ),
            )
            for task in range(12)
        ]
        results += await asyncio.gather(*batches, return_exceptions=True)
    assert _failures(results) == []  # 72 batches, none died (the red team saw 34 deadlocks)
    for scope in scopes:
        assert await busy_store.count(collection, scope) == len(message_ids)
    # Every message was stored by exactly one batch.
    stored = sorted(i for r in results if isinstance(r, list) for i in r)
    assert len(stored) == len(set(stored)) == len(scopes) * len(message_ids)


async def test_an_import_and_a_batch_in_opposite_orders(busy_store: MemoryStore) -> None:
    collection = unique("c")
    await busy_store.create_collection(collection, dimensions=DIM, embedding_model="test")
    message_ids = [f"m{i:04d}" for i in range(1000)]
    scope = MemoryScope(user_id=unique("u"))
    results = await asyncio.gather(
        busy_store.import_records(
            collection, _records(scope, message_ids[::-1], seed=1), batch_rows=50
        ),
        busy_store.add(collection, _records(scope, message_ids, seed=2)),
        busy_store.import_records(collection, _records(scope, message_ids, seed=3), batch_rows=70),
        busy_store.add(collection, _records(scope, message_ids[::-1], seed=4)),
        return_exceptions=True,
    )
    assert _failures(results) == []
    assert await busy_store.count(collection, scope) == len(message_ids)


async def test_history_appends_in_opposite_orders(busy_store: MemoryStore) -> None:
    session, user = unique("s"), unique("u")
    messages = [{"message_id": f"m{i:03d}", "role": "user", "text": str(i)} for i in range(30)]
    results = await asyncio.gather(
        *(
            busy_store.append_history(session, messages if i % 2 else messages[::-1], user_id=user)
            for i in range(16)
        ),
        return_exceptions=True,
    )
    assert _failures(results) == []
    assert sum(r for r in results if isinstance(r, int)) == len(messages)
    rows = await busy_store.read_history(session, user_id=user)
    assert sorted(r.message["message_id"] for r in rows) == [m["message_id"] for m in messages]


async def test_a_batch_keeps_its_record_order_in_time(
    busy_store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Inserted in message-key order (here the reverse of record order, over several chunks),
    # stamped by position: listing oldest first gives the records back in order.
    monkeypatch.setattr(writes, "INSERT_CHUNK_ROWS", 3)
    collection = unique("c")
    await busy_store.create_collection(collection, dimensions=DIM, embedding_model="test")
    scope = MemoryScope(user_id=unique("u"))
    message_ids = [f"m{i:02d}" for i in range(10)][::-1]
    ids = await busy_store.add(collection, _records(scope, message_ids, seed=5))
    listed = await busy_store.list(collection, scope, newest_first=False)
    assert [m.id for m in listed] == ids
    assert [m.message_id for m in listed] == message_ids
    times = [m.created_at for m in listed]
    assert times == sorted(times) and len(set(times)) == len(times)
