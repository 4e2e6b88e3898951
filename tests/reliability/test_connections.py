"""Connections: a read outlives a lost connection, a write is never run twice, and errors never
carry the statement's parameters.

A connection is lost on purpose by ending its own server process (``pg_terminate_backend`` on
the store connection's backend pid, from a separate connection) just before a chosen statement.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError

from pgmemory.store._engine.connector import _ping
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore


class DropConnection:
    """Ends the store connection's backend just before each of the next ``times`` statements
    that contain ``marker``."""

    def __init__(self, store: MemoryStore, admin_url: str, *, marker: str, times: int = 1) -> None:
        self._engine = store.engine.sync_engine
        self._admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._marker = marker
        self._times = times
        self.dropped = 0

    def __enter__(self) -> DropConnection:
        event.listen(self._engine, "before_cursor_execute", self._before)
        return self

    def __exit__(self, *exc_info: object) -> None:
        event.remove(self._engine, "before_cursor_execute", self._before)
        self._admin.dispose()

    def _before(self, conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.dropped >= self._times or self._marker not in statement:
            return
        self.dropped += 1
        _terminate(self._admin, conn.connection.driver_connection.info.backend_pid)


class DropOnCheckout:
    """Ends the backend of the next ``times`` connections the pool hands out, just after the
    pool's own checkout check passed: the first statement on each finds its connection lost.

    For searches, which run as one statement on psycopg directly (pgmemory.store._engine.fastpath),
    where SQLAlchemy's statement events do not fire. The fast path keeps its connections
    checked out between statements (pgmemory.store._engine.held): :func:`_release_held` first, so
    that the next statement checks one out.
    """

    def __init__(self, store: MemoryStore, admin_url: str, *, times: int = 1) -> None:
        self._engine = store.engine.sync_engine
        self._admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self._times = times
        self.dropped = 0

    def __enter__(self) -> DropOnCheckout:
        event.listen(self._engine, "checkout", self._checkout)
        return self

    def __exit__(self, *exc_info: object) -> None:
        event.remove(self._engine, "checkout", self._checkout)
        self._admin.dispose()

    def _checkout(self, dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        if self.dropped >= self._times:
            return
        self.dropped += 1
        _terminate(self._admin, dbapi_connection.driver_connection.info.backend_pid)


async def _release_held(store: MemoryStore) -> None:
    """Give the connections the fast path holds back to the pool."""
    held = store.database.connections.held
    while len(held):
        await held.release_one()


def _terminate(admin: sa.Engine, pid: int) -> None:
    """End a backend and wait until it is gone."""
    with admin.connect() as conn:
        ended = conn.execute(sa.text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
        assert ended.scalar_one(), "the store's backend did not end"


@pytest.fixture
def collection_3d() -> str:
    """A unique name for a 3-dimensional collection the test creates."""
    return f"r_{uuid.uuid4().hex[:10]}"


async def _audit_rows(store: MemoryStore, user_id: str) -> int:
    async with store.engine.connect() as conn:
        result = await conn.execute(
            sa.text("SELECT count(*) FROM pgmemory_recall_audit WHERE user_id = :user_id"),
            {"user_id": user_id},
        )
        return int(result.scalar_one())


async def test_a_read_runs_once_more_after_losing_its_connection(
    store: MemoryStore, collection_3d: str, server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await store.create_collection(collection_3d, dimensions=3, embedding_model="test")
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    await store.add(
        collection_3d, [MemoryRecord(content="likes tea", scope=scope, embedding=[1, 0, 0])]
    )
    # The search (one statement, which writes its audit row) finds its connection gone.
    await _release_held(store)  # the add's connection is held: the search would take it
    with DropOnCheckout(store, server_url) as dropped_search:
        hits = await store.search(collection_3d, scope, vector=[1, 0, 0])
    assert dropped_search.dropped == 1
    assert "a read lost its database connection" in caplog.text, "the search ran once more"
    assert [hit.memory.content for hit in hits] == ["likes tea"]
    assert await _audit_rows(store, scope.user_id or "") == 1, "the lost attempt committed nothing"
    with DropConnection(store, server_url, marker="pgmemory_memories") as drop:
        assert await store.count(collection_3d, scope) == 1
    assert drop.dropped == 1


async def test_a_read_runs_at_most_twice(
    store: MemoryStore, collection_3d: str, server_url: str
) -> None:
    await store.create_collection(collection_3d, dimensions=3, embedding_model="test")
    scope = MemoryScope(user_id="anyone")
    with (
        DropConnection(store, server_url, marker="pgmemory_memories", times=3) as drop,
        pytest.raises(DBAPIError) as raised,
    ):
        await store.count(collection_3d, scope)
    assert drop.dropped == 2
    assert raised.value.connection_invalidated


async def test_a_write_is_not_run_again_after_losing_its_connection(
    store: MemoryStore, collection_3d: str, server_url: str
) -> None:
    await store.create_collection(collection_3d, dimensions=3, embedding_model="test")
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    record = MemoryRecord(content="likes coffee", scope=scope, embedding=[0, 1, 0])
    await _release_held(store)
    with DropOnCheckout(store, server_url) as drop, pytest.raises(DBAPIError) as raised:
        await store.add(collection_3d, [record])
    assert drop.dropped == 1
    assert raised.value.connection_invalidated
    assert await store.count(collection_3d, scope) == 0
    # The pool hands out a working connection for the caller's own retry.
    await store.add(collection_3d, [record])
    assert await store.count(collection_3d, scope) == 1


async def test_errors_do_not_carry_the_statement_parameters(store: MemoryStore) -> None:
    secret = "diagnosed with diabetes, call +44 7700 900123"
    async with store.engine.connect() as conn:
        with pytest.raises(DBAPIError) as raised:
            await conn.execute(sa.text("SELECT CAST(:note AS text), 1 / 0"), {"note": secret})
    assert "division by zero" in str(raised.value)
    assert secret not in str(raised.value)
    assert secret not in repr(raised.value)


async def test_the_checkout_ping_keeps_prepared_statements(store: MemoryStore) -> None:
    async with store.engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        await driver.execute("SELECT 1 + %s", [1], prepare=True)
        await driver.commit()

        async def prepared() -> int:
            cursor = await driver.execute(
                "SELECT count(*) FROM pg_prepared_statements", prepare=False
            )
            row = await cursor.fetchone()
            await driver.commit()
            return int(row[0])

        before = await prepared()
        await _ping(driver)
        assert before >= 1
        assert await prepared() == before
