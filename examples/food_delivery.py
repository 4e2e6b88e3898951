"""The seeds' food-delivery agent on agent-framework, with pgmemory as memory and chat history.

    python examples/food_delivery.py            # offline: a local stand-in model
    PGMEMORY_OPENAI_BASE_URL=... PGMEMORY_OPENAI_API_KEY=... PGMEMORY_OPENAI_CHAT_MODEL=... \\
        python examples/food_delivery.py        # a real model through any OpenAI-compatible API

The agent is agent-framework's own ``Agent`` with its OpenAI chat-completions client and two
tools, GetMenu (seven dishes) and PlaceOrder (dish + quantity lines), told to order at most
three portions, respect the user's taste, vary dishes and differ from the last order. Alice
first asks for "one meat, one vegetable, nothing spicy"; later, in fresh sessions, she and Bob
just say "order me a meal". Memory is scoped by user id: Alice's later orders stay spice-free
and differ from her previous one; Bob never sees Alice's memories.

The user comes from the application, not from the session: ``current_user`` reads a context
variable the application sets per request (as its authentication middleware would). Offline,
the client talks to a stand-in on 127.0.0.1 that speaks the chat-completions protocol and
decides (:func:`decide`) from what a model would read. For every order the demo prints what
pgmemory injected: the conversation, without the tool calls and results it also stores.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agent_framework import Agent, AgentSession, ContextProvider, SessionContext, tool
from agent_framework.openai import OpenAIChatCompletionClient
from typing_extensions import TypedDict

from pgmemory import (
    ChatHistoryMemoryProvider,
    MemoryStore,
    PostgresHistoryProvider,
    Settings,
    chat_client,
)

COLLECTION = "food_delivery"
#: (dish, kind, spicy)
MENU = [
    ("辣椒炒肉", "meat", True),
    ("剁椒鱼头", "meat", True),
    ("番茄炒蛋", "meat", False),
    ("清蒸鲈鱼", "meat", False),
    ("清炒菜心", "vegetable", False),
    ("酸辣土豆丝", "vegetable", True),
    ("西芹百合", "vegetable", False),
]
INSTRUCTIONS = (
    "你是一个外卖点餐助手。先用 GetMenu 查看菜单，再用 PlaceOrder 下单。"
    "每次最多点三份；尊重用户的口味和忌口；菜品要有变化，不要和上一次点的一样。"
)

#: Who the current request is for: set by the application (its authentication), per request.
CURRENT_USER: contextvars.ContextVar[str] = contextvars.ContextVar("current_user")


def current_user(session: AgentSession) -> str:
    """pgmemory's user binding: the signed-in user of this request, never the session dict."""
    return CURRENT_USER.get()


class OrderLine(TypedDict):
    """One line of an order."""

    dish: str
    quantity: int


def get_menu() -> list[str]:
    """Returns today's menu."""
    return [dish for dish, _, _ in MENU]


def place_order(items: list[OrderLine]) -> str:
    """Places an order: a list of dishes with quantities (at most three portions in total)."""
    total = sum(line["quantity"] for line in items)
    if total > 3:
        raise ValueError(f"{total} portions ordered; at most 3 are allowed")
    unknown = [line["dish"] for line in items if line["dish"] not in get_menu()]
    if unknown:
        raise ValueError(f"not on the menu: {unknown}")
    return "订单已提交: " + "，".join(f"{line['dish']} x{line['quantity']}" for line in items)


class ShowInjected(ContextProvider):
    """Prints what the memory provider put into each request (for the demo)."""

    def __init__(self, memory: ChatHistoryMemoryProvider) -> None:
        super().__init__("show_injected")
        self.memory = memory

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict
    ) -> None:
        injected = context.context_messages.get(self.memory.source_id, [])
        print("  memory injected:" if injected else "  memory injected: (nothing)")
        for message in injected:
            for line in message.text.splitlines():
                print(f"    | {line}")


def build_agent(
    client: Any, store: MemoryStore, *, user_id: Any = current_user, show: bool = False
) -> Agent:
    """The seeds' agent: two tools, the instructions, pgmemory's history and memory per user."""
    history = PostgresHistoryProvider(store, user_id=user_id)
    memory = ChatHistoryMemoryProvider(store, COLLECTION, user_id=user_id)
    providers: list[ContextProvider] = [history, memory]
    if show:
        providers.append(ShowInjected(memory))
    return Agent(
        client=client,
        instructions=INSTRUCTIONS,
        name="FoodDeliveryAgent",
        tools=[tool(get_menu, name="GetMenu"), tool(place_order, name="PlaceOrder")],
        context_providers=providers,
    )


