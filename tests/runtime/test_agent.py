"""The agent's tool loop (parallel calls, a raising tool, the iteration guard), input forms,
streaming and structured output."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from pgmemory.errors import InvalidInputError, ToolLoopLimitError
from pgmemory.runtime.agent import Agent, AgentResponse, AgentResponseUpdate
from pgmemory.runtime.messages import Message
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.tools import tool
from tests.openai_server import OpenAIServer, call, json_reply, text, tool_calls

MENU = ["辣椒炒肉", "剁椒鱼头", "番茄炒蛋", "清蒸鲈鱼", "清炒菜心", "酸辣土豆丝", "西芹百合"]


class Dish(TypedDict):
    dish: Annotated[str, "a dish from the menu"]
    quantity: int


def make_tools(orders: list[list[Dish]]):
    def get_menu() -> list[str]:
        """Get the menu."""
        return MENU

    def place_order(*items: Dish) -> str:
        """Place an order of dishes and quantities."""
        orders.append(list(items))
        return "order placed"

    return [tool(get_menu, name="GetMenu"), tool(place_order, name="PlaceOrder")]


async def test_tool_loop_runs_tools_and_feeds_results_back(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    orders: list[list[Dish]] = []
    agent = Agent(chat_client, "Order food.", name="waiter", tools=make_tools(orders))
    openai_server.queue(
        tool_calls(call("GetMenu", {}, id="m1")),
        tool_calls(
            call(
                "PlaceOrder",
                {
                    "items": [
                        {"dish": "番茄炒蛋", "quantity": 1},
                        {"dish": "清炒菜心", "quantity": 1},
                    ]
                },
                id="p1",
            )
        ),
        text("Ordered 番茄炒蛋 and 清炒菜心."),
    )
    response = await agent.run("帮我点一份外卖，一荤一素，我不能吃辣")
    assert response.text == "Ordered 番茄炒蛋 and 清炒菜心."
    assert orders == [[{"dish": "番茄炒蛋", "quantity": 1}, {"dish": "清炒菜心", "quantity": 1}]]
    assert [m.role for m in response.messages] == [
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert all(m.author_name == "waiter" for m in response.messages if m.role == "assistant")
    second = openai_server.requests[1]["messages"]
    assert second[-1] == {
        "role": "tool",
        "tool_call_id": "m1",
        "content": json.dumps(MENU, ensure_ascii=False),
    }
    assert {t["function"]["name"] for t in openai_server.requests[0]["tools"]} == {
        "GetMenu",
        "PlaceOrder",
    }
    assert response.usage["total_tokens"] == 6


async def test_parallel_tool_calls_run_concurrently(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    running = 0
    peak = 0

    async def slow(city: str) -> str:
        """Weather."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return f"sunny in {city}"

    agent = Agent(chat_client, tools=[slow])
    openai_server.queue(
        tool_calls(
            call("slow", {"city": "A"}, id="a"),
            call("slow", {"city": "B"}, id="b"),
            call("slow", {"city": "C"}, id="c"),
        ),
        text("all sunny"),
    )
    response = await agent.run("weather?")
    assert peak == 3
    results = [r for m in response.messages for r in m.function_results]
    assert [(r.call_id, r.result) for r in results] == [
        ("a", "sunny in A"),
        ("b", "sunny in B"),
        ("c", "sunny in C"),
    ]
    tool_msgs = [m for m in openai_server.last_request["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["a", "b", "c"]


async def test_a_raising_tool_becomes_a_result_the_model_sees(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    def explode(reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"kitchen closed: {reason}")

    agent = Agent(chat_client, tools=[explode])
    openai_server.queue(
        tool_calls(
            call("explode", {"reason": "late"}, id="e1"),
            call("missing", {}, id="e2"),
            call("explode", {}, id="e3"),
        ),
        text("Sorry, the kitchen is closed."),
    )
    response = await agent.run("order")
    assert response.text == "Sorry, the kitchen is closed."
    tool_msgs = {
        m["tool_call_id"]: m["content"]
        for m in openai_server.last_request["messages"]
        if m["role"] == "tool"
    }
    assert tool_msgs["e1"] == "Error: RuntimeError: kitchen closed: late"
    assert tool_msgs["e2"].startswith("Error: unknown tool 'missing'; available tools: explode")
    assert "invalid arguments for tool 'explode': reason: Field required" in tool_msgs["e3"]


async def test_iteration_guard(openai_server: OpenAIServer, chat_client: OpenAIChatClient) -> None:
    calls = 0

    def ping() -> str:
        """Ping."""
        nonlocal calls
        calls += 1
        return "pong"

    agent = Agent(chat_client, tools=[ping], max_tool_iterations=2)
    # a model that wants tools forever: after 2 rounds it is asked with tool_choice "none"
    openai_server.responder = lambda body: tool_calls(call("ping", {}))
    session = agent.create_session()
    with pytest.raises(ToolLoopLimitError, match="after 2 rounds"):
        await agent.run("loop", session)
    assert calls == 2 and len(openai_server.requests) == 3
    assert openai_server.requests[-1]["tool_choice"] == "none"
    assert session.state["in_memory_history"] == {}  # a failed run stores nothing

    # a model that obeys tool_choice "none" gives the final answer
    openai_server.responder = lambda body: (
        text("final") if body.get("tool_choice") == "none" else tool_calls(call("ping", {}))
    )
    response = await agent.run("loop", max_tool_iterations=1)
    assert response.text == "final"


async def test_input_forms_and_errors(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    agent = Agent(chat_client)
    openai_server.responder = lambda body: "ok"
    await agent.run(Message("user", "one"))
    await agent.run(["a", Message("user", "b", author_name="bob")])
    assert [m.get("content") for m in openai_server.last_request["messages"]] == ["a", "b"]
    assert openai_server.last_request["messages"][1]["name"] == "bob"
    with pytest.raises(InvalidInputError, match="agent input is empty"):
        await agent.run([])
    with pytest.raises(InvalidInputError, match="session must be an AgentSession"):
        await agent.run("x", session={"session_id": "s"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="max_tool_iterations=0"):
        Agent(chat_client, max_tool_iterations=0)


async def test_run_stream_yields_updates_then_the_final_response(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    orders: list[list[Dish]] = []
    agent = Agent(chat_client, tools=make_tools(orders))
    session = agent.create_session()
    openai_server.queue(
        tool_calls(call("GetMenu", {}, id="m1")),
        text("Today we have seven dishes."),
    )
    items = [item async for item in agent.run_stream("menu?", session)]
    assert isinstance(items[-1], AgentResponse)
    updates = [i for i in items if isinstance(i, AgentResponseUpdate)]
    assert updates[0].contents[0].name == "GetMenu"
    assert updates[1].role == "tool" and updates[1].contents[0].result == MENU
    streamed = "".join(u.text for u in updates)
    assert streamed == "Today we have seven dishes." == items[-1].text
    assert len([u for u in updates if u.text]) > 2
    assert all(r["stream"] for r in openai_server.requests)
    # after_run ran: history holds the request and all response messages
    stored = session.state["in_memory_history"]["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]


class Order(BaseModel):
    dishes: list[str]


async def test_structured_output_through_the_agent(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    agent = Agent(chat_client)
    openai_server.queue(json_reply({"dishes": ["番茄炒蛋"]}), json_reply({"dishes": ["西芹百合"]}))
    response = await agent.run("pick", response_format=Order)
    assert response.value == Order(dishes=["番茄炒蛋"])
    items = [i async for i in agent.run_stream("pick", response_format=Order)]
    assert items[-1].value == Order(dishes=["西芹百合"])


async def test_streaming_failure_reaches_providers_and_propagates(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    import openai

    agent = Agent(chat_client)
    session = agent.create_session()
    with pytest.raises(openai.BadRequestError):
        async for _ in agent.run_stream("x", session):
            pass
    assert session.state["in_memory_history"] == {}


async def test_a_failing_after_run_does_not_skip_later_providers(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    from pgmemory.runtime import AfterRunError
    from pgmemory.runtime.history import InMemoryHistoryProvider
    from pgmemory.runtime.providers import ContextProvider

    class Broken(ContextProvider):
        async def after_run(self, **kwargs) -> None:
            raise RuntimeError("provider down")

    history = InMemoryHistoryProvider("h")
    agent = Agent(chat_client, context_providers=[Broken("broken"), history])
    openai_server.queue(text("the answer"))
    session = agent.create_session()
    with pytest.raises(AfterRunError) as info:
        await agent.run("question", session=session)
    assert info.value.response.text == "the answer"
    assert [source for source, _ in info.value.errors] == ["broken"]
    # the message names providers and exception types, never the exceptions' text (user data)
    assert "broken: RuntimeError" in str(info.value) and "provider down" not in str(info.value)
    assert str(info.value.errors[0][1]) == "provider down"
    # the history provider after the broken one still saved the turn
    assert [m["role"] for m in session.state["h"]["messages"]] == ["user", "assistant"]


@pytest.mark.parametrize("bad", [0, -3, True, "2"])
async def test_per_run_max_tool_iterations_is_checked(
    chat_client: OpenAIChatClient, bad: object
) -> None:
    agent = Agent(chat_client)
    with pytest.raises(InvalidInputError, match=r"max_tool_iterations=.* must be an integer >= 1"):
        await agent.run("x", max_tool_iterations=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"must be an integer >= 1"):
        async for _ in agent.run_stream("x", max_tool_iterations=bad):  # type: ignore[arg-type]
            pass
