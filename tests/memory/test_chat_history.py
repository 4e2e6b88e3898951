"""ChatHistoryMemoryProvider in agent-framework's Agent, through the framework's OpenAI client
and a local chat-completions server.

Assertions are on the requests the model received (recorded by the server), and on rows in
PostgreSQL.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import openai
import pytest
from agent_framework import Agent, AgentSession, ContextProvider, Message
from agent_framework.exceptions import ChatClientException
from sqlalchemy import text as sql

from pgmemory import (
    ChatHistoryMemoryProvider,
    ChatHistoryMemoryProviderOptions,
    MemoryScope,
    MemoryStore,
    ScopeError,
)
from tests.conftest import unique
from tests.openai_server import OpenAIServer, Reply, call, text, tool_calls

_spec = importlib.util.spec_from_file_location(
    "food_delivery", Path(__file__).resolve().parents[2] / "examples" / "food_delivery.py"
)
food = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(food)  # type: ignore[union-attr]

MEMORY_HEADING = "## Memories\nConsider the following memories when answering user questions:"


def model(request: dict[str, Any]) -> Reply:
    """The scripted model: the example's decision rule over the request the server received."""
    messages = request["messages"]
    transcript = [(m["role"], m.get("content") or "") for m in messages]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    called = [
        c["function"]["name"] for m in messages[last_user:] for c in m.get("tool_calls") or []
    ]
    step = food.decide(transcript, called)
    if "call" in step:
        return tool_calls(call(step["call"], step["arguments"]))
    return text(step["text"])


def memory_messages(request: dict[str, Any]) -> list[str]:
    return [
        m["content"]
        for m in request["messages"]
        if m["role"] == "user" and (m.get("content") or "").startswith(MEMORY_HEADING)
    ]


def orders(server: OpenAIServer, start: int) -> list[list[str]]:
    found = []
    for request in server.requests[start:]:
        for m in request["messages"]:
            for c in m.get("tool_calls") or []:
                if c["function"]["name"] == "PlaceOrder":
                    found.append(
                        sorted(i["dish"] for i in json.loads(c["function"]["arguments"])["items"])
                    )
    # each order appears again in every later request of the same turn: keep distinct calls
    unique_calls: list[list[str]] = []
    for o in found:
        if not unique_calls or unique_calls[-1] != o:
            unique_calls.append(o)
    return unique_calls


@pytest.fixture
async def food_store(store: MemoryStore) -> MemoryStore:
    await store.create_collection(food.COLLECTION)
    return store


async def order(agent: Agent, user: str, message: str) -> AgentSession:
    """One order in a fresh session, for ``user`` (bound as the application would)."""
    food.CURRENT_USER.set(user)
    session = agent.create_session()
    await agent.run(message, session=session)
    return session


SPICY = {"辣椒炒肉", "剁椒鱼头", "酸辣土豆丝"}


