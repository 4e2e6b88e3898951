"""The seeds' food-delivery agent, with chat-history memory scoped per user.

    python examples/food_delivery.py            # offline replay (no model needed)
    PGMEMORY_OPENAI_BASE_URL=... PGMEMORY_OPENAI_API_KEY=... PGMEMORY_OPENAI_CHAT_MODEL=... \\
        python examples/food_delivery.py        # a real model through any OpenAI-compatible API

The agent has two tools, GetMenu (seven dishes) and PlaceOrder (dish + quantity lines), and
instructions to order at most three portions, respect the user's taste, vary dishes and differ
from the last order. Alice first asks for "one meat, one vegetable, nothing spicy"; later, in
fresh sessions, she and Bob just say "order me a meal". Memory is scoped by user id: Alice's
later orders stay spice-free and differ from her previous one; Bob never sees Alice's memories.

Without an endpoint the same agent runs against ``ReplayModel``, a small rule-based stand-in
for the model that reads only what the model would read (instructions, injected memories,
tool results), so the memory behaviour can be watched offline: for every order the demo prints
what the memory provider injected.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import uuid
from collections.abc import Sequence
from typing import Any

from typing_extensions import TypedDict

from pgmemory import (
    Agent,
    AgentSession,
    ChatHistoryMemoryProvider,
    ChatResponse,
    ContextProvider,
    FunctionCallContent,
    MemoryScope,
    MemoryStore,
    Message,
    OpenAIChatClient,
    SessionContext,
    Settings,
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


def user_scope(session: AgentSession) -> ChatHistoryMemoryProvider.State:
    """Store and search per user: the user id comes from the session's state."""
    user_id = session.state.get("user_id")
    if not isinstance(user_id, str) or not user_id:
        raise ValueError('put the user id in the session first: session.state["user_id"] = "alice"')
    return ChatHistoryMemoryProvider.State(storage_scope=MemoryScope(user_id=user_id))


class ShowInjected(ContextProvider):
    """Prints what the memory provider put into each request (for the demo)."""

    def __init__(self, memory: ChatHistoryMemoryProvider) -> None:
        super().__init__("show_injected")
        self.memory = memory

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict
    ) -> None:
        injected = context.get_messages(sources=[self.memory.source_id])
        print("  memory injected:" if injected else "  memory injected: (nothing)")
        for message in injected:
            for line in message.text.splitlines():
                print(f"    | {line}")


def build_agent(client: Any, store: MemoryStore, *, show: bool = False) -> Agent:
    """The seeds' agent: two tools, the instructions, chat-history memory per user."""
    memory = ChatHistoryMemoryProvider(store, COLLECTION, state_initializer=user_scope)
    providers: list[ContextProvider] = [memory]
    if show:
        providers.append(ShowInjected(memory))
    from pgmemory import tool

    return Agent(
        client,
        INSTRUCTIONS,
        name="FoodDeliveryAgent",
        tools=[tool(get_menu, name="GetMenu"), tool(place_order, name="PlaceOrder")],
        context_providers=providers,
    )


# --- the offline stand-in for a model -----------------------------------------------------

NO_SPICY = re.compile(r"不能吃辣|不吃辣|不要辣|no spicy|can't eat spicy|cannot eat spicy", re.I)
ORDER_CALL = re.compile(r"called PlaceOrder with (\{.*?\}|\[.*?\])\]")


def decide(transcript: Sequence[tuple[str, str]], tools_called: Sequence[str]) -> dict[str, Any]:
    """What a careful model would do next, from the visible text only.

    ``transcript`` is (role, text) of everything the model sees; ``tools_called`` the tools
    already called in this turn. Returns ``{"call": name, "arguments": {...}}`` or
    ``{"text": ...}``.
    """
    if "GetMenu" not in tools_called:
        return {"call": "GetMenu", "arguments": {}}
    if "PlaceOrder" not in tools_called:
        seen = "\n".join(text for _, text in transcript)
        avoid_spicy = bool(NO_SPICY.search(seen))
        last = ORDER_CALL.findall(seen)
        last_dishes = set()
        if last:
            # The newest order is the last one shown (recent messages come oldest first).
            last_dishes = {d for d, _, _ in MENU if d in last[-1]}
        picks = []
        for kind in ("meat", "vegetable"):
            for dish, dish_kind, spicy in MENU:
                if dish_kind == kind and not (avoid_spicy and spicy) and dish not in last_dishes:
                    picks.append({"dish": dish, "quantity": 1})
                    break
        return {"call": "PlaceOrder", "arguments": {"items": picks}}
    return {"text": "已为您下单，祝您用餐愉快！"}


class ReplayModel:
    """A ChatClient that follows :func:`decide` instead of calling a model."""

    async def get_response(
        self, messages: Sequence[Message], *, tools: Sequence[Any] = (), **_: Any
    ) -> ChatResponse:
        transcript = [(m.role, m.text) for m in messages]
        last_user = max(
            i for i, m in enumerate(messages) if m.role == "user" and m.source_type == "external"
        )
        called = [c.name for m in messages[last_user:] for c in m.function_calls]
        step = decide(transcript, called)
        if "call" in step:
            call = FunctionCallContent(
                call_id=f"call_{uuid.uuid4().hex[:8]}",
                name=step["call"],
                arguments=json.dumps(step["arguments"], ensure_ascii=False),
            )
            return ChatResponse(messages=[Message("assistant", contents=[call])])
        return ChatResponse(messages=[Message("assistant", step["text"])])


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
    real = bool(
        settings.openai_base_url or settings.openai_api_key or os.environ.get("OPENAI_API_KEY")
    )
    client: Any = OpenAIChatClient.from_settings(settings) if real else ReplayModel()
    print(
        "model:",
        f"{settings.openai_chat_model} at {settings.openai_base_url or 'api.openai.com'}"
        if real
        else "offline replay (set PGMEMORY_OPENAI_BASE_URL/API_KEY/CHAT_MODEL for a real model)",
    )
    async with MemoryStore(migrate=True, settings=settings) as store:
        await store.create_collection(COLLECTION)
        run = uuid.uuid4().hex[:6]  # fresh users each run, so the demo starts from no memories
        agent = build_agent(client, store, show=True)
        for turn, (user, text) in enumerate(SCRIPT, 1):
            session = agent.create_session()
            session.state["user_id"] = f"{user}-{run}"
            print(f"\n#{turn} {user} (new session {session.session_id[:8]}): {text}")
            response = await agent.run(text, session=session)
            orders = [
                c for m in response.messages for c in m.function_calls if c.name == "PlaceOrder"
            ]
            for call in orders:
                print(f"  PlaceOrder {call.arguments}")
            print(f"  reply: {response.text}")
        print("\nrecall audit (which memories went into each answer):")
        async with store.engine.begin() as conn:
            from sqlalchemy import text as sql

            rows = await conn.execute(
                sql(
                    "SELECT user_id, cardinality(memory_ids) AS n, at FROM pgmemory_recall_audit "
                    "WHERE collection = :c AND user_id LIKE :p ORDER BY at"
                ),
                {"c": COLLECTION, "p": f"%-{run}"},
            )
            for row in rows:
                print(f"  {row.at:%H:%M:%S} {row.user_id}: {row.n} memories")


if __name__ == "__main__":
    asyncio.run(main())
