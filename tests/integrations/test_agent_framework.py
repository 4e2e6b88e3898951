"""pgmemory's providers inside a real agent-framework ``Agent``: the seeds' scenarios.

The framework's own OpenAI chat-completions client talks over HTTP to the scripted
OpenAI-compatible server; nothing of the framework is stood in for.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import agent_framework as af
import httpx
import pytest
from pydantic import BaseModel

from pgmemory import (
    ChatHistoryMemoryProvider,
    ChatHistoryMemoryProviderOptions,
    FactMemoryProvider,
    MemoryScope,
    PostgresHistoryProvider,
)
from pgmemory.admin import Admin
from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.integrations.agent_framework.rendering import TOOL_KIND
from pgmemory.store.store import MemoryStore
from pgmemory.ui import create_app
from pgmemory.vocabulary import FACTS_NAMESPACE
from tests.agents import (
    FOOD_INSTRUCTIONS,
    MENU,
    agent,
    client as chat_client_of,
    food_tools,
    injected,
    sent,
)
from tests.conftest import unique
from tests.openai_server import OpenAIServer, call, text, tool_calls

ROOT = Path(__file__).parents[2]


def current_user(session: af.AgentSession) -> str:
    """The resolver the tests bind: the application's own record of who the session is for."""
    return USERS[session.session_id]


#: session id -> user id, as an application's request context would know it.
USERS: dict[str, str] = {}


def food_agent(store: MemoryStore, server: Any, collection: str, **options: Any) -> af.Agent:
    memory = ChatHistoryMemoryProvider(
        store,
        collection,
        user_id=current_user,
        options=ChatHistoryMemoryProviderOptions(**options),
    )
    history = PostgresHistoryProvider(store, user_id=current_user)
    return agent(server, history, memory, instructions=FOOD_INSTRUCTIONS, tools=food_tools())


def session_for(agent: af.Agent, user_id: str) -> af.AgentSession:
    session = agent.create_session()
    USERS[session.session_id] = user_id
    return session


