"""Tenant binding: scopes and history keys come from what the application binds, never from
the session dict a client sends back.

The attack: the application restores a session from a client-supplied dict and binds the
authenticated user (``session.state["user_id"] = "alice"``), but the providers' records in
that dict name bob's scopes. Every provider must refuse before anything is read or written;
the assertions are on the model's requests and on the tables.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import text as sql

from pgmemory import Agent, AgentSession, MemoryScope, MemoryStore, OpenAIChatClient, ScopeError
from pgmemory.memory import ChatHistoryMemoryProvider, FactMemoryProvider, PostgresHistoryProvider
from tests.conftest import unique
from tests.openai_server import OpenAIServer, json_reply, text


class Facts(BaseModel):
    phone: str | None = None


def per_user(session: AgentSession) -> ChatHistoryMemoryProvider.State:
    """The application's initializer: scopes from the user id it bound to the session."""
    user_id = session.state.get("user_id")
    if not isinstance(user_id, str):
        raise ScopeError("no user bound")
    return ChatHistoryMemoryProvider.State(
        storage_scope=MemoryScope(user_id=user_id, session_id=session.session_id),
        search_scope=MemoryScope(user_id=user_id),
    )


def build(store: MemoryStore, client: OpenAIChatClient, collection: str) -> Agent:
    return Agent(
        client,
        "Be brief.",
        context_providers=[
            PostgresHistoryProvider(store),
            ChatHistoryMemoryProvider(store, collection, state_initializer=per_user),
            FactMemoryProvider(
                store, client, Facts, state_initializer=FactMemoryProvider.scope_from_session()
            ),
        ],
    )


async def counts(store: MemoryStore, collection: str, user_id: str) -> dict[str, int]:
    """Everything stored for, or recalled about, one user."""
    async with store.engine.connect() as conn:
        row = (
            (
                await conn.execute(
                    sql(
                        """
                    SELECT
                      (SELECT count(*) FROM pgmemory_memories
                        WHERE collection = :c AND user_id = :u) AS memories,
                      (SELECT count(*) FROM pgmemory_chat_messages WHERE user_id = :u) AS history,
                      (SELECT count(*) FROM pgmemory_facts WHERE user_id = :u) AS facts,
                      (SELECT count(*) FROM pgmemory_recall_audit WHERE user_id = :u) AS recalls
                    """
                    ),
                    {"c": collection, "u": user_id},
                )
            )
            .mappings()
            .one()
        )
    return dict(row)


async def test_a_tampered_session_dict_reads_and_writes_nothing_of_bob(
    store: MemoryStore,
    collection: str,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
) -> None:
    agent = build(store, chat_client, collection)
    alice, bob = unique("alice"), unique("bob")

    # Bob's turn: his phone number is now in history, memory and facts.
    bob_session = agent.create_session()
    bob_session.state["user_id"] = bob
    openai_server.queue(text("Noted."), json_reply({"phone": "+1 555 0100"}))
    await agent.run("My phone is +1 555 0100", bob_session)
    bob_before = await counts(store, collection, bob)
    assert bob_before["memories"] == 2 and bob_before["history"] == 2 and bob_before["facts"] == 1
    requests_before = len(openai_server.requests)

    # The client sends bob's session dict back; the application binds alice, as it must.
    attacks = {
        "bob's whole session": bob_session.to_dict(),
        "a fresh session naming bob's scopes": {
            "session_id": str(uuid.uuid4()),
            "state": {
                key: value
                for key, value in bob_session.to_dict()["state"].items()
                if key != "postgres_history"
            },
        },
    }
    for label, data in attacks.items():
        session = agent.deserialize_session(data)
        session.state["user_id"] = alice  # what the application binds from its authentication
        with pytest.raises(ScopeError) as info:
            await agent.run("What is my phone number?", session)
        message = str(info.value)
        assert bob not in message and alice not in message, label  # names fields, not values
        assert "differs from what the application binds" in message, label

    # Nothing was sent to the model, nothing of bob's was read or recalled, nothing written.
    assert len(openai_server.requests) == requests_before
    assert await counts(store, collection, bob) == bob_before
    assert await counts(store, collection, alice) == {
        "memories": 0,
        "history": 0,
        "facts": 0,
        "recalls": 0,
    }