# --- the offline stand-in for a model -----------------------------------------------------

NO_SPICY = re.compile(r"不能吃辣|不吃辣|不要辣|no spicy|can't eat spicy|cannot eat spicy", re.I)
ORDERED = re.compile(r"已为您下单：([^。\"]*)")
SUBMITTED = re.compile(r"订单已提交: ([^\"\]]*)")


def decide(transcript: Sequence[tuple[str, str]], tools_called: Sequence[str]) -> dict[str, Any]:
    """What a careful model would do next, from the visible text only.

    ``transcript`` is (role, text) of everything the model sees; ``tools_called`` the tools
    already called in this turn. Returns ``{"call": name, "arguments": {...}}`` or
    ``{"text": ...}``; the final text names what was ordered, which is how a later turn (its
    recalled memories) knows the last order.
    """
    seen = "\n".join(text for _, text in transcript)
    if "GetMenu" not in tools_called:
        return {"call": "GetMenu", "arguments": {}}
    if "PlaceOrder" not in tools_called:
        avoid_spicy = bool(NO_SPICY.search(seen))
        last = ORDERED.findall(seen)
        # The newest order is the last one shown (recent messages come oldest first).
        last_dishes = {d for d, _, _ in MENU if d in last[-1]} if last else set()
        picks = []
        for kind in ("meat", "vegetable"):
            for dish, dish_kind, spicy in MENU:
                if dish_kind == kind and not (avoid_spicy and spicy) and dish not in last_dishes:
                    picks.append({"dish": dish, "quantity": 1})
                    break
        return {"call": "PlaceOrder", "arguments": {"items": picks}}
    submitted = SUBMITTED.findall(seen)
    return {"text": f"已为您下单：{submitted[-1] if submitted else '—'}。祝您用餐愉快！"}


class StandIn(BaseHTTPRequestHandler):
    """A chat-completions endpoint that answers with its server's ``answer(body)`` step
    (:func:`step_for` by default: :func:`decide`)."""

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        step = getattr(self.server, "answer", step_for)(body)
        if "call" in step:
            arguments = json.dumps(step["arguments"], ensure_ascii=False)
            call = {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": step["call"], "arguments": arguments},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": step["text"]}, "stop"
        reply = json.dumps(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def step_for(body: dict[str, Any]) -> dict[str, Any]:
    """:func:`decide` over a chat-completions request body."""
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    called = [
        c["function"]["name"] for m in messages[last_user:] for c in m.get("tool_calls") or []
    ]
    return decide([(m["role"], str(m.get("content") or "")) for m in messages], called)


def serve_stand_in(
    answer: Callable[[dict[str, Any]], dict[str, Any]] = step_for,
) -> tuple[ThreadingHTTPServer, str]:
    """The stand-in model on 127.0.0.1 (a free port), served on a thread: (server, base URL).
    ``answer(body)`` returns a :func:`decide`-style step; stop it with ``server.shutdown()``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    server.answer = answer  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


SCRIPT = [
    ("alice", "帮我点一份外卖，一荤一素，我不能吃辣"),
    ("alice", "帮我点一份外卖"),
    ("bob", "帮我点一份外卖"),
    ("alice", "帮我点一份外卖"),
    ("bob", "帮我点一份外卖"),
    ("alice", "帮我点一份外卖"),
]


async def main() -> None:
    settings = Settings()
    server = None
    if settings.openai_base_url or settings.openai_api_key:
        client = chat_client(settings)
        print(
            f"model: {settings.openai_chat_model} at {settings.openai_base_url or 'api.openai.com'}"
        )
    else:
        server, url = serve_stand_in()
        client = OpenAIChatCompletionClient(model="stand-in", base_url=url, api_key="offline")
        print(f"model: offline stand-in at {url} (set PGMEMORY_OPENAI_* for a real model)")
    try:
        async with MemoryStore(migrate=True, settings=settings) as store:
            agent = build_agent(client, store, show=True)
            run = uuid.uuid4().hex[:6]  # fresh users each run, so the demo starts from no memories
            for turn, (user, text) in enumerate(SCRIPT, 1):
                CURRENT_USER.set(f"{user}-{run}")  # what the application's sign-in binds
                session = agent.create_session()
                print(f"\n#{turn} {user} (new session {session.session_id[:8]}): {text}")
                response = await agent.run(text, session=session)
                for message in response.messages:
                    for content in message.contents:
                        if content.type == "function_call" and content.name == "PlaceOrder":
                            print(f"  PlaceOrder {content.arguments}")
                print(f"  reply: {response.text}")
    finally:
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