async def test_food_delivery_memory_per_user(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    food = food_agent(store, openai_server, collection)
    alice, bob = unique("alice"), unique("bob")

    openai_server.queue(
        tool_calls(call("GetMenu", {})),
        tool_calls(call("PlaceOrder", {"dish": "番茄炒蛋"})),
        text("已为您下单番茄炒蛋。"),
    )
    first = await food.run("帮我点一份外卖，一荤一素，我不能吃辣", session=session_for(food, alice))
    assert first.text == "已为您下单番茄炒蛋。"
    # The tools ran inside the framework; the results went back to the model.
    assert "ordered 番茄炒蛋" in sent(openai_server.requests[2])

    openai_server.queue(text("好的。"))
    await food.run("帮我点一份外卖", session=session_for(food, alice))
    later = openai_server.requests[3]
    blocks = injected(later)
    assert len(blocks) == 1
    assert "我不能吃辣" in blocks[0]
    # Tool calls and tool results are stored, but not injected as memories by default.
    assert "GetMenu" not in blocks[0] and "tool result" not in blocks[0]

    openai_server.queue(text("好的。"))
    await food.run("帮我点一份外卖", session=session_for(food, bob))
    assert "不能吃辣" not in sent(openai_server.requests[4])

    # What pgmemory stored of Alice's first run: request, tool calls and results, the answer.
    stored = await store.list(collection, MemoryScope(user_id=alice), limit=20, newest_first=False)
    contents = [m.content for m in stored]
    assert contents[0] == "帮我点一份外卖，一荤一素，我不能吃辣"
    assert any("PlaceOrder" in c for c in contents)
    assert any("ordered 番茄炒蛋" in c for c in contents)
    assert not any("## Memories" in c for c in contents)  # recalled memories never fed back
    assert {m.source_type for m in stored} == {"external"}


async def test_tool_messages_are_recalled_when_asked_and_not_stored_when_told(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    alice = unique("alice")
    noisy = food_agent(store, openai_server, collection, include_tools_in_recall=True)
    openai_server.queue(tool_calls(call("GetMenu", {})), text("点好了。"))
    await noisy.run("帮我点一份外卖", session=session_for(noisy, alice))
    openai_server.queue(text("好的。"))
    await noisy.run("再点一份", session=session_for(noisy, alice))
    assert "[called GetMenu with" in injected(openai_server.requests[2])[0]

    quiet = food_agent(store, openai_server, unique("c"), store_tool_messages=False)
    openai_server.queue(tool_calls(call("GetMenu", {})), text("点好了。"))
    await quiet.run("帮我点一份外卖", session=session_for(quiet, alice))
    providers = quiet.context_providers
    memory = next(p for p in providers if isinstance(p, ChatHistoryMemoryProvider))
    stored = await store.list(memory.collection_name, MemoryScope(user_id=alice), limit=10)
    assert sorted(m.role for m in stored) == ["assistant", "user"]


async def test_different_from_last_time_shows_the_last_order(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    food = food_agent(store, openai_server, collection)
    alice = unique("alice")
    for dish in ("清蒸鲈鱼", "番茄炒蛋"):
        openai_server.queue(
            tool_calls(call("PlaceOrder", {"dish": dish})), text(f"已为您下单{dish}。")
        )
        await food.run("帮我点一份外卖，和上次不一样", session=session_for(food, alice))
    openai_server.queue(text("好的。"))
    await food.run("帮我点一份外卖，和上次不一样", session=session_for(food, alice))
    block = injected(openai_server.requests[-1])[0]
    # The most recent turns are always shown, with their time, so "the last order" is there.
    assert "Most recent messages" in block
    assert "已为您下单番茄炒蛋。" in block.split("Most recent messages")[1]


async def test_on_demand_search_tool(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    alice = unique("alice")
    plain = food_agent(store, openai_server, collection)
    openai_server.queue(text("记住了。"))
    await plain.run("我对花生过敏", session=session_for(plain, alice))

    on_demand = food_agent(
        store, openai_server, collection, search_time="on_demand_function_calling"
    )
    openai_server.queue(
        tool_calls(call("Search", {"userQuestion": "有什么过敏吗"})), text("您对花生过敏。")
    )
    reply = await on_demand.run("我有什么忌口？", session=session_for(on_demand, alice))
    assert reply.text == "您对花生过敏。"
    first, second = openai_server.requests[1], openai_server.requests[2]
    search = next(t for t in first["tools"] if t["function"]["name"] == "Search")
    assert search["function"]["parameters"]["required"] == ["userQuestion"]
    assert not injected(first)  # nothing injected in on-demand mode
    tool_result = next(m for m in second["messages"] if m["role"] == "tool")
    assert "花生" in str(tool_result["content"])
    # The Search tool's own calls and results are not stored: memory never feeds memory.
    stored = await store.list(collection, MemoryScope(user_id=alice), limit=20)
    assert not any("Search" in m.content or "有什么过敏吗" in m.content for m in stored)


async def test_streaming_run_stores_the_turn(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    food = food_agent(store, openai_server, collection)
    alice = unique("alice")
    session = session_for(food, alice)
    openai_server.queue(tool_calls(call("GetMenu", {})), text("已为您下单番茄炒蛋。"))
    stream = food.run("帮我点一份外卖", session=session, stream=True)
    pieces = [update.text async for update in stream]
    final = await stream.get_final_response()
    assert "".join(pieces) == final.text == "已为您下单番茄炒蛋。"
    assert openai_server.requests[0]["stream"] is True
    history = next(p for p in food.context_providers if isinstance(p, PostgresHistoryProvider))
    kept = await history.messages(session)
    assert [str(m.role) for m in kept] == ["user", "assistant", "tool", "assistant"]
    assert await store.count(collection, MemoryScope(user_id=alice)) == 4


async def test_session_round_trips_through_to_dict(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    food = food_agent(store, openai_server, collection)
    alice = unique("alice")
    session = session_for(food, alice)
    openai_server.queue(text("您好。"))
    await food.run("我叫 Alice", session=session)
    data = json.loads(json.dumps(session.to_dict()))
    # Each provider's record is JSON-native, under its source id.
    assert data["state"]["postgres_history"] == {"session_id": session.session_id, "user_id": alice}
    assert data["state"]["ChatHistoryMemoryProvider"]["search_scope"]["user_id"] == alice
    restored = af.AgentSession.from_dict(data)
    openai_server.queue(text("您叫 Alice。"))
    await food.run("我叫什么？", session=restored)
    contents = [m.get("content") for m in openai_server.requests[-1]["messages"]]
    assert contents.index("我叫 Alice") < contents.index("您好。") < contents.index("我叫什么？")


async def test_session_resumes_in_a_fresh_process(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, database_url: str
) -> None:
    alice = unique("alice")
    food = food_agent(store, openai_server, collection)
    session = session_for(food, alice)
    openai_server.queue(text("您好，Alice。"))
    await food.run("我叫 Alice", session=session)
    saved = json.dumps(session.to_dict(), ensure_ascii=False)

    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        import agent_framework as af
        from pgmemory.settings import Settings
        from pgmemory.store.store import MemoryStore
        from tests.integrations import test_agent_framework as t

        class Server:
            url = {openai_server.url!r}

        async def main():
            async with MemoryStore({database_url!r}, settings=Settings(_env_file=None)) as store:
                food = t.food_agent(store, Server, {collection!r})
                session = af.AgentSession.from_dict(json.loads(sys.stdin.read()))
                t.USERS[session.session_id] = {alice!r}
                reply = await food.run("我叫什么？", session=session)
                print(reply.text)

        asyncio.run(main())
        """
    )
    openai_server.queue(text("您叫 Alice。"))
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=saved,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "您叫 Alice。"
    contents = [m.get("content") for m in openai_server.requests[-1]["messages"]]
    # The history came back from PostgreSQL in the new process, in order, before the new input.
    assert (
        contents.index("我叫 Alice")
        < contents.index("您好，Alice。")
        < contents.index("我叫什么？")
    )


class Profile(BaseModel):
    """The facts of the tests below (none required: the agent asks for nothing)."""

    name: str | None = None


def three_providers(
    store: MemoryStore, server: OpenAIServer, collection: str, user: str
) -> tuple[PostgresHistoryProvider, ChatHistoryMemoryProvider, FactMemoryProvider]:
    """Each kind of pgmemory provider, at its defaults, bound to ``user``."""
    return (
        PostgresHistoryProvider(store, user_id=user),
        ChatHistoryMemoryProvider(store, collection, user_id=user),
        FactMemoryProvider(store, chat_client_of(server), Profile, user_id=user),
    )


async def nothing_stored(store: MemoryStore, collection: str, user: str, session_id: str) -> None:
    assert await store.list(collection, MemoryScope(user_id=user)) == []
    assert await store.read_history(session_id, user_id=user) == []
    assert await store.get_facts(FACTS_NAMESPACE, MemoryScope(user_id=user)) == {}


@pytest.mark.parametrize(
    "pair",
    ["two memories", "history and facts", "memory and a framework provider"],
)
async def test_two_providers_sharing_a_state_key_are_refused_naming_both(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, pair: str
) -> None:
    """Two providers of one agent with one source_id would share one session-state entry (the
    framework keys each provider's state by its source_id): the run is refused before anything
    is read, sent or written, with an error naming both providers and the key."""
    user = unique("alice")
    memory = ChatHistoryMemoryProvider(store, collection, user_id=user)
    if pair == "two memories":
        providers: list[Any] = [memory, ChatHistoryMemoryProvider(store, unique("c"), user_id=user)]
        shared = "ChatHistoryMemoryProvider"
    elif pair == "history and facts":
        shared = "shared"
        providers = [
            PostgresHistoryProvider(store, shared, user_id=user),
            FactMemoryProvider(
                store, chat_client_of(openai_server), Profile, user_id=user, source_id=shared
            ),
        ]
    else:
        shared = "ChatHistoryMemoryProvider"
        providers = [af.InMemoryHistoryProvider(source_id=shared), memory]
    assistant = agent(openai_server, *providers)
    session = assistant.create_session()
    with pytest.raises(InvalidInputError) as refused:
        await assistant.run("hello", session=session)
    message = str(refused.value)
    assert f"source_id {shared!r}" in message, message
    # by position in agent.context_providers (where the framework may have put its own
    # InMemoryHistoryProvider first) and class
    assert message.count("context_providers[") == 2, message
    for provider in providers:
        assert type(provider).__name__ in message, message
    assert openai_server.requests == []
    await nothing_stored(store, collection, user, session.session_id)


@pytest.mark.parametrize(
    "given", [b"hi", ["a", None], ["a", 7]], ids=["bytes", "a None item", "an int item"]
)
@pytest.mark.parametrize("which", ["history", "memory", "facts"])
async def test_input_items_that_are_not_messages_get_a_pgmemory_error_naming_them(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, given: Any, which: str
) -> None:
    """agent.run() takes a str, Content or Message, or a list of them; the framework passes
    anything else through as an input "message". Each pgmemory provider refuses such an item
    with an InvalidInputError naming its position and type (never its value: b"hi" arrives as
    the ints 104 and 105), before anything is read, sent or written."""
    user = unique("alice")
    history, memory, facts = three_providers(store, openai_server, collection, user)
    provider = {"history": history, "memory": memory, "facts": facts}[which]
    assistant = agent(openai_server, provider)
    session = assistant.create_session()
    with pytest.raises(InvalidInputError) as refused:
        await assistant.run(given, session=session)
    message = str(refused.value)
    kind = "int" if isinstance(given, bytes) or given[1] == 7 else "NoneType"
    position = 0 if isinstance(given, bytes) else 1
    assert f"input item {position} is a {kind}, not a Message" in message, message
    assert "104" not in message and "105" not in message
    assert openai_server.requests == []
    await nothing_stored(store, collection, user, session.session_id)


@pytest.mark.parametrize("which", ["history", "memory", "facts"])
@pytest.mark.parametrize("entry", ["a string", ["a", "list"], 7], ids=["a str", "a list", "an int"])
async def test_a_restored_session_with_a_malformed_entry_is_refused_clearly(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, which: str, entry: Any
) -> None:
    """A session restored from a client's dict whose entry for a provider is not a dict (the
    framework hands it to the provider as its ``state``): pgmemory's ScopeError naming the
    entry's key and type, before anything is read, sent or written."""
    user = unique("alice")
    history, memory, facts = three_providers(store, openai_server, collection, user)
    provider = {"history": history, "memory": memory, "facts": facts}[which]
    assistant = agent(openai_server, provider)
    data = assistant.create_session().to_dict()
    data["state"] = {provider.source_id: entry}
    session = af.AgentSession.from_dict(data)
    with pytest.raises(ScopeError) as refused:
        await assistant.run("hello", session=session)
    message = str(refused.value)
    assert f"session.state[{provider.source_id!r}] is a {type(entry).__name__}" in message, message
    assert openai_server.requests == []
    await nothing_stored(store, collection, user, session.session_id)


async def test_tool_results_are_stored_and_shown_as_readable_utf8_json(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, database_url: str
) -> None:
    """agent-framework hands a tool's non-str result over as ASCII-escaped JSON text
    (``json.dumps`` defaults: ``["\\u8fa3..."]``). pgmemory stores it as readable UTF-8 JSON,
    the same value, in the memory, the history row, the CLI and the audit page; a history row
    written before (escaped) reads back as it was, the same value, and the page shows it
    readable too."""
    food = food_agent(store, openai_server, collection)
    alice = unique("alice")
    session = session_for(food, alice)
    openai_server.queue(tool_calls(call("GetMenu", {})), text("点好了。"))
    await food.run("帮我点一份外卖", session=session)
    readable, escaped = json.dumps(MENU, ensure_ascii=False), json.dumps(MENU)

    stored = await store.list(collection, MemoryScope(user_id=alice), limit=20)
    (result,) = [m for m in stored if m.metadata.get(TOOL_KIND) == "result"]
    assert result.content == f"[tool result: {readable}]"
    (row,) = [
        r for r in await store.read_history(session.session_id, user_id=alice)
        if r.message.get("role") == "tool"
    ]  # fmt: skip
    (content,) = row.message["contents"]
    assert content["result"] == readable
    assert [item["text"] for item in content["items"]] == [readable]

    # A row as pgmemory stored it before: the framework's escaped text, kept as it was.
    before = {
        **row.message,
        "message_id": unique("before"),
        "contents": [{**content, "result": escaped, "items": [{"type": "text", "text": escaped}]}],
    }
    await store.append_history(session.session_id, [before], user_id=alice)
    history = next(p for p in food.context_providers if isinstance(p, PostgresHistoryProvider))
    results = [
        c.result
        for m in await history.messages(session)
        for c in m.contents
        if c.type == "function_result"
    ]
    assert results == [readable, escaped]
    assert [json.loads(r) for r in results] == [MENU, MENU]

    command = ["memories", "--user", alice, "--collection", collection, "--json"]
    listed = subprocess.run(
        [sys.executable, "-m", "pgmemory", "--url", database_url, *command],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("PGMEMORY_DATABASE_URL")},
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    shown = [m["content"] for m in json.loads(listed.stdout)["memories"]]
    assert f"[tool result: {readable}]" in shown and "\\u" not in listed.stdout

    async with MemoryStore(database_url) as owner:
        token = (await Admin(owner).issue_token(unique("operator"))).token
        transport = httpx.ASGITransport(app=create_app(owner))
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://localhost:8765",
            headers={"Authorization": f"Bearer {token}"},
        ) as page:
            pages = [
                await page.get(path, params={"user": alice, "session": session.session_id})
                for path in ("/user/session", "/user/memories")
            ]
    session_page, memories_page = (html.unescape(p.text) for p in pages)
    assert session_page.count(f"← {readable}") == 2, session_page  # the new row and the old
    assert f"[tool result: {readable}]" in memories_page
    assert "\\u" not in session_page + memories_page
