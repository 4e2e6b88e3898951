"""Turns never half-happen: pgmemory's providers of one agent-framework run commit all or
nothing.

agent-framework calls ``after_run`` in reverse list order and stops at the first error;
pgmemory's providers run their writes together when the framework reaches the first of them
(:mod:`pgmemory.integrations.agent_framework.turn`). A framework provider whose ``after_run``
crashes between the history and the memory providers leaves none of the turn in the database,
and the client's retry leaves exactly one copy in history, memory and facts. Below that, the
store's shared transaction itself.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from agent_framework import Agent, AgentSession, ContextProvider
from pydantic import BaseModel

from pgmemory import (
    ChatHistoryMemoryProvider,
    FactMemoryProvider,
    MemoryRecord,
    MemoryScope,
    MemoryStore,
    PostgresHistoryProvider,
)
from pgmemory.errors import TurnWriteFailedError
from tests.conftest import unique
from tests.openai_server import OpenAIServer, json_reply, text
from tests.wire import one_connection_store, sent

PHONE = "my phone number is +1 555 0100"


class Facts(BaseModel):
    phone: str | None = None


class Crash(ContextProvider):
    """A framework (non-pgmemory) provider that fails its after_run while armed."""

    def __init__(self) -> None:
        super().__init__("crash")
        self.armed = True

    async def after_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        if self.armed:
            raise RuntimeError("crashed")


async def stored(
    store: MemoryStore, collection: str, session: AgentSession, user: str
) -> dict[str, Any]:
    history = await store.read_history(session.session_id, user_id=user)
    memories = await store.list(collection, MemoryScope(user_id=user), newest_first=False)
    facts = await store.get_facts("fact_memory", MemoryScope(user_id=user))
    return {
        "history": [row.message["text"] for row in history],
        "memories": [m.content for m in memories],
        "facts": facts,
    }


def providers(store: MemoryStore, collection: str, client: Any, user: str, *middle: Any) -> list:
    return [
        PostgresHistoryProvider(store, user_id=user),
        *middle,
        ChatHistoryMemoryProvider(store, collection, user_id=user),
        FactMemoryProvider(store, client, Facts, user_id=user),
    ]


async def test_a_crash_between_providers_keeps_none_of_the_turn_and_the_retry_one_copy(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, chat_client: Any
) -> None:
    crash = Crash()
    user = unique("alice")
    agent = Agent(
        chat_client,
        "Be brief.",
        context_providers=providers(store, collection, chat_client, user, crash),
    )
    session = agent.create_session()

    openai_server.queue(text("Noted."))
    with pytest.raises(RuntimeError, match="crashed"):
        await agent.run(PHONE, session=session)
    assert len(openai_server.requests) == 1  # no fact extraction for a turn that failed
    # None of the turn: history, memories and facts all wait for the first pgmemory provider
    # in list order, which the framework never reached.
    assert await stored(store, collection, session, user) == {
        "history": [],
        "memories": [],
        "facts": {},
    }

    # The client retries the same message: exactly one copy of the turn.
    crash.armed = False
    openai_server.queue(text("Noted."), json_reply({"phone": "+1 555 0100"}))
    await agent.run(PHONE, session=session)
    assert await stored(store, collection, session, user) == {
        "history": [PHONE, "Noted."],
        "memories": [PHONE, "Noted."],
        "facts": {"phone": "+1 555 0100"},
    }


async def test_a_failing_pgmemory_write_rolls_back_the_others(
    store: MemoryStore,
    collection: str,
    openai_server: OpenAIServer,
    chat_client: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = unique("bob")
    agent = Agent(chat_client, context_providers=providers(store, collection, chat_client, user))
    session = agent.create_session()

    async def add_fails(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the database went away")

    with monkeypatch.context() as patch:
        patch.setattr(store, "add", add_fails)
        openai_server.queue(text("Noted."), json_reply({"phone": "+1 555 0100"}))
        with pytest.raises(ConnectionError):
            await agent.run(PHONE, session=session)
    # The history was appended first (list order) and rolled back with the failed memory.
    assert await stored(store, collection, session, user) == {
        "history": [],
        "memories": [],
        "facts": {},
    }
    openai_server.queue(text("Noted."), json_reply({"phone": "+1 555 0100"}))
    await agent.run(PHONE, session=session)
    assert (await stored(store, collection, session, user))["memories"] == [PHONE, "Noted."]


async def test_fact_extraction_runs_before_the_transaction_opens(
    store: MemoryStore, database_url: str, openai_server: OpenAIServer, chat_client: Any
) -> None:
    """The extraction's model call happens with no transaction of the store open, even with
    the history provider (which writes first) before the fact provider."""
    engine = sa.create_engine(database_url)
    open_transactions: list[int] = []

    def model(request: dict[str, Any]) -> Any:
        if request.get("response_format"):
            with engine.connect() as conn:
                open_transactions.append(
                    conn.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND application_name = 'pgmemory' "
                            "AND state LIKE 'idle in transaction%'"
                        )
                    ).scalar_one()
                )
            return {"phone": "+1 555 0199"}
        return "Noted."

    openai_server.responder = model
    user = unique("carol")
    agent = Agent(
        chat_client,
        context_providers=[
            PostgresHistoryProvider(store, user_id=user),
            FactMemoryProvider(store, chat_client, Facts, user_id=user),
        ],
    )
    session = agent.create_session()
    try:
        await agent.run("call me on +1 555 0199", session=session)
    finally:
        engine.dispose()
    assert open_transactions == [0]
    assert await store.get_facts("fact_memory", MemoryScope(user_id=user)) == {
        "phone": "+1 555 0199"
    }
    assert await store.count_history(session.session_id, user_id=user) == 2


# --- the store's shared transaction ----------------------------------------------------------


def _records(user: str, *texts: str) -> list[MemoryRecord]:
    return [MemoryRecord(content=t, scope=MemoryScope(user_id=user)) for t in texts]


@pytest.fixture(params=[False, True], ids=["joined", "deferred"])
def deferred(request: pytest.FixtureRequest) -> bool:
    """A shared transaction whose writes each go when made, or with its commit."""
    return bool(request.param)


async def test_shared_transaction_commits_together_and_hides_until_then(
    store: MemoryStore, collection: str, deferred: bool
) -> None:
    user = unique("u")
    async with store.shared_transaction(deferred=deferred):
        await store.append_history("s1", [{"message_id": "m1", "role": "user"}], user_id=user)
        await store.add(collection, _records(user, "one"))
        async with store.shared_transaction():  # a nested block joins the outer one
            await store.merge_facts("ns", MemoryScope(user_id=user), {"k": 1})
        # Not committed yet: reads on other connections see nothing.
        assert await store.count_history("s1", user_id=user) == 0
        assert await store.count(collection, MemoryScope(user_id=user)) == 0
    assert await store.count_history("s1", user_id=user) == 1
    assert await store.count(collection, MemoryScope(user_id=user)) == 1
    assert await store.get_facts("ns", MemoryScope(user_id=user)) == {"k": 1}


async def test_shared_transaction_rolls_back_everything_on_error(
    store: MemoryStore, collection: str, deferred: bool
) -> None:
    user = unique("u")
    with pytest.raises(KeyError):
        async with store.shared_transaction(deferred=deferred):
            await store.append_history("s1", [{"message_id": "m1", "role": "user"}], user_id=user)
            await store.add(collection, _records(user, "one"))
            raise KeyError("boom")
    assert await store.count_history("s1", user_id=user) == 0
    assert await store.count(collection, MemoryScope(user_id=user)) == 0


async def test_a_failed_write_fails_the_block_even_when_its_error_is_caught(
    store: MemoryStore, collection: str
) -> None:
    """A joined write has no savepoint of its own: once one fails, later writes are refused
    and the block commits nothing, whatever the caller caught."""
    user = unique("u")
    with pytest.raises(TurnWriteFailedError, match="DataError"):
        async with store.shared_transaction():
            await store.add(collection, _records(user, "written before"))
            with pytest.raises(sa.exc.DataError):  # division by zero, inside a joined write
                async with store._db.write() as conn:
                    await conn.execute(sa.text("SELECT 1 / 0"))
            with pytest.raises(TurnWriteFailedError, match="earlier write"):
                await store.append_history(
                    "s2", [{"message_id": "m1", "role": "user"}], user_id=user
                )
    assert await store.count(collection, MemoryScope(user_id=user)) == 0
    assert await store.count_history("s2", user_id=user) == 0
    # The store is usable afterwards.
    await store.append_history("s2", [{"message_id": "m1", "role": "user"}], user_id=user)
    assert await store.count_history("s2", user_id=user) == 1


async def test_a_block_takes_each_lock_once_and_no_savepoints(
    store_url: str, embedder: Any
) -> None:
    """A turn's writes to one user and session: one lock statement (none on one server, where
    each write takes its locks itself), no SAVEPOINT, no SET."""
    user = unique("u")
    async with one_connection_store(store_url, embedder=embedder) as (store, pgconn):
        collection = unique("c")
        await store.create_collection(collection)

        async def turn(session: str) -> None:
            async with store.shared_transaction():
                await store.append_history(
                    session, [{"message_id": "m1", "role": "user"}], user_id=user
                )
                await store.add(collection, _records(user, f"one {session}"))
                await store.append_history(
                    session, [{"message_id": "m2", "role": "assistant"}], user_id=user
                )

        await turn("s0")  # the connection prepares its statements
        kinds = await sent(pgconn, lambda: turn("s1"))
        # BEGIN, (elsewhere: the erasure and append locks in one statement,) the three writes
        assert kinds.count("Execute") == (4 if store.database.locks_in_statement else 5), kinds
        assert kinds[-1] == "Query COMMIT", kinds
        assert not any("SAVEPOINT" in kind or "SET" in kind for kind in kinds), kinds
        assert await store.count_history("s1", user_id=user) == 2
        assert await store.count(collection, MemoryScope(user_id=user)) == 2


async def test_concurrent_writers_share_the_block(
    store: MemoryStore, collection: str, deferred: bool
) -> None:
    user = unique("u")
    async with store.shared_transaction(deferred=deferred):
        await asyncio.gather(
            *(
                store.append_history(f"s{i}", [{"message_id": "m", "role": "user"}], user_id=user)
                for i in range(5)
            ),
            store.add(collection, _records(user, "a", "b")),
        )
    assert [await store.count_history(f"s{i}", user_id=user) for i in range(5)] == [1] * 5
    assert await store.count(collection, MemoryScope(user_id=user)) == 2


async def test_a_deferred_blocks_queued_writes_go_first_and_in_order(store: MemoryStore) -> None:
    """A write that cannot wait (here a delete, through the store's transaction verb) sends the
    queued ones before it: the delete sees, and removes, the message appended before it."""
    user = unique("u")
    async with store.shared_transaction(deferred=True):
        assert (
            await store.append_history("s1", [{"message_id": "m1", "role": "user"}], user_id=user)
            == 1
        )
        await store.append_history("s2", [{"message_id": "m1", "role": "user"}], user_id=user)
        assert await store.delete_history("s1", user_id=user) == 1
        await store.append_history("s1", [{"message_id": "m2", "role": "user"}], user_id=user)
    assert [m.message["message_id"] for m in await store.read_history("s1", user_id=user)] == ["m2"]
    assert await store.count_history("s2", user_id=user) == 1


async def test_a_block_that_writes_nothing_takes_no_connection(store: MemoryStore) -> None:
    pool = store.engine.pool
    before = pool.checkedout()  # type: ignore[attr-defined]
    async with store.shared_transaction():
        assert pool.checkedout() == before  # type: ignore[attr-defined]
    assert pool.checkedout() == before  # type: ignore[attr-defined]


async def test_a_provider_creates_its_collection_even_inside_a_shared_transaction(
    store: MemoryStore,
) -> None:
    collection = f"c_{unique('late').replace('-', '_')}"
    memory = ChatHistoryMemoryProvider(store, collection, user_id="u")
    with pytest.raises(KeyError):
        async with store.shared_transaction():
            await store.append_history("s", [{"message_id": "m", "role": "user"}], user_id="u")
            await memory.collection()
            raise KeyError("the turn fails")
    assert (await store.get_collection(collection)).name == collection  # committed on its own
