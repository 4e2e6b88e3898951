"""Read replicas for real: a primary and a streaming hot standby on loopback ports.

Which server served a read is proved on the very connection that ran it: right after each
search, list, count or history statement, ``pg_is_in_recovery()`` runs on that connection
(true only on a standby).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import unique
from tests.store.replica_pair import Server, primary_and_standby

DATABASE = "pgmemory_replicas"
DIMENSIONS = 4
#: Statements whose server the tests check (the store's reads of memories and history).
READS = ("pgmemory_memories", "pgmemory_chat_messages")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Server, Server]]:
    """A primary with pgmemory's schema, and its hot standby (schema replicated)."""
    with primary_and_standby() as (primary, standby):
        admin = sa.create_engine(primary.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {DATABASE}"))
        admin.dispose()
        migrate.upgrade(primary.url(DATABASE))
        _wait_for(lambda: _standby_has_schema(standby), what="the schema on the standby")
        yield primary, standby


def _standby_has_schema(standby: Server) -> bool:
    engine = sa.create_engine(standby.url(DATABASE))
    try:
        with engine.connect() as conn:
            return bool(conn.execute(sa.text("SELECT to_regclass('pgmemory_memories')")).scalar())
    except sa.exc.OperationalError:
        return False
    finally:
        engine.dispose()


def _wait_for(condition: Any, *, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Served:
    """Records, for each read statement, whether its connection was a standby's."""

    def __init__(self, *engines: AsyncEngine) -> None:
        self.by: list[bool] = []
        self._probing = False
        for engine in engines:
            event.listen(engine.sync_engine, "after_cursor_execute", self._after)

    def _after(self, conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self._probing or not any(table in statement for table in READS):
            return
        if any(write in statement.upper() for write in ("INSERT INTO", "DELETE FROM", "UPDATE ")):
            return
        self._probing = True
        try:
            self.by.append(bool(conn.exec_driver_sql("SELECT pg_is_in_recovery()").scalar()))
        finally:
            self._probing = False

    def take(self) -> list[bool]:
        """The servers of the reads since the last call (True: the standby)."""
        seen, self.by = self.by, []
        return seen


@pytest_asyncio.fixture
async def replicated(pair: tuple[Server, Server]) -> AsyncIterator[tuple[MemoryStore, Served]]:
    primary, standby = pair
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        replica_wait_ms=500,
        replica_retry_s=0.2,
        replica_check_interval_s=0.0,
        connect_timeout_s=2,
    )
    store = MemoryStore(primary.url(DATABASE), settings=settings, read_urls=[standby.url(DATABASE)])
    async with store:
        replicas = store._db.replicas
        assert replicas is not None
        served = Served(store.engine, replicas.replicas[0].engine)
        yield store, served


async def _turn(store: MemoryStore, collection: str, user: str, text: str) -> uuid.UUID:
    """Store one memory of ``user`` (its vector a unit axis, so a search finds it first)."""
    (stored,) = await store.add(
        collection,
        [MemoryRecord(content=text, scope=MemoryScope(user_id=user), embedding=[1, 0, 0, 0])],
    )
    return stored


async def _recall(store: MemoryStore, collection: str, user: str) -> list[str]:
    hits = await store.search(
        collection, MemoryScope(user_id=user), vector=[1, 0, 0, 0], limit=5, audit=True
    )
    return [hit.memory.content for hit in hits]


def _recovery(pair: tuple[Server, Server], sql: str) -> None:
    """Run a replay control function on the standby."""
    engine = sa.create_engine(pair[1].url(DATABASE), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(sql))
    engine.dispose()


def _recall_audit_rows(primary: Server, user: str) -> int:
    engine = sa.create_engine(primary.url(DATABASE))
    with engine.connect() as conn:
        count = conn.execute(
            sa.text("SELECT count(*) FROM pgmemory_recall_audit WHERE user_id = :u"), {"u": user}
        ).scalar_one()
    engine.dispose()
    return int(count)


async def test_recall_is_served_by_the_standby_and_audited_on_the_primary(
    replicated: tuple[MemoryStore, Served], pair: tuple[Server, Server]
) -> None:
    store, served = replicated
    collection = unique("replicated")
    await store.create_collection(collection, dimensions=DIMENSIONS, embedding_model="test")
    user = unique("alice")
    await _turn(store, collection, user, "I can't eat spicy food")

    assert await _recall(store, collection, user) == ["I can't eat spicy food"]
    assert served.take() == [True]  # the search ran on the standby, and saw the fresh write
    assert _recall_audit_rows(pair[0], user) == 1  # its audit row went to the primary

    scope = MemoryScope(user_id=user)
    assert await store.count(collection, scope) == 1
    assert [m.content for m in await store.list(collection, scope)] == ["I can't eat spicy food"]
    session = unique("session")
    await store.append_history(
        session, [{"message_id": "m1", "role": "user", "content": "hi"}], user_id=user
    )
    assert [row.seq for row in await store.read_history(session, user_id=user)] == [1]
    assert served.take() == [True, True, True]


async def test_paused_replay_falls_back_to_the_primary_for_the_writer_only(
    replicated: tuple[MemoryStore, Served], pair: tuple[Server, Server]
) -> None:
    store, served = replicated
    collection = unique("paused")
    await store.create_collection(collection, dimensions=DIMENSIONS, embedding_model="test")
    writer, other = unique("writer"), unique("other")
    await _turn(store, collection, other, "the other user's memory")
    assert await _recall(store, collection, other) == ["the other user's memory"]
    served.take()
    _recovery(pair, "SELECT pg_wal_replay_pause()")
    try:
        await _turn(store, collection, writer, "last turn: my daughter is called Mia")
        started = time.monotonic()
        # The standby has not replayed the write: after waiting (bounded), the primary answers.
        assert await _recall(store, collection, writer) == ["last turn: my daughter is called Mia"]
        assert served.take() == [False]
        assert time.monotonic() - started < 5
        # A user who wrote nothing since is still served by the standby.
        assert await _recall(store, collection, other) == ["the other user's memory"]
        assert served.take() == [True]
    finally:
        _recovery(pair, "SELECT pg_wal_replay_resume()")
    assert await _recall(store, collection, writer) == ["last turn: my daughter is called Mia"]
    assert served.take() == [True]


async def test_reads_fall_back_when_the_standby_dies_and_return_when_it_is_back(
    replicated: tuple[MemoryStore, Served], pair: tuple[Server, Server]
) -> None:
    store, served = replicated
    primary, standby = pair
    collection = unique("failover")
    await store.create_collection(collection, dimensions=DIMENSIONS, embedding_model="test")
    user = unique("bob")
    await _turn(store, collection, user, "I moved to Lyon")
    assert await _recall(store, collection, user) == ["I moved to Lyon"]
    assert served.take() == [True]

    standby.kill()
    try:
        for _ in range(3):  # nothing fails: the pooled standby connection is dead, then refused
            assert await _recall(store, collection, user) == ["I moved to Lyon"]
            assert await store.count(collection, MemoryScope(user_id=user)) == 1
        assert set(served.take()) == {False}
        await _turn(store, collection, user, "I work in Paris")  # a write during the outage
    finally:
        standby.start()

    deadline = time.monotonic() + 30
    while True:
        assert sorted(await _recall(store, collection, user)) == [
            "I moved to Lyon",
            "I work in Paris",
        ]
        if served.take() == [True]:
            break
        assert time.monotonic() < deadline, "reads did not return to the restarted standby"
        await asyncio.sleep(0.2)
    assert _recall_audit_rows(primary, user) >= 5
