"""Turns never half-happen: the database-backed providers of one run commit all or nothing.

A provider whose ``after_run`` crashes is placed between the history and the memory
providers; afterwards the database holds none of the turn, and the client's retry leaves
exactly one copy in history, memory and facts. Below that, the store's shared transaction
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from pgmemory import (
    Agent,
    AgentSession,
    ContextProvider,
    MemoryRecord,
    MemoryScope,
    MemoryStore,
    OpenAIChatClient,
)
from pgmemory.memory import ChatHistoryMemoryProvider, FactMemoryProvider, PostgresHistoryProvider
from pgmemory.runtime import AfterRunError
from tests.conftest import unique
from tests.openai_server import OpenAIServer, json_reply, text

PHONE = "my phone number is +1 555 0100"


class Facts(BaseModel):
    phone: str | None = None


class Crash(ContextProvider):
    """Fails its after_run while armed, with the user's text in the exception's message."""

    def __init__(self) -> None:
        super().__init__("crash")
        self.armed = True

    async def after_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        if self.armed:
            raise RuntimeError(f"crashed while handling {context.input_messages[0].text!r}")


def per_user(session: AgentSession) -> ChatHistoryMemoryProvider.State:
    user_id = session.state["user_id"]
    return ChatHistoryMemoryProvider.State(
        storage_scope=MemoryScope(user_id=user_id, session_id=session.session_id),
        search_scope=MemoryScope(user_id=user_id),
    )


async def stored(store: MemoryStore, collection: str, session: AgentSession) -> dict[str, Any]:
    user = session.state["user_id"]
    history = await store.read_history(session.session_id, user_id=user)
    memories = await store.list(collection, MemoryScope(user_id=user), newest_first=False)
    facts = await store.get_facts("fact_memory", MemoryScope(user_id=user))
    return {
        "history": [row.message["text"] for row in history],
        "memories": [m.content for m in memories],
        "facts": facts,
    }


async def test_a_crash_between_providers_keeps_none_of_the_turn_and_the_retry_one_copy(
    store: MemoryStore,
    collection: str,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
) -> None:
    crash = Crash()
    agent = Agent(
        chat_client,
        "Be brief.",
        context_providers=[
            PostgresHistoryProvider(store),
            crash,
            ChatHistoryMemoryProvider(store, collection, state_initializer=per_user),
            FactMemoryProvider(
                store, chat_client, Facts, state_initializer=FactMemoryProvider.scope_from_session()
            ),
        ],
    )
    user = unique("alice")
    session = agent.create_session()
    session.state["user_id"] = user

    openai_server.queue(text("Noted."), json_reply({"phone": "+1 555 0100"}))
    with pytest.raises(AfterRunError) as info:
        await agent.run(PHONE, session)
    failure = info.value
    assert failure.response.text == "Noted."
    assert [(source, type(exc)) for source, exc in failure.errors] == [("crash", RuntimeError)]
    # The message names providers and exception types only: no user text, no user id.
    assert PHONE not in str(failure) and user not in str(failure)
    assert "crash: RuntimeError" in str(failure)
    assert failure.__cause__ is None and failure.__suppress_context__
    # None of the turn: history, memories and facts all rolled back together.
    assert await stored(store, collection, session) == {"history": [], "memories": [], "facts": {}}

    # The client retries the same message: exactly one copy of the turn.
    crash.armed = False
    openai_server.queue(text("Noted."), json_reply({"phone": "+1 555 0100"}))
    await agent.run(PHONE, session)
    assert await stored(store, collection, session) == {
        "history": [PHONE, "Noted."],
        "memories": [PHONE, "Noted."],
        "facts": {"phone": "+1 555 0100"},
    }


async def test_a_failed_commit_rolls_back_every_provider(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    class FailsOnLeaving(ContextProvider):
        def unit_of_work(self, context: Any) -> contextlib.AbstractAsyncContextManager[None]:
            @contextlib.asynccontextmanager
            async def unit() -> AsyncIterator[None]:
                yield
                raise ConnectionError("the commit failed")

            return unit()

    agent = Agent(
        chat_client,
        context_providers=[PostgresHistoryProvider(store), FailsOnLeaving("late")],
    )
    session = agent.create_session()
    session.state["user_id"] = unique("bob")
    openai_server.queue(text("ok"))
    with pytest.raises(AfterRunError) as info:
        await agent.run("hello", session)
    assert [(source, type(exc)) for source, exc in info.value.errors] == [("late", ConnectionError)]
    assert await store.count_history(session.session_id, user_id=session.state["user_id"]) == 0


async def test_fact_extraction_runs_before_the_transaction_opens(
    store: MemoryStore,
    database_url: str,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
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
    agent = Agent(
        chat_client,
        context_providers=[
            PostgresHistoryProvider(store),
            FactMemoryProvider(
                store, chat_client, Facts, state_initializer=FactMemoryProvider.scope_from_session()
            ),
        ],
    )
    session = agent.create_session()
    session.state["user_id"] = unique("carol")
    try:
        await agent.run("call me on +1 555 0199", session)
    finally:
        engine.dispose()
    assert open_transactions == [0]
    assert await store.get_facts("fact_memory", MemoryScope(user_id=session.state["user_id"])) == {
        "phone": "+1 555 0199"
    }
    assert await store.count_history(session.session_id, user_id=session.state["user_id"]) == 2


# --- the store's shared transaction ----------------------------------------------------------


def _records(user: str, *texts: str) -> list[MemoryRecord]:
    return [MemoryRecord(content=t, scope=MemoryScope(user_id=user)) for t in texts]


async def test_shared_transaction_commits_together_and_hides_until_then(
    store: MemoryStore, collection: str
) -> None:
    user = unique("u")
    async with store.shared_transaction():
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
    store: MemoryStore, collection: str
) -> None:
    user = unique("u")
    with pytest.raises(KeyError):
        async with store.shared_transaction():
            await store.append_history("s1", [{"message_id": "m1", "role": "user"}], user_id=user)
            await store.add(collection, _records(user, "one"))
            raise KeyError("boom")
    assert await store.count_history("s1", user_id=user) == 0
    assert await store.count(collection, MemoryScope(user_id=user)) == 0


async def test_a_failed_write_inside_the_block_leaves_the_others_usable(
    store: MemoryStore, collection: str
) -> None:
    """Each joined write is a savepoint: a caller may catch a write's error and go on."""
    user = unique("u")
    async with store.shared_transaction():
        await store.add(collection, _records(user, "kept"))
        with pytest.raises(sa.exc.DataError):  # division by zero, inside a joined write
            async with store._db.write() as conn:
                await conn.execute(sa.text("SELECT 1 / 0"))
        await store.append_history("s2", [{"message_id": "m1", "role": "user"}], user_id=user)
    assert await store.count(collection, MemoryScope(user_id=user)) == 1
    assert await store.count_history("s2", user_id=user) == 1


async def test_concurrent_writers_share_the_block(store: MemoryStore, collection: str) -> None:
    user = unique("u")
    async with store.shared_transaction():
        await asyncio.gather(
            *(
                store.append_history(f"s{i}", [{"message_id": "m", "role": "user"}], user_id=user)
                for i in range(5)
            ),
            store.add(collection, _records(user, "a", "b")),
        )
    assert [await store.count_history(f"s{i}", user_id=user) for i in range(5)] == [1] * 5
    assert await store.count(collection, MemoryScope(user_id=user)) == 2


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
    memory = ChatHistoryMemoryProvider(store, collection, state_initializer=per_user)
    with pytest.raises(KeyError):
        async with store.shared_transaction():
            await store.append_history("s", [{"message_id": "m", "role": "user"}], user_id="u")
            await memory.collection()
            raise KeyError("the turn fails")
    assert (await store.get_collection(collection)).name == collection  # committed on its own
