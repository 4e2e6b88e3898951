"""pgmemory's providers inside a real agent-framework ``Agent``.

The framework's own OpenAI chat-completions client talks over HTTP to the scripted
OpenAI-compatible server; nothing of the framework is stood in for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest

af = pytest.importorskip("agent_framework", reason="needs the 'agent-framework' extra")
from agent_framework.openai import OpenAIChatCompletionClient  # noqa: E402

from pgmemory import ChatHistoryMemoryProviderOptions, MemoryScope  # noqa: E402
from pgmemory.integrations.agent_framework import (  # noqa: E402
    ChatHistoryMemoryProvider,
    PostgresHistoryProvider,
)
from pgmemory.store.store import MemoryStore  # noqa: E402
from tests.openai_server import OpenAIServer, call, text, tool_calls  # noqa: E402

ROOT = Path(__file__).parents[2]
INSTRUCTIONS = "你是一个外卖点餐助手。先用 GetMenu 查看菜单，再用 PlaceOrder 下单。"


def get_menu() -> list[str]:
    """Returns today's menu."""
    return ["辣椒炒肉", "番茄炒蛋", "清炒菜心"]


def place_order(dish: Annotated[str, "the dish to order"]) -> str:
    """Places an order for one dish."""
    return f"ordered {dish}"


def per_user(session: Any) -> ChatHistoryMemoryProvider.State:
    """Scopes from the user id the application bound to the framework's session."""
    assert isinstance(session, af.AgentSession)  # the framework's session, not pgmemory's
    user_id = session.state["user_id"]
    return ChatHistoryMemoryProvider.State(
        storage_scope=MemoryScope(user_id=user_id, session_id=session.session_id),
        search_scope=MemoryScope(user_id=user_id),
    )


def _agent(store: MemoryStore, server: OpenAIServer, collection: str, **options: Any) -> Any:
    client = OpenAIChatCompletionClient(model="test-model", base_url=server.url, api_key="test")
    memory = ChatHistoryMemoryProvider(
        store,
        collection,
        state_initializer=per_user,
        options=ChatHistoryMemoryProviderOptions(**options),
    )
    history = PostgresHistoryProvider(store)
    return af.Agent(
        client,
        INSTRUCTIONS,
        tools=[af.tool(get_menu, name="GetMenu"), af.tool(place_order, name="PlaceOrder")],
        context_providers=[history, memory],
    )


def _session(agent: Any, user_id: str) -> Any:
    session = agent.create_session()
    session.state["user_id"] = user_id
    return session


def _sent(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content")) for m in request["messages"])


async def test_food_delivery_memory_per_user(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    agent = _agent(store, openai_server, collection)
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"

    openai_server.queue(
        tool_calls(call("GetMenu", {})),
        tool_calls(call("PlaceOrder", {"dish": "番茄炒蛋"})),
        text("已为您下单番茄炒蛋。"),
    )
    first = await agent.run("帮我点一份外卖，一荤一素，我不能吃辣", session=_session(agent, alice))
    assert first.text == "已为您下单番茄炒蛋。"
    # The tools ran inside the framework; the results went back to the model.
    assert "ordered 番茄炒蛋" in _sent(openai_server.requests[2])

    openai_server.queue(text("好的。"))
    await agent.run("帮我点一份外卖", session=_session(agent, alice))
    later = openai_server.requests[3]
    assert "我不能吃辣" in _sent(later)
    injected = [
        m for m in later["messages"] if m["role"] == "user" and "## Memories" in str(m["content"])
    ]
    assert len(injected) == 1

    openai_server.queue(text("好的。"))
    await agent.run("帮我点一份外卖", session=_session(agent, bob))
    assert "不能吃辣" not in _sent(openai_server.requests[4])

    # What pgmemory stored of Alice's first run: request, tool calls and results, the answer.
    stored = await store.list(collection, MemoryScope(user_id=alice), limit=20, newest_first=False)
    contents = [m.content for m in stored]
    assert contents[0] == "帮我点一份外卖，一荤一素，我不能吃辣"
    assert any("PlaceOrder" in c for c in contents)
    assert any("ordered 番茄炒蛋" in c for c in contents)
    assert not any("## Memories" in c for c in contents)  # recalled memories never fed back


async def test_on_demand_search_tool(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    alice = f"alice-{uuid.uuid4().hex[:6]}"
    plain = _agent(store, openai_server, collection)
    openai_server.queue(text("记住了。"))
    await plain.run("我对花生过敏", session=_session(plain, alice))

    agent = _agent(store, openai_server, collection, search_time="on_demand_function_calling")
    openai_server.queue(
        tool_calls(call("Search", {"userQuestion": "有什么过敏吗"})), text("您对花生过敏。")
    )
    reply = await agent.run("我有什么忌口？", session=_session(agent, alice))
    assert reply.text == "您对花生过敏。"
    first, second = openai_server.requests[1], openai_server.requests[2]
    search = next(t for t in first["tools"] if t["function"]["name"] == "Search")
    assert search["function"]["parameters"]["required"] == ["userQuestion"]
    assert "## Memories" not in _sent(first)  # nothing injected in on-demand mode
    tool_result = next(m for m in second["messages"] if m["role"] == "tool")
    assert "花生" in str(tool_result["content"])


@pytest.mark.slow
async def test_session_resumes_in_a_fresh_process(
    store: MemoryStore, collection: str, openai_server: OpenAIServer, database_url: str
) -> None:
    alice = f"alice-{uuid.uuid4().hex[:6]}"
    agent = _agent(store, openai_server, collection)
    session = _session(agent, alice)
    openai_server.queue(text("您好，Alice。"))
    await agent.run("我叫 Alice", session=session)
    saved = json.dumps(session.to_dict(), ensure_ascii=False)

    script = textwrap.dedent(
        f"""
        import asyncio, json, sys
        import agent_framework as af
        from pgmemory.settings import Settings
        from pgmemory.store.store import MemoryStore
        from tests.integrations.test_agent_framework import _agent

        class Server:
            url = {openai_server.url!r}

        async def main():
            async with MemoryStore({database_url!r}, settings=Settings(_env_file=None)) as store:
                agent = _agent(store, Server, {collection!r})
                session = af.AgentSession.from_dict(json.loads(sys.stdin.read()))
                reply = await agent.run("我叫什么？", session=session)
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
    resumed = openai_server.requests[-1]["messages"]
    contents = [m.get("content") for m in resumed]
    # The history came back from PostgreSQL in the new process, in order, before the new input.
    assert (
        contents.index("我叫 Alice")
        < contents.index("您好，Alice。")
        < contents.index("我叫什么？")
    )
