"""The fast path's held connections: kept between statements without a pool checkout, and never
kept from anyone who needs a connection (pgmemory.store._engine.held)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.store._engine import held

DIM = 3


def _settings(**pool: Any) -> Settings:
    return Settings(_env_file=None, **pool)  # type: ignore[call-arg]


async def _seeded(store: MemoryStore) -> tuple[str, MemoryScope]:
    collection = f"h_{uuid.uuid4().hex[:10]}"
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    await store.create_collection(collection, dimensions=DIM, embedding_model="test")
    await store.add(collection, [MemoryRecord(content="tea", scope=scope, embedding=[1, 0, 0])])
    return collection, scope


async def _backend_pid(store: MemoryStore) -> int:
    rows = await store.database.fetch("SELECT pg_backend_pid() AS pid", {})
    return int(rows[0]["pid"])


def _count_checkouts(store: MemoryStore) -> list[int]:
    seen: list[int] = []
    event.listen(store.engine.sync_engine, "checkout", lambda *_: seen.append(1))
    return seen


async def test_searches_after_the_first_take_no_connection_from_the_pool(
    database_url: str,
) -> None:
    async with MemoryStore(database_url, settings=_settings(pool_size=3)) as store:
        collection, scope = await _seeded(store)
        first = await _backend_pid(store)
        checkouts = _count_checkouts(store)
        # (on Citus an audited search writes its audit row in a transaction of its own)
        audit = not store.database.distributed
        for _ in range(5):
            hits = await store.search(collection, scope, vector=[1, 0, 0], audit=audit)
            assert [h.memory.content for h in hits] == ["tea"]
        assert checkouts == [], "each search checked a connection out of the pool"
        assert await _backend_pid(store) == first


async def test_history_reads_and_listings_take_no_connection_from_the_pool_either(
    database_url: str,
) -> None:
    async with MemoryStore(database_url, settings=_settings(pool_size=3)) as store:
        collection, scope = await _seeded(store)
        user = scope.user_id or ""
        await store.append_history(
            "s1", [{"message_id": "m1", "role": "user", "content": "hi"}], user_id=user
        )
        checkouts = _count_checkouts(store)
        for _ in range(3):
            assert [r.message["content"] for r in await store.read_history("s1", user_id=user)] == [
                "hi"
            ]
            assert [m.content for m in await store.list(collection, scope)] == ["tea"]
        assert checkouts == [], "a read checked a connection out of the pool"


async def test_a_store_statement_gets_a_held_connection_back_when_the_pool_has_none_idle(
    database_url: str,
) -> None:
    # Two connections: the search's is held, the application takes the other; the store's
    # next write then finds the pool empty and must not wait for the held one's idle timer.
    settings = _settings(pool_size=2, max_overflow=0, pool_timeout_s=0.5)
    async with MemoryStore(database_url, settings=settings) as store:
        collection, scope = await _seeded(store)
        await store.search(collection, scope, vector=[1, 0, 0])
        async with store.engine.connect() as other:
            await other.execute(sa.text("SELECT 1"))
            started = time.monotonic()
            await store.add(
                collection, [MemoryRecord(content="coffee", scope=scope, embedding=[0, 1, 0])]
            )
            assert time.monotonic() - started < held.IDLE_S
        assert await store.count(collection, scope) == 2


async def test_the_engines_own_users_get_a_held_connection_once_it_idles(
    database_url: str,
) -> None:
    settings = _settings(pool_size=2, max_overflow=0, pool_timeout_s=10)
    async with MemoryStore(database_url, settings=settings) as store:
        collection, scope = await _seeded(store)
        await store.search(collection, scope, vector=[1, 0, 0])  # its connection is held
        async with store.engine.connect() as first:
            await first.execute(sa.text("SELECT 1"))
            started = time.monotonic()
            # The pool's last connection is the held one: it comes back after IDLE_S.
            async with store.engine.connect() as second:
                assert (await second.execute(sa.text("SELECT 2"))).scalar_one() == 2
            waited = time.monotonic() - started
        assert waited < held.IDLE_S + 3, "the held connection never went back to the pool"


async def test_a_held_connection_whose_server_session_ended_is_not_used_again(
    database_url: str, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with MemoryStore(database_url, settings=_settings(pool_size=3)) as store:
        collection, scope = await _seeded(store)
        pid = await _backend_pid(store)  # the held connection's backend
        admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                ended = conn.execute(sa.text("SELECT pg_terminate_backend(:p, 10000)"), {"p": pid})
                assert ended.scalar_one()
        finally:
            admin.dispose()
        with caplog.at_level(logging.WARNING):
            hits = await store.search(collection, scope, vector=[1, 0, 0])
        assert [h.memory.content for h in hits] == ["tea"]
        assert "lost its database connection" not in caplog.text, "the lost one was used"
        assert await _backend_pid(store) != pid


async def test_closing_returns_the_held_connections_at_once(
    database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(held, "IDLE_S", 60.0)  # no idle timer returns them meanwhile
    store = await MemoryStore(database_url, settings=_settings(pool_size=3)).open()
    collection, scope = await _seeded(store)
    await asyncio.gather(*(store.search(collection, scope, vector=[1, 0, 0]) for _ in range(3)))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        await store.close()
    assert time.monotonic() - started < 5
    assert "still hold connections" not in caplog.text


async def test_an_applications_engine_lends_the_fast_path_no_connection(
    database_url: str,
) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        async with MemoryStore(engine=engine, settings=_settings()) as store:
            collection, scope = await _seeded(store)
            await store.search(collection, scope, vector=[1, 0, 0])
            assert engine.sync_engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        await engine.dispose()
