"""Tenant binding: scopes and history keys come from the user the application binds
(``user_id=``), never from the session dict a client sends back.

The attack: the application restores a session from a client-supplied dict in which the
client forged both a user id (``state["user_id"] = bob``) and the providers' records of bob's
scopes, while the application binds the authenticated user, alice. Every provider must refuse
before anything is read or written; a dict without records reads and writes only alice's rows.
The assertions are on the model's requests and on the tables.
"""

from __future__ import annotations

import contextvars
import uuid
from typing import Any

import pytest
from agent_framework import Agent, AgentSession
from pydantic import BaseModel
from sqlalchemy import text as sql

from pgmemory import (
    ChatHistoryMemoryProvider,
    FactMemoryProvider,
    MemoryScope,
    MemoryStore,
    PostgresHistoryProvider,
    ScopeError,
)
from tests.conftest import unique
from tests.openai_server import OpenAIServer, json_reply, text


class Facts(BaseModel):
    phone: str | None = None


#: The authenticated user of the current request, as the application's sign-in binds it.
SIGNED_IN: contextvars.ContextVar[str | None] = contextvars.ContextVar("signed_in", default=None)


def signed_in(session: AgentSession) -> str:
    """The application's resolver: the request's user, whatever the session dict says."""
    user = SIGNED_IN.get()
    return user if user is not None else ""


