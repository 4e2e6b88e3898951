"""A write is its locks and its statement in one round trip (on one server, one statement that
takes its locks itself); a turn's writes share a transaction.

What the client sends is read from libpq's own protocol trace (:mod:`tests.wire`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from tests.wire import one_connection_store, round_trips, sent

DIM = 8


async def _stored(store: MemoryStore, user_id: str) -> tuple[int, int]:
    """Memories and chat messages of ``user_id`` that a new transaction sees (committed)."""
    async with store.engine.connect() as conn:
        memories = (
            await conn.execute(
                text("SELECT count(*) FROM pgmemory_memories WHERE user_id = :u"), {"u": user_id}
            )
        ).scalar_one()
        messages = (
            await conn.execute(
                text("SELECT count(*) FROM pgmemory_chat_messages WHERE user_id = :u"),
                {"u": user_id},
            )
        ).scalar_one()
        await conn.rollback()
    return memories, messages


@pytest.fixture
def scope() -> MemoryScope:
    return MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}", session_id="s1")


async def test_a_write_is_its_locks_and_statement_in_one_round_trip(
    database_url: str, scope: MemoryScope
) -> None:
    user = scope.user_id or ""
    collection = f"w_{uuid.uuid4().hex[:10]}"
    async with one_connection_store(database_url) as (store, pgconn):
        await store.create_collection(collection, dimensions=DIM, embedding_model="test")
        vector = np.ones(DIM, dtype=np.float32)

        async def add() -> None:
            await store.add(
                collection, [MemoryRecord(content="tea", scope=scope, embedding=vector)]
            )

        async def append() -> None:
            await store.append_history(
                "s1", [{"message_id": "m1", "role": "user", "content": "hi"}], user_id=user
            )

        # One server: the write takes its locks itself, one statement. Citus: the lock
        # statement and the write, each bound and executed, before one Sync. Either way no
        # BEGIN, no COMMIT (one implicit transaction).
        statements = 1 if store.database.locks_in_statement else 2
        for action in (add, append):
            await action()  # its first run on the connection prepares it
            kinds = await sent(pgconn, action)
            assert round_trips(kinds) == 1, kinds
            assert kinds.count("Execute") == statements, kinds
            assert not any("BEGIN" in kind or "COMMIT" in kind for kind in kinds), kinds
        assert await _stored(store, user) == (2, 1)  # committed (the message once)


async def test_a_turns_writes_share_one_transaction_and_take_the_locks_once(
    database_url: str, scope: MemoryScope
) -> None:
    user = scope.user_id or ""
    collection = f"w_{uuid.uuid4().hex[:10]}"
    async with one_connection_store(database_url) as (store, pgconn):
        await store.create_collection(collection, dimensions=DIM, embedding_model="test")
        vector = np.ones(DIM, dtype=np.float32)
        seen_inside: list[tuple[int, int]] = []

        async def turn(n: int) -> None:
            async with store.shared_transaction():
                await store.append_history(
                    "s1", [{"message_id": f"m{n}", "role": "user", "content": "hi"}], user_id=user
                )
                await store.add(
                    collection, [MemoryRecord(content=f"tea {n}", scope=scope, embedding=vector)]
                )

        await turn(0)  # the connection prepares its statements (a round trip of its own, once)
        kinds = await sent(pgconn, lambda: turn(1))
        # BEGIN, the locks (on one server taken by the statement itself) and the history row;
        # the memory row (its user's lock is held already); COMMIT
        assert round_trips(kinds) == 3, kinds
        assert kinds.count("Execute") == (3 if store.database.locks_in_statement else 4), kinds
        assert kinds[-1] == "Query COMMIT", kinds
        assert await _stored(store, user) == (2, 2)
        # The block's connection (the pool's only one) went back out of autocommit: the two
        # statements of a write block are one transaction (one now()).
        async with store.database.write(users=()) as conn:
            first = (await conn.execute(text("SELECT now()"))).scalar_one()
            await asyncio.sleep(0.01)
            assert (await conn.execute(text("SELECT now()"))).scalar_one() == first

        async def failing_turn() -> None:
            async with store.shared_transaction():
                await store.append_history(
                    "s2", [{"message_id": "m2", "role": "user", "content": "hi"}], user_id=user
                )
                seen_inside.append(await _stored_elsewhere(database_url, user))
                raise RuntimeError("the model call failed")

        with pytest.raises(RuntimeError):
            await failing_turn()
        assert seen_inside == [(2, 2)]  # uncommitted inside the block
        assert await _stored(store, user) == (2, 2)  # and rolled back after it


async def _stored_elsewhere(url: str, user_id: str) -> tuple[int, int]:
    """What another store's connection sees of ``user_id`` (the block's own connection is
    taken)."""
    async with MemoryStore(url, settings=Settings(_env_file=None)) as other:  # type: ignore[call-arg]
        return await _stored(other, user_id)


async def test_a_deferred_turns_writes_are_one_round_trip_with_their_commit(
    database_url: str, scope: MemoryScope
) -> None:
    """In a deferred block the history and memory rows wait for its end: the locks and both
    writes before one Sync (between BEGIN and COMMIT on Citus). What ``add`` returns is what it sent: a message it
    re-sends is skipped when the block commits."""
    user = scope.user_id or ""
    collection = f"w_{uuid.uuid4().hex[:10]}"
    async with one_connection_store(database_url) as (store, pgconn):
        await store.create_collection(collection, dimensions=DIM, embedding_model="test")
        vector = np.ones(DIM, dtype=np.float32)
        returned: list[object] = []

        async def turn(n: int, message_id: str) -> None:
            async with store.shared_transaction(deferred=True):
                returned.append(
                    await store.append_history(
                        "s1", [{"message_id": message_id, "role": "user"}], user_id=user
                    )
                )
                record = MemoryRecord(
                    content=f"tea {n}", scope=scope, embedding=vector, message_id=message_id
                )
                returned.append(len(await store.add(collection, [record])))
                # nothing is sent inside the block: another connection sees nothing new
                returned.append(await _stored_elsewhere(database_url, user))

        await turn(0, "m0")  # the connection prepares its statements
        kinds = await sent(pgconn, lambda: turn(1, "m1"))
        assert round_trips(kinds) == 1, kinds
        # The history row and the memory row, each taking its locks itself: one server runs
        # them as the implicit transaction before the Sync; Citus needs BEGIN and COMMIT around
        # them and the lock statement before them.
        block = store.database.distributed
        assert kinds.count("Execute") == (5 if block else 2), kinds
        assert any(kind.startswith("Parse COMMIT") for kind in kinds) == block, kinds
        assert returned[-3:] == [1, 1, (1, 1)], returned
        assert await _stored(store, user) == (2, 2)
        await turn(2, "m1")  # the same message again: sent, and skipped by the commit
        assert returned[-3:] == [1, 1, (2, 2)], returned
        assert await _stored(store, user) == (2, 2)
        # the block's connection is idle again, in autocommit, and takes the next write
        await store.append_history("s1", [{"message_id": "m3", "role": "user"}], user_id=user)
        assert await _stored(store, user) == (2, 3)
        # A server whose default isolation is not READ COMMITTED gets the explicit block (the
        # deployment, read when the store opened, as it would read such a server).
        database = store.database
        chosen = database.deployment
        database.deployment = dataclasses.replace(chosen, read_committed=False)
        try:
            kinds = await sent(pgconn, lambda: turn(3, "m4"))
        finally:
            database.deployment = chosen
        assert kinds.count("Execute") == 5, kinds
        assert any(kind.startswith("Parse BEGIN") for kind in kinds), kinds
        assert await _stored(store, user) == (3, 4)


async def test_a_deferred_write_failing_at_the_commit_writes_nothing(
    store_url: str, poisoned_memories: str, scope: MemoryScope
) -> None:
    """A queued write's error comes out of the block's end; nothing of the block is written,
    and the connection (the pool's only one) is rolled back and usable."""
    user = scope.user_id or ""
    collection = f"w_{uuid.uuid4().hex[:10]}"
    async with one_connection_store(store_url) as (store, _):
        await store.create_collection(collection, dimensions=DIM, embedding_model="test")
        vector = np.ones(DIM, dtype=np.float32)
        poison = MemoryRecord(content=poisoned_memories, scope=scope, embedding=vector)
        with pytest.raises(DBAPIError, match="poisoned row"):
            async with store.shared_transaction(deferred=True):
                await store.append_history(
                    "s1", [{"message_id": "m1", "role": "user"}], user_id=user
                )
                await store.add(collection, [poison])
        assert await _stored(store, user) == (0, 0)
        await store.append_history("s1", [{"message_id": "m1", "role": "user"}], user_id=user)
        assert await _stored(store, user) == (0, 1)