async def test_alice_keeps_no_spicy_and_bob_never_sees_alice(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    openai_server.responder = model
    agent = food.build_agent(chat_client, food_store)
    alice, bob = unique("alice"), unique("bob")
    await order(agent, alice, "帮我点一份外卖，一荤一素，我不能吃辣")
    for _ in range(3):
        start = len(openai_server.requests)
        await order(agent, alice, "帮我点一份外卖")
        first = openai_server.requests[start]
        (injected,) = memory_messages(first)
        assert "我不能吃辣" in injected
        assert not any(set(o) & SPICY for o in orders(openai_server, start))
        start = len(openai_server.requests)
        await order(agent, bob, "帮我点一份外卖")
        for request in openai_server.requests[start:]:
            for content in memory_messages(request):
                assert "我不能吃辣" not in content
                assert alice not in content
    # Bob's first order had no memories at all; his own later ones only his.
    rows = await food_store.list(food.COLLECTION, MemoryScope(user_id=bob), limit=100)
    assert rows and all(r.scope.user_id == bob for r in rows)


@pytest.mark.slow
async def test_different_from_last_order_twenty_times_out_of_twenty(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    openai_server.responder = model
    agent = food.build_agent(chat_client, food_store)
    alice = unique("alice")
    await order(agent, alice, "帮我点一份外卖，一荤一素，我不能吃辣")
    previous = orders(openai_server, 0)[-1]
    for run in range(20):
        start = len(openai_server.requests)
        await order(agent, alice, "帮我点一份外卖，和上次点的不一样")
        (injected,) = memory_messages(openai_server.requests[start])
        # The previous order is in what the model saw, every time...
        assert all(dish in injected.split("Most recent messages")[1] for dish in previous), run
        current = orders(openai_server, start)[-1]
        # ...so the new order differs from it, and stays spice-free.
        assert current != previous and not set(current) & SPICY, (run, previous, current)
        previous = current


async def test_on_demand_mode_exposes_only_the_search_tool(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")
    options = ChatHistoryMemoryProviderOptions(search_time="on_demand_function_calling")
    memory = ChatHistoryMemoryProvider(
        food_store, food.COLLECTION, user_id=food.current_user, options=options
    )
    agent = Agent(chat_client, "You help.", context_providers=[memory])
    openai_server.queue(text("noted"))
    await order(agent, user, "I can't eat peanuts")
    openai_server.queue(
        tool_calls(call("Search", {"userQuestion": "what can't I eat?"})),
        text("No peanuts for you."),
    )
    start = len(openai_server.requests)
    await order(agent, user, "Suggest a snack")
    first, second = openai_server.requests[start], openai_server.requests[start + 1]
    assert [t["function"]["name"] for t in first["tools"]] == ["Search"]
    search = first["tools"][0]["function"]
    assert (
        search["description"]
        == "Allows searching for related previous chat history to help answer the user question."
    )
    assert search["parameters"]["required"] == ["userQuestion"]
    assert search["parameters"]["properties"]["userQuestion"]["type"] == "string"
    assert memory_messages(first) == []
    tool_result = next(m for m in second["messages"] if m["role"] == "tool")
    assert "I can't eat peanuts" in tool_result["content"]


async def test_search_scope_broader_than_storage_scope(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")

    # The default scopes: stored per user and session, searched per user.
    memory = ChatHistoryMemoryProvider(food_store, food.COLLECTION, user_id=food.current_user)
    seen = Capture(memory.source_id)
    agent = Agent(chat_client, "You help.", context_providers=[memory, seen])
    openai_server.queue(text("ok"), text("ok"))
    first = await order(agent, user, "My favourite colour is teal")
    start = len(openai_server.requests)
    second = await order(agent, user, "What is my favourite colour?")
    (injected,) = memory_messages(openai_server.requests[start])
    assert "teal" in injected
    rows = await food_store.list(food.COLLECTION, MemoryScope(user_id=user), limit=10)
    assert {r.scope.session_id for r in rows} == {first.session_id, second.session_id}
    # The injected message carries the session it came from, and is stamped as the provider's.
    (message,) = seen.messages
    stamp = message.additional_properties["_attribution"]
    assert stamp["origin_session_ids"] == [first.session_id]
    assert stamp["source_id"] == memory.source_id


class Capture(ContextProvider):
    """Keeps what the watched provider injected in the latest run."""

    def __init__(self, watched: str) -> None:
        super().__init__("capture")
        self.watched = watched
        self.messages: list = []

    async def before_run(self, *, agent, session, context, state) -> None:
        self.messages = context.get_messages(sources={self.watched})


async def test_state_round_trips_through_to_dict(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")
    agent = food.build_agent(chat_client, food_store)
    openai_server.responder = model
    session = await order(agent, user, "帮我点一份外卖，我不能吃辣")
    data = json.loads(json.dumps(session.to_dict()))
    assert data["state"]["ChatHistoryMemoryProvider"]["storage_scope"]["user_id"] == user
    restored = AgentSession.from_dict(data)
    assert restored.to_dict() == session.to_dict()
    # The recorded scope never moves a session to another user: such a run is refused.
    food.CURRENT_USER.set("someone-else")
    start = len(openai_server.requests)
    with pytest.raises(ScopeError, match="recorded '(session|user)_id' differs"):
        await agent.run("帮我点一份外卖", session=restored)
    assert len(openai_server.requests) == start
    food.CURRENT_USER.set(user)
    await agent.run("帮我点一份外卖", session=restored)
    # The restored session's history carries the earlier turn; the memory does not repeat it.
    sent = openai_server.requests[start]
    assert [m.get("content") for m in sent["messages"]].count("帮我点一份外卖，我不能吃辣") == 1
    assert not any("我不能吃辣" in injected for injected in memory_messages(sent))
    # A fresh session of the same user has no such history: the memory brings it in.
    await order(agent, user, "帮我点一份外卖")
    injected = memory_messages(openai_server.requests[-1])
    assert any("我不能吃辣" in block for block in injected)


async def test_failed_run_stores_nothing_and_blank_messages_are_skipped(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    from tests.openai_server import error

    user = unique("u")
    agent = food.build_agent(chat_client, food_store)
    openai_server.queue(error(500, "model down"))
    with pytest.raises((ChatClientException, openai.InternalServerError)):
        await order(agent, user, "remember this")
    assert await food_store.count(food.COLLECTION, MemoryScope(user_id=user)) == 0
    openai_server.queue(text("   "))
    await order(agent, user, "hello there")
    rows = await food_store.list(food.COLLECTION, MemoryScope(user_id=user))
    assert [r.content for r in rows] == ["hello there"]


async def test_unscoped_search_is_refused_unless_allowed(
    food_store: MemoryStore, chat_client: Any
) -> None:
    def everybody(user_id: str, session: AgentSession) -> ChatHistoryMemoryProvider.State:
        return ChatHistoryMemoryProvider.State(
            storage_scope=MemoryScope(user_id=user_id), search_scope=MemoryScope()
        )

    memory = ChatHistoryMemoryProvider(food_store, food.COLLECTION, user_id="u", scopes=everybody)
    agent = Agent(chat_client, "x", context_providers=[memory])
    with pytest.raises(ScopeError, match="allow_unscoped_search=True"):
        await agent.run("hi", session=agent.create_session())
    # A resolver with nothing bound fails clearly, naming the fix; nothing is sent or stored.
    blank = ChatHistoryMemoryProvider(food_store, food.COLLECTION, user_id=lambda session: "")
    agent = Agent(chat_client, "x", context_providers=[blank])
    with pytest.raises(ScopeError, match="must return the signed-in user's id"):
        await agent.run("hi", session=agent.create_session())
    with pytest.raises(ScopeError, match="user_id=lambda session"):
        ChatHistoryMemoryProvider(food_store, food.COLLECTION, user_id=None)  # type: ignore[arg-type]


async def test_every_recall_is_audited(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")
    agent = food.build_agent(chat_client, food_store)
    openai_server.responder = model
    await order(agent, user, "帮我点一份外卖，我不能吃辣")
    session = await order(agent, user, "帮我点一份外卖")
    async with food_store.engine.begin() as conn:
        rows = (
            await conn.execute(
                sql(
                    "SELECT provider, mode, requesting_session_id, query_text, memory_ids, reasons "
                    "FROM pgmemory_recall_audit "
                    "WHERE user_id = :u ORDER BY id"
                ),
                {"u": user},
            )
        ).all()
    assert len(rows) == 2
    last = rows[-1]
    # The mode is the retrieval mode actually used (not the provider's timing option), and
    # every shown memory says why it was shown.
    assert (last.provider, last.mode, last.requesting_session_id) == (
        "ChatHistoryMemoryProvider",
        "hybrid",
        session.session_id,
    )
    assert len(last.reasons) == len(last.memory_ids) and "recent" in last.reasons
    assert last.query_text is None  # the sensitive-data switch is off
    stored = {
        m.id for m in await food_store.list(food.COLLECTION, MemoryScope(user_id=user), limit=100)
    }
    assert set(last.memory_ids) <= stored and len(last.memory_ids) >= 2


@pytest.mark.parametrize("sensitive", [False, True])
@pytest.mark.parametrize("custom_redactor", [False, True])
async def test_redaction_matrix(
    food_store: MemoryStore,
    openai_server: OpenAIServer,
    chat_client: Any,
    caplog: pytest.LogCaptureFixture,
    sensitive: bool,
    custom_redactor: bool,
) -> None:
    user = unique("secret-user")
    options = ChatHistoryMemoryProviderOptions(
        enable_sensitive_telemetry_data=sensitive,
        **({"redactor": lambda value: f"<{len(value)} chars>"} if custom_redactor else {}),
    )
    memory = ChatHistoryMemoryProvider(
        food_store, food.COLLECTION, user_id=food.current_user, options=options
    )
    agent = Agent(chat_client, "x", context_providers=[memory])
    openai_server.queue(text("ok"), text("ok"))
    await order(agent, user, "my secret is swordfish")
    with caplog.at_level(
        logging.DEBUG, logger="pgmemory.integrations.agent_framework.chat_history"
    ):
        await order(agent, user, "what is my secret?")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "recalled" in logged  # counts are always there
    if sensitive:
        assert user in logged and "swordfish" in logged and "what is my secret?" in logged
    else:
        assert (
            user not in logged and "swordfish" not in logged and "what is my secret?" not in logged
        )
        assert ("<18 chars>" in logged) if custom_redactor else ("<redacted>" in logged)
    async with food_store.engine.begin() as conn:
        texts = (
            (
                await conn.execute(
                    sql(
                        "SELECT query_text FROM pgmemory_recall_audit WHERE user_id = :u ORDER BY id"
                    ),
                    {"u": user},
                )
            )
            .scalars()
            .all()
        )
    assert texts[-1] == ("what is my secret?" if sensitive else None)


async def test_readme_audit_queries_answer_which_memories_went_into_an_answer(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    import re

    user = unique("alice")
    agent = food.build_agent(chat_client, food_store)
    openai_server.responder = model
    await order(agent, user, "帮我点一份外卖，我不能吃辣")
    session = await order(agent, user, "帮我点一份外卖")
    readme = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(
        encoding="utf-8"
    )
    blocks = re.findall(r"```sql\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 3
    results = []
    async with food_store.engine.begin() as conn:
        for block in blocks:
            statement = block.replace("'alice'", ":user").replace("'<session id>'", ":session")
            results.append(
                (
                    await conn.execute(
                        sql(statement), {"user": user, "session": session.session_id}
                    )
                ).all()
            )
    which, writes, _facts = results
    assert any("我不能吃辣" in row.content for row in which)
    assert {row.operation for row in writes} == {"insert"}


async def test_on_demand_search_results_are_not_stored_back(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    """Recalled memories must never feed back into memory, nor copy one user's rows to another."""
    app = unique("app")

    def shared_search(user_id: str, session: AgentSession) -> ChatHistoryMemoryProvider.State:
        return ChatHistoryMemoryProvider.State(
            storage_scope=MemoryScope(application_id=app, user_id=user_id),
            search_scope=MemoryScope(application_id=app),
        )

    options = ChatHistoryMemoryProviderOptions(
        search_time="on_demand_function_calling", allow_unscoped_search=True
    )
    memory = ChatHistoryMemoryProvider(
        food_store,
        food.COLLECTION,
        user_id=food.current_user,
        scopes=shared_search,
        options=options,
    )
    agent = Agent(chat_client, "x", context_providers=[memory])
    openai_server.queue(text("noted"))
    await order(agent, "bob", "my bank pin is 4711")
    openai_server.queue(
        tool_calls(call("Search", {"userQuestion": "pin"})), text("I can't share that.")
    )
    await order(agent, "alice", "what is bob's pin?")
    alice_rows = await food_store.list(
        food.COLLECTION, MemoryScope(application_id=app, user_id="alice")
    )
    assert [r.content for r in alice_rows] == ["I can't share that.", "what is bob's pin?"]
    assert not any("4711" in r.content for r in alice_rows)


async def test_a_re_sent_message_is_stored_once(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    user = unique("u")
    agent = Agent(
        chat_client,
        "x",
        context_providers=[
            ChatHistoryMemoryProvider(food_store, food.COLLECTION, user_id=food.current_user)
        ],
    )
    said = Message("user", ["I like tea"])
    food.CURRENT_USER.set(user)
    session = agent.create_session()
    openai_server.queue(text("ok"), text("ok again"))
    await agent.run(said, session=session)
    await agent.run(
        [said, Message("user", ["and coffee"])], session=session
    )  # a stateless client re-sends
    contents = [
        r.content
        for r in await food_store.list(
            food.COLLECTION, MemoryScope(user_id=user), newest_first=False
        )
    ]
    assert contents == ["I like tea", "ok", "and coffee", "ok again"]


async def test_recent_turns_survive_extra_tool_rounds(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    """A turn with more tool rounds after the order still shows the order (turns, not rows)."""
    user = unique("u")
    agent = food.build_agent(chat_client, food_store)
    openai_server.queue(
        tool_calls(call("GetMenu", {})),
        tool_calls(call("PlaceOrder", {"items": [{"dish": "清蒸鲈鱼", "quantity": 1}]})),
        tool_calls(call("GetMenu", {})),
        tool_calls(call("GetMenu", {})),
        tool_calls(call("GetMenu", {})),
        text("已为您下单：清蒸鲈鱼 x1。"),
        text("thanks, bye"),
    )
    await order(agent, user, "帮我点一份外卖")
    session = agent.create_session()
    await agent.run("谢谢", session=session)
    openai_server.queue(text("ok"))
    start = len(openai_server.requests)
    await order(agent, user, "和上次不一样")
    (injected,) = memory_messages(openai_server.requests[start])
    # The order is in the turn's answer; the five tool rounds are stored, not shown.
    shown = injected.split("Most recent messages")[1]
    assert "清蒸鲈鱼" in shown and "GetMenu" not in shown


async def test_two_instances_need_only_distinct_source_ids(
    food_store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    first = ChatHistoryMemoryProvider(food_store, food.COLLECTION, user_id=food.current_user)
    second = ChatHistoryMemoryProvider(
        food_store, unique("c").replace("-", "_"), user_id=food.current_user, source_id="team"
    )
    agent = Agent(chat_client, context_providers=[first, second])
    openai_server.queue(text("ok"))
    session = await order(agent, unique("u"), "hello")
    assert {"ChatHistoryMemoryProvider", "team"} <= set(session.state)


async def test_the_provider_creates_its_collection(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    collection = f"c_{unique('fresh').replace('-', '_')}"
    user = unique("u")
    memory = ChatHistoryMemoryProvider(store, collection, user_id=user)
    agent = Agent(chat_client, context_providers=[memory])
    session = agent.create_session()
    openai_server.queue(text("ok"))
    await agent.run("hello", session=session)  # no create_collection beforehand
    info = await store.get_collection(collection)
    assert (info.dimensions, info.embedding_model) == (
        store.embedder.dimensions,
        store.embedder.model_id,
    )
    assert await store.count(collection, MemoryScope(user_id=user)) == 2
    assert await memory.collection() is await memory.collection()  # created once, then cached


async def test_a_collection_of_another_model_is_refused_clearly(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    from pgmemory import CollectionError

    collection = f"c_{unique('other').replace('-', '_')}"
    await store.create_collection(collection, dimensions=16, embedding_model="other-model@16")
    agent = Agent(
        chat_client,
        context_providers=[ChatHistoryMemoryProvider(store, collection, user_id=unique("u"))],
    )
    session = agent.create_session()
    with pytest.raises(
        CollectionError, match="exists with 16 dimensions from model 'other-model@16'"
    ):
        await agent.run("hello", session=session)
    assert openai_server.requests == []