@pytest.mark.parametrize(
    "provider_key, field",
    [
        ("ChatHistoryMemoryProvider", "search_scope"),
        ("fact_memory", "scope"),
        ("postgres_history", "user_id"),
    ],
)
async def test_each_provider_refuses_its_own_tampered_record(
    store: MemoryStore,
    collection: str,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
    provider_key: str,
    field: str,
) -> None:
    agent = build(store, chat_client, collection)
    alice = unique("alice")
    session = agent.create_session()
    session.state["user_id"] = alice
    openai_server.queue(text("Hi."), json_reply({"phone": None}))
    await agent.run("hello", session)
    record: dict[str, Any] = session.state[provider_key]
    if field == "user_id":
        record[field] = unique("bob")
    else:
        record[field] = {**record[field], "user_id": unique("bob")}
    requests_before = len(openai_server.requests)
    with pytest.raises(ScopeError, match=rf"\['{provider_key}'\]\['{field}'\] differs"):
        await agent.run("hello again", session)
    assert len(openai_server.requests) == requests_before


async def test_the_scopes_follow_the_bound_user_not_the_first_run(
    store: MemoryStore,
    collection: str,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
) -> None:
    """The initializer runs on every run: a session whose bound user changes is refused."""
    agent = build(store, chat_client, collection)
    session = agent.create_session()
    session.state["user_id"] = unique("alice")
    openai_server.queue(text("Hi."), json_reply({"phone": None}))
    await agent.run("hello", session)
    session.state["user_id"] = unique("mallory")
    with pytest.raises(ScopeError):
        await agent.run("hello", session)
    # Moving a session on purpose: drop the providers' records, then run again.
    for key in ("postgres_history", "ChatHistoryMemoryProvider", "fact_memory"):
        del session.state[key]
    openai_server.queue(text("Hi."), json_reply({"phone": None}))
    await agent.run("hello", session)


async def test_history_refuses_a_missing_user_instead_of_pinning_the_empty_one(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    history = PostgresHistoryProvider(store)
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()  # the application forgot to bind the user
    with pytest.raises(ScopeError, match=r"session.state\['user_id'\] holds no user id"):
        await agent.run("my phone is +1 555 0100", session)
    assert openai_server.requests == []
    assert await store.count_history(session.session_id) == 0
    assert "postgres_history" not in session.state or session.state["postgres_history"] == {}

    # Bound later, the session works and its history is the user's (found by erase_user).
    user = unique("carol")
    session.state["user_id"] = user
    openai_server.queue(text("Noted."))
    await agent.run("my phone is +1 555 0100", session)
    assert await store.count_history(session.session_id, user_id=user) == 2
    erased = await store.erase_user(user)
    assert erased["history_messages"] == 2
    assert await store.count_history(session.session_id, user_id=user) == 0


async def test_a_session_pinned_to_the_empty_user_is_refused(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    """Sessions recorded by earlier versions under user '' are not silently continued."""
    history = PostgresHistoryProvider(store)
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()
    session.state["postgres_history"] = {"session_id": session.session_id, "user_id": ""}
    session.state["user_id"] = unique("dave")
    with pytest.raises(ScopeError, match=r"\['postgres_history'\]\['user_id'\] differs"):
        await agent.run("hi", session)
    assert openai_server.requests == []


async def test_history_refuses_another_session_id(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    history = PostgresHistoryProvider(store)
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()
    session.state["user_id"] = unique("erin")
    session.state["postgres_history"] = {
        "session_id": str(uuid.uuid4()),
        "user_id": session.state["user_id"],
    }
    with pytest.raises(ScopeError, match=r"\['postgres_history'\]\['session_id'\] differs"):
        await agent.run("hi", session)
    assert openai_server.requests == []


async def test_single_tenant_history_needs_no_user_and_ignores_a_recorded_one(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    history = PostgresHistoryProvider(store, user_id_key=None)
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()
    session.state["postgres_history"] = {"session_id": session.session_id, "user_id": "bob"}
    openai_server.queue(text("Hello."))
    await agent.run("hi", session)
    assert await store.count_history(session.session_id) == 2  # under user ''
    assert await store.count_history(session.session_id, user_id="bob") == 0
    assert session.state["postgres_history"] == {"session_id": session.session_id}


async def test_direct_history_calls_need_the_bound_keys(store: MemoryStore) -> None:
    history = PostgresHistoryProvider(store)
    session = AgentSession()
    with pytest.raises(ScopeError, match="keeps the history per user"):
        await history.get_messages(session.session_id)
    with pytest.raises(ScopeError, match="keeps the history per user"):
        await history.get_messages(session.session_id, state={})
    session.state["user_id"] = unique("frank")
    assert await history.messages(session) == []
    with pytest.raises(ScopeError, match="recorded session id differs"):
        await history.get_messages("another", state=session.state["postgres_history"])