def build(store: MemoryStore, client: Any, collection: str) -> Agent:
    return Agent(
        client,
        "Be brief.",
        context_providers=[
            PostgresHistoryProvider(store, user_id=signed_in),
            ChatHistoryMemoryProvider(store, collection, user_id=signed_in),
            FactMemoryProvider(store, client, Facts, user_id=signed_in),
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


async def test_a_forged_user_id_and_forged_records_read_and_write_nothing_of_bob(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, chat_client: Any
) -> None:
    agent = build(store, chat_client, collection)
    alice, bob = unique("alice"), unique("bob")

    # Bob's turn: his phone number is now in history, memory and facts.
    SIGNED_IN.set(bob)
    bob_session = agent.create_session()
    openai_server.queue(text("Noted."), json_reply({"phone": "+1 555 0100"}))
    await agent.run("My phone is +1 555 0100", session=bob_session)
    bob_before = await counts(store, collection, bob)
    assert bob_before["memories"] == 2 and bob_before["history"] == 2 and bob_before["facts"] == 1
    requests_before = len(openai_server.requests)

    # Alice's client sends bob's session back, with a user id of its own making; the
    # application binds alice, as it must.
    forged = bob_session.to_dict()
    forged["state"]["user_id"] = bob
    attacks = {
        "bob's whole session": forged,
        "a fresh session naming bob's scopes": {
            "session_id": str(uuid.uuid4()),
            "state": {k: v for k, v in forged["state"].items() if k != "postgres_history"},
        },
    }
    SIGNED_IN.set(alice)
    for label, data in attacks.items():
        session = AgentSession.from_dict(data)
        with pytest.raises(ScopeError) as info:
            await agent.run("What is my phone number?", session=session)
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

    # Without the records, bob's session id alone reads nothing of bob: the history is keyed
    # by (alice, session id), the memories and facts by alice.
    stripped = AgentSession.from_dict(
        {"session_id": bob_session.session_id, "state": {"user_id": bob}}
    )
    openai_server.queue(text("I don't know it."), json_reply({"phone": None}))
    await agent.run("What is my phone number?", session=stripped)
    sent = "\n".join(
        str(m.get("content")) for m in openai_server.requests[requests_before]["messages"]
    )
    assert "555 0100" not in sent
    assert await counts(store, collection, bob) == bob_before
    assert (await counts(store, collection, alice))["history"] == 2


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
    chat_client: Any,
    provider_key: str,
    field: str,
) -> None:
    agent = build(store, chat_client, collection)
    SIGNED_IN.set(unique("alice"))
    session = agent.create_session()
    openai_server.queue(text("Hi."), json_reply({"phone": None}))
    await agent.run("hello", session=session)
    record: dict[str, Any] = session.state[provider_key]
    if field == "user_id":
        record[field] = unique("bob")
    else:
        record[field] = {**record[field], "user_id": unique("bob")}
    requests_before = len(openai_server.requests)
    with pytest.raises(ScopeError, match=rf"recorded '{field}' differs"):
        await agent.run("hello again", session=session)
    assert len(openai_server.requests) == requests_before


async def test_the_scopes_follow_the_bound_user_not_the_first_run(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, chat_client: Any
) -> None:
    """The resolver runs on every run: a session whose bound user changes is refused."""
    agent = build(store, chat_client, collection)
    SIGNED_IN.set(unique("alice"))
    session = agent.create_session()
    openai_server.queue(text("Hi."), json_reply({"phone": None}))
    await agent.run("hello", session=session)
    SIGNED_IN.set(unique("mallory"))
    with pytest.raises(ScopeError):
        await agent.run("hello", session=session)
    # Moving a session on purpose: drop the providers' records, then run again.
    for key in ("postgres_history", "ChatHistoryMemoryProvider", "fact_memory"):
        del session.state[key]
    openai_server.queue(text("Hi."), json_reply({"phone": None}))
    await agent.run("hello", session=session)


async def test_a_missing_binding_is_a_clear_error_and_nothing_is_kept(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    history = PostgresHistoryProvider(store, user_id=signed_in)
    agent = Agent(chat_client, context_providers=[history])
    SIGNED_IN.set(None)  # the application forgot to bind the user
    session = agent.create_session()
    session.state["user_id"] = "bob"  # ...and a client-sent id is never a fallback
    with pytest.raises(ScopeError, match="user_id resolver returned a blank string"):
        await agent.run("my phone is +1 555 0100", session=session)
    assert openai_server.requests == []
    assert await store.count_history(session.session_id, user_id="bob") == 0
    assert await store.count_history(session.session_id) == 0
    assert session.state["postgres_history"] == {}

    # Bound later, the session works and its history is the user's (found by erase_user).
    user = unique("carol")
    SIGNED_IN.set(user)
    openai_server.queue(text("Noted."))
    await agent.run("my phone is +1 555 0100", session=session)
    assert await store.count_history(session.session_id, user_id=user) == 2
    erased = await store.erase_user(user)
    assert erased["history_messages"] == 2
    assert await store.count_history(session.session_id, user_id=user) == 0

    with pytest.raises(ScopeError, match="never falls back"):
        PostgresHistoryProvider(store, user_id="")


async def test_a_session_pinned_to_the_empty_user_is_refused(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    """Sessions recorded by earlier versions under user '' are not silently continued."""
    history = PostgresHistoryProvider(store, user_id=unique("dave"))
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()
    session.state["postgres_history"] = {"session_id": session.session_id, "user_id": ""}
    with pytest.raises(ScopeError, match="recorded 'user_id' differs"):
        await agent.run("hi", session=session)
    assert openai_server.requests == []


async def test_history_refuses_another_session_id(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("erin")
    history = PostgresHistoryProvider(store, user_id=user)
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()
    session.state["postgres_history"] = {"session_id": str(uuid.uuid4()), "user_id": user}
    with pytest.raises(ScopeError, match="recorded 'session_id' differs"):
        await agent.run("hi", session=session)
    assert openai_server.requests == []


async def test_direct_history_calls_need_the_bound_keys(store: MemoryStore) -> None:
    history = PostgresHistoryProvider(store, user_id=unique("frank"))
    session = AgentSession()
    with pytest.raises(ScopeError, match="keeps the history per user"):
        await history.get_messages(session.session_id)
    with pytest.raises(ScopeError, match="keeps the history per user"):
        await history.get_messages(session.session_id, state={})
    assert await history.messages(session) == []
    with pytest.raises(ScopeError, match="recorded session id differs"):
        await history.get_messages("another", state=session.state["postgres_history"])


async def test_memory_search_scope_must_carry_the_bound_user(
    store: MemoryStore, collection: str
) -> None:
    def someone_else(user_id: str, session: AgentSession) -> ChatHistoryMemoryProvider.State:
        return ChatHistoryMemoryProvider.State(
            storage_scope=MemoryScope(user_id=user_id), search_scope=MemoryScope(user_id="bob")
        )

    memory = ChatHistoryMemoryProvider(store, collection, user_id="alice", scopes=someone_else)
    with pytest.raises(ScopeError, match="search scope from scopes\\(\\) does not carry"):
        memory.get_state(AgentSession())
