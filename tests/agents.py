"""Helpers for tests that run pgmemory's providers inside agent-framework's ``Agent``: the
framework's own OpenAI chat-completions client on the scripted server (real HTTP), and the
seeds' food-delivery tools."""

from __future__ import annotations

from typing import Annotated, Any

from agent_framework import Agent, FunctionTool, tool
from agent_framework.openai import OpenAIChatCompletionClient
from openai import AsyncOpenAI

from tests.openai_server import OpenAIServer

FOOD_INSTRUCTIONS = "你是一个外卖点餐助手。先用 GetMenu 查看菜单，再用 PlaceOrder 下单。"
MENU = ["辣椒炒肉", "剁椒鱼头", "番茄炒蛋", "清蒸鲈鱼", "清炒菜心", "酸辣土豆丝", "西芹百合"]


def client(server: Any) -> OpenAIChatCompletionClient:
    """The framework's chat-completions client on ``server`` (anything with ``.url``)."""
    return OpenAIChatCompletionClient(
        model="test-model",
        async_client=AsyncOpenAI(base_url=server.url, api_key="test", max_retries=0),
    )


def get_menu() -> list[str]:
    """Returns today's menu."""
    return list(MENU)


def place_order(dish: Annotated[str, "the dish to order"]) -> str:
    """Places an order for one dish."""
    return f"ordered {dish}"


def food_tools() -> list[FunctionTool]:
    """The seeds' two tools, GetMenu and PlaceOrder."""
    return [tool(get_menu, name="GetMenu"), tool(place_order, name="PlaceOrder")]  # type: ignore[list-item]


def agent(server: OpenAIServer | Any, *providers: Any, **options: Any) -> Agent:
    """An agent on the scripted ``server`` with ``providers`` (in that order)."""
    options.setdefault("instructions", "Be brief.")
    return Agent(client=client(server), context_providers=list(providers), **options)


def sent(request: dict[str, Any]) -> str:
    """Everything a request sent the model, one message per line."""
    return "\n".join(str(m.get("content")) for m in request["messages"])


def injected(request: dict[str, Any], heading: str = "## Memories") -> list[str]:
    """The injected memory blocks of a request."""
    return [
        str(m["content"])
        for m in request["messages"]
        if m["role"] == "user" and heading in str(m["content"])
    ]
