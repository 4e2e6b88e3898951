"""A write is its locks and its statement in one round trip; a turn's writes share a transaction.

What the client sends is read from libpq's own protocol trace (:mod:`tests.wire`).
"""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest
from sqlalchemy import text

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

        for action in (add, append):
            kinds = await sent(pgconn, action)
            # the lock statement and the write, each bound and executed, before one Sync:
            # no BEGIN, no COMMIT (one implicit transaction)
            assert round_trips(kinds) == 1, kinds
            assert kinds.count("Execute") == 2, kinds
            assert not any("BEGIN" in kind or "COMMIT" in kind for kind in kinds), kinds
        assert await _stored(store, user) == (1, 1)  # committed


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
        # BEGIN, the locks and the history row; the memory row (its user's lock is held
        # already); COMMIT
        assert round_trips(kinds) == 3, kinds
        assert kinds.count("Execute") == 4, kinds
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
