"""PostgreSQL history in agent-framework's Agent: ordered, paginated, deduplicated, one
transaction per run, kept across a simulated restart (a new store object on the same
database), reduced by the framework's compaction before the model, and readable from rows
written before 0.3."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    CompactionProvider,
    ContextProvider,
    InMemoryHistoryProvider,
    Message,
    SlidingWindowStrategy,
    TruncationStrategy,
    tool,
)
from agent_framework.exceptions import ChatClientException

from pgmemory import ChatHistoryMemoryProvider, MemoryScope, PostgresHistoryProvider
from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore
from tests.agents import injected
from tests.conftest import unique
from tests.openai_server import OpenAIServer, call, error, text, tool_calls


def _sent(server: OpenAIServer) -> list[tuple[str, str | None]]:
    return [(m["role"], m.get("content")) for m in server.last_request["messages"]]


def get_menu() -> list[str]:
    """The menu."""
    return ["番茄炒蛋", "清炒菜心"]


async def test_history_survives_a_restart(
    database_url: str, settings: Settings, openai_server: OpenAIServer, chat_client: Any
) -> None:
    menu = tool(get_menu, name="get_menu")
    # --- first process ---------------------------------------------------------------------
    async with MemoryStore(database_url, settings=settings) as store:
        history = PostgresHistoryProvider(store, user_id="alice")
        agent = Agent(chat_client, "Order food.", tools=[menu], context_providers=[history])
        session = agent.create_session(session_id=f"conv-{uuid.uuid4().hex[:8]}")
        openai_server.queue(
            tool_calls(call("get_menu", {}, id="m1")),
            text("We have 番茄炒蛋 and 清炒菜心."),
        )
        await agent.run("我不能吃辣，菜单有什么？", session=session)
        saved = json.dumps(session.to_dict())
        assert await store.count_history(session.session_id, user_id="alice") == 4

    # --- second process: new store object, new agent, session restored from JSON ---------------
    async with MemoryStore(database_url, settings=settings) as store2:
        provider = PostgresHistoryProvider(store2, user_id="alice")
        agent2 = Agent(chat_client, "Order food.", tools=[menu], context_providers=[provider])
        restored = AgentSession.from_dict(json.loads(saved))
        openai_server.queue(text("OK, 番茄炒蛋."))
        response = await agent2.run("点一份不辣的", session=restored)
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
        rows = await store2.read_history(restored.session_id, user_id="alice")
        assert [r.seq for r in rows] == sorted(r.seq for r in rows)
        assert rows[0].message["text"] == "我不能吃辣，菜单有什么？"  # for SQL readers
        assert rows[0].message["additional_properties"]["pgmemory.created_at"]
        # the history key travels in the session state, not in the provider object
        assert restored.state["postgres_history"] == {
            "session_id": restored.session_id,
            "user_id": "alice",
        }
        assert await provider.clear(restored) == 6
        assert await provider.messages(restored) == []


async def test_pagination_dedup_and_failed_runs(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")
    provider = PostgresHistoryProvider(store, page_size=2, user_id=user)
    agent = Agent(chat_client, context_providers=[provider])
    session = agent.create_session()
    openai_server.queue(text("r1"), text("r2"), text("r3"))
    for q in ("q1", "q2", "q3"):
        await agent.run(q, session=session)
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
    state = session.state[provider.source_id]
    await provider.save_messages(session.session_id, again, state=state)
    assert await store.count_history(session.session_id, user_id=user) == 6

    # a failed model call stores nothing
    openai_server.queue(error(400, "boom"))
    with pytest.raises(ChatClientException):
        await agent.run("q4", session=session)
    assert await store.count_history(session.session_id, user_id=user) == 6


class Remembers(ContextProvider):
    """A framework provider that injects one memory message."""

    async def before_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        context.extend_messages(self, [Message("user", ["remembered: no spicy food"])])


async def test_audit_recorder_beside_the_framework_history(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")
    audit = PostgresHistoryProvider(
        store, "audit", user_id=user, load_messages=False, store_context_messages=True
    )
    primary = InMemoryHistoryProvider()
    agent = Agent(chat_client, context_providers=[primary, Remembers("memory"), audit])
    session = agent.create_session()
    openai_server.queue(text("a1"), text("a2"))
    await agent.run("u1", session=session)
    await agent.run("u2", session=session)
    recorded = await audit.messages(session)
    sources = [
        (m.text, (m.additional_properties.get("pgmemory.attribution") or {}).get("source_id"))
        for m in recorded
    ]
    # The injected memory is recorded with its provider's attribution; the framework's own
    # history (loaded, so stamped by it) is not recorded twice.
    assert sources == [
        ("remembered: no spicy food", "memory"),
        ("u1", None),
        ("a1", None),
        ("remembered: no spicy food", "memory"),
        ("u2", None),
        ("a2", None),
    ]

    with pytest.raises(InvalidInputError, match="page_size=0"):
        PostgresHistoryProvider(store, page_size=0, user_id=user)
    with pytest.raises(ScopeError, match="user_id is nothing"):
        PostgresHistoryProvider(store, user_id=None)  # type: ignore[arg-type]


async def test_after_run_compaction_is_refused_and_before_run_reduces_what_is_sent(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any, collection: str
) -> None:
    user = unique("u")
    history = PostgresHistoryProvider(store, user_id=user)
    rewriting = CompactionProvider(
        after_strategy=SlidingWindowStrategy(keep_last_groups=2),
        history_source_id=history.source_id,
    )
    agent = Agent(chat_client, context_providers=[history, rewriting])
    with pytest.raises(InvalidInputError, match="audit record and is never rewritten"):
        await agent.run("hi", session=agent.create_session())
    assert openai_server.requests == []

    # The order the README recommends: history, then compaction, then pgmemory's memory, so
    # the compaction reduces the loaded history and the injected memory block always survives.
    memory = ChatHistoryMemoryProvider(store, collection, user_id=user)
    compaction = CompactionProvider(before_strategy=TruncationStrategy(max_n=2, compact_to=2))
    agent = Agent(chat_client, context_providers=[history, compaction, memory])
    session = agent.create_session()
    openai_server.queue(*(text(f"a{i}") for i in range(4)))
    for i in range(4):
        await agent.run(f"I like dish number {i}", session=session)
    last = openai_server.last_request
    users = [m["content"] for m in last["messages"] if m["role"] == "user"]
    assert "I like dish number 0" not in users  # truncated from the loaded history...
    assert len(injected(last)) == 1  # ...while the memory block is still there
    assert "I like dish number 0" in injected(last)[0]
    # Everything stays stored: the truncation only shapes what the model is sent.
    assert await store.count_history(session.session_id, user_id=user) == 8


async def test_rows_written_before_0_3_read_back(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")
    session_id = f"old-{uuid.uuid4().hex[:8]}"
    # Rows as pgmemory's own runtime wrote them (its Message.to_dict()).
    old = [
        {"message_id": "1", "role": "user", "text": "我叫 Alice", "created_at": "2025-01-01T00:00:00+00:00",
         "contents": [{"type": "text", "text": "我叫 Alice"}], "source_type": "external"},
        {"message_id": "2", "role": "assistant", "text": "",
         "contents": [{"type": "function_call", "call_id": "c1", "name": "get_menu", "arguments": "{}"}]},
        {"message_id": "3", "role": "tool", "text": "",
         "contents": [{"type": "function_result", "call_id": "c1", "result": ["番茄炒蛋"]}]},
        {"message_id": "4", "role": "assistant", "text": "您好 Alice",
         "contents": [{"type": "text", "text": "您好 Alice"}]},
    ]  # fmt: skip
    await store.append_history(session_id, old, user_id=user)
    history = PostgresHistoryProvider(store, user_id=user)
    agent = Agent(chat_client, tools=[tool(get_menu, name="get_menu")], context_providers=[history])
    openai_server.queue(text("您叫 Alice。"))
    await agent.run("我叫什么？", session=AgentSession(session_id=session_id))
    sent = openai_server.last_request["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "user"]
    assert sent[0]["content"] == "我叫 Alice" and sent[2]["tool_call_id"] == "c1"
    assert "番茄炒蛋" in sent[2]["content"]


async def test_per_service_call_persistence_keeps_every_model_call(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any, collection: str
) -> None:
    """With the framework's per-service-call persistence, the history is appended after every
    model call (so a crash mid-loop keeps what was done); pgmemory's memory still stores the
    turn once, after the run."""
    user = unique("u")
    history = PostgresHistoryProvider(store, user_id=user)
    memory = ChatHistoryMemoryProvider(store, collection, user_id=user)
    agent = Agent(
        chat_client,
        tools=[tool(get_menu, name="get_menu")],
        context_providers=[history, memory],
        require_per_service_call_history_persistence=True,
    )
    session = agent.create_session()
    openai_server.queue(tool_calls(call("get_menu", {})), text("We have 番茄炒蛋."))
    await agent.run("菜单有什么？", session=session)
    kept = await history.messages(session)
    assert [str(m.role) for m in kept] == ["user", "assistant", "tool", "assistant"]
    assert await store.count(collection, MemoryScope(user_id=user)) == 4
    openai_server.queue(text("好的。"))
    await agent.run("谢谢", session=session)
    assert "菜单有什么？" in [m.get("content") for m in openai_server.last_request["messages"]]
