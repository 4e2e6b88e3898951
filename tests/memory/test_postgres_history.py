"""PostgreSQL history: ordered, paginated, deduplicated, one transaction per run, and kept
across a simulated restart (a new store object on the same database)."""

from __future__ import annotations

import json
import uuid

import openai
import pytest

from pgmemory.errors import InvalidInputError
from pgmemory.memory.postgres_history import PostgresHistoryProvider
from pgmemory.runtime.agent import Agent
from pgmemory.runtime.history import InMemoryHistoryProvider
from pgmemory.runtime.messages import Message
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.providers import ContextProvider
from pgmemory.runtime.reducers import MessageCountingReducer
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore
from tests.openai_server import OpenAIServer, call, error, text, tool_calls


def _sent(server: OpenAIServer) -> list[tuple[str, str | None]]:
    return [(m["role"], m.get("content")) for m in server.last_request["messages"]]


async def test_history_survives_a_restart(
    database_url: str,
    settings: Settings,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
) -> None:
    def get_menu() -> list[str]:
        """The menu."""
        return ["番茄炒蛋", "清炒菜心"]

    # --- first process ---------------------------------------------------------------------
    async with MemoryStore(database_url, settings=settings) as store:
        agent = Agent(
            chat_client,
            "Order food.",
            tools=[get_menu],
            context_providers=[PostgresHistoryProvider(store)],
        )
        session = agent.create_session(f"conv-{uuid.uuid4().hex[:8]}")
        session.state["user_id"] = "alice"
        openai_server.queue(
            tool_calls(call("get_menu", {}, id="m1")),
            text("We have 番茄炒蛋 and 清炒菜心."),
        )
        await agent.run("我不能吃辣，菜单有什么？", session)
        saved = json.dumps(session.to_dict())
        assert await store.count_history(session.session_id, user_id="alice") == 4

    # --- second process: new store object, new agent, session restored from JSON ---------------
    async with MemoryStore(database_url, settings=settings) as store2:
        provider = PostgresHistoryProvider(store2)
        agent2 = Agent(chat_client, "Order food.", tools=[get_menu], context_providers=[provider])
        restored = agent2.deserialize_session(saved)
        openai_server.queue(text("OK, 番茄炒蛋."))
        response = await agent2.run("点一份不辣的", restored)
        assert response.text == "OK, 番茄炒蛋."
        sent = openai_server.last_request["messages"]
        assert [m["role"] for m in sent] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
        ]
        assert sent[1]["content"] == "我不能吃辣，菜单有什么？"
        assert sent[2]["tool_calls"][0]["id"] == "m1" and sent[3]["tool_call_id"] == "m1"
        stored = await provider.messages(restored)
        assert [m.text for m in stored][-2:] == ["点一份不辣的", "OK, 番茄炒蛋."]
        assert stored[0].source_type == "external"  # stored with their original stamps
        rows = await store2.read_history(restored.session_id, user_id="alice")
        assert [r.seq for r in rows] == sorted(r.seq for r in rows)
        assert rows[0].message["text"] == "我不能吃辣，菜单有什么？"
        # the history key travels in the session state, not in the provider object
        assert restored.state["postgres_history"] == {
            "session_id": restored.session_id,
            "user_id": "alice",
        }
        assert await provider.clear(restored) == 6
        assert await provider.messages(restored) == []


async def test_pagination_dedup_and_failed_runs(
    database_url: str,
    settings: Settings,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
) -> None:
    async with MemoryStore(database_url, settings=settings) as store:
        provider = PostgresHistoryProvider(store, page_size=2, user_id_key=None)  # single tenant
        agent = Agent(chat_client, context_providers=[provider])
        session = agent.create_session()
        openai_server.queue(text("r1"), text("r2"), text("r3"))
        for q in ("q1", "q2", "q3"):
            await agent.run(q, session)
        assert [m.text for m in await provider.messages(session)] == [
            "q1",
            "r1",
            "q2",
            "r2",
            "q3",
            "r3",
        ]
        assert _sent(openai_server)[:4] == [
            ("user", "q1"),
            ("assistant", "r1"),
            ("user", "q2"),
            ("assistant", "r2"),
        ]

        # saving the same messages again inserts nothing
        again = await provider.messages(session)
        state = session.state[provider.state_key]
        await provider.save_messages(session.session_id, again, state=state)
        assert await store.count_history(session.session_id) == 6

        # a failed model call stores nothing
        openai_server.queue(error(400, "boom"))
        with pytest.raises(openai.BadRequestError):
            await agent.run("q4", session)
        assert await store.count_history(session.session_id) == 6


async def test_audit_recorder_and_reducer(
    database_url: str,
    settings: Settings,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
) -> None:
    class Memory(ContextProvider):
        async def before_run(self, *, agent, session, context, state) -> None:  # type: ignore[override]
            context.extend_messages(self, Message("user", "remembered: no spicy food"))

    async with MemoryStore(database_url, settings=settings) as store:
        audit = PostgresHistoryProvider(
            store, "audit", load_messages=False, store_context_messages=True, user_id_key=None
        )
        primary = InMemoryHistoryProvider(reducer=MessageCountingReducer(2))
        agent = Agent(chat_client, context_providers=[primary, Memory("memory"), audit])
        session = agent.create_session()
        openai_server.queue(text("a1"), text("a2"))
        await agent.run("u1", session)
        await agent.run("u2", session)
        recorded = await audit.messages(session)
        assert [(m.text, m.source_id) for m in recorded] == [
            ("remembered: no spicy food", "memory"),
            ("u1", None),
            ("a1", None),
            ("remembered: no spicy food", "memory"),
            ("u2", None),
            ("a2", None),
        ]

    with pytest.raises(InvalidInputError, match="cannot apply a reducer after messages are added"):
        PostgresHistoryProvider(
            store, reducer=MessageCountingReducer(2), reducer_trigger="after_messages_added"
        )
    with pytest.raises(InvalidInputError, match="page_size=0"):
        PostgresHistoryProvider(store, page_size=0)


async def test_user_id_must_be_a_string(
    database_url: str,
    settings: Settings,
    openai_server: OpenAIServer,
    chat_client: OpenAIChatClient,
) -> None:
    async with MemoryStore(database_url, settings=settings) as store:
        agent = Agent(chat_client, context_providers=[PostgresHistoryProvider(store)])
        session = agent.create_session()
        session.state["user_id"] = 42
        with pytest.raises(InvalidInputError, match=r"session.state\['user_id'\] is of type int"):
            await agent.run("hi", session)
