"""How large is what the chat-history provider injects, unbounded (before ``max_context_tokens``)
and with the default budget?

    .venv/bin/python bench/retrieval/injection.py            # ~10 min on 2 cores
    .venv/bin/python bench/retrieval/injection.py --scenarios locomo --locomo-conversations 10

Two scenarios, each run once with two providers recalling the same stored memories (the
default one stores the turns; an unbounded twin stores nothing and only injects):

* ``food``: the food-delivery demo's agent (agent-framework's ``Agent``) and its offline
  stand-in model over HTTP — a first order with "no spicy", then 20 more "order me something
  different from last time"; every injection counts.
* ``long``: 10 sessions of a ~20,000-character question and a ~30,000-character answer
  (English, Chinese, JSON mixed), then a short question; every injection from the second
  session on counts (two users).

* ``locomo``: LoCoMo conversations (``../shared/bench-data``, read at run time) replayed
  through the agent, one run per exchange (the second speaker's turns of an exchange as one
  reply: a chat-completions answer is one message), then their questions asked in fresh
  sessions; only the questions' injections count (default: 3 conversations, 40 questions each).

Prints characters and estimated tokens (:func:`pgmemory.text.tokens.estimate_tokens`) as
p50 / p95 / max. Runs on a scratch database (created and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)
from agent_framework import Agent, AgentSession, ContextProvider, Message, SessionContext, tool
from agent_framework.openai import OpenAIChatCompletionClient
from tqdm.auto import tqdm

from bench._common.paths import ROOT
from bench._common.scratch import Server
from pgmemory import (
    ChatHistoryMemoryProvider,
    ChatHistoryMemoryProviderOptions,
    MemoryStore,
    Settings,
)
from pgmemory.text.tokens import estimate_tokens

_spec = importlib.util.spec_from_file_location(
    "food_delivery", ROOT / "examples" / "food_delivery.py"
)
food = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(food)  # type: ignore[union-attr]


class Record(ContextProvider):
    """Keeps the text each watched provider injected, per provider."""

    def __init__(self, *watched: ChatHistoryMemoryProvider) -> None:
        super().__init__("record_injected")
        self.watched = watched
        self.sizes: dict[str, list[str]] = {p.source_id: [] for p in watched}
        self.kept: dict[str, list[str]] = {}

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict
    ) -> None:
        for provider in self.watched:
            for message in context.context_messages.get(provider.source_id, []):
                self.sizes[provider.source_id].append(message.text)


class LongModel:
    """The stand-in model's answer to every question: ~30,000 characters."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"text": "Answer: " + babble(self.rng, 30_000)}


def babble(rng: random.Random, chars: int) -> str:
    pieces = [
        "I ordered two pizzas and a salad for dinner, the same as last week. ",
        "帮我点一份外卖，一荤一素，我不能吃辣，上次点的是清蒸鲈鱼和西芹百合。",
        '{"dish": "清蒸鲈鱼", "quantity": 1, "price": 58.0}, ',
        "The meeting moved to Thursday at 3pm; bring the Q3 numbers. ",
    ]
    out: list[str] = []
    size = 0
    while size < chars:
        out.append(rng.choice(pieces))
        size += len(out[-1])
    return "".join(out)[:chars]


def agent_with(answer: Any, store: MemoryStore, tools: list[Any], instructions: str) -> tuple:
    """The agent on the stand-in model answering with ``answer(body)``; the user of each run
    is bound through ``food.CURRENT_USER``. Returns (agent, record, stand-in server)."""
    server, url = food.serve_stand_in(answer)
    client = OpenAIChatCompletionClient(model="stand-in", base_url=url, api_key="offline")
    bounded = ChatHistoryMemoryProvider(
        store, food.COLLECTION, user_id=food.current_user, source_id="bounded"
    )
    unbounded = ChatHistoryMemoryProvider(
        store,
        food.COLLECTION,
        user_id=food.current_user,
        source_id="unbounded",
        options=ChatHistoryMemoryProviderOptions(
            max_context_tokens=None,
            storage_input_message_filter=lambda _: [],
            storage_output_message_filter=lambda _: [],
        ),
    )
    record = Record(unbounded, bounded)
    agent = Agent(
        client=client,
        instructions=instructions,
        tools=tools,
        context_providers=[bounded, unbounded, record],
    )
    return agent, record, server


async def food_scenario(store: MemoryStore) -> Record:
    tools = [tool(food.get_menu, name="GetMenu"), tool(food.place_order, name="PlaceOrder")]
    agent, record, server = agent_with(food.step_for, store, tools, food.INSTRUCTIONS)
    try:
        food.CURRENT_USER.set("alice-bench")
        for i in range(21):
            ask = (
                "帮我点一份外卖，一荤一素，我不能吃辣"
                if i == 0
                else "帮我点一份外卖，和上次点的不一样"
            )
            await agent.run(ask, session=agent.create_session())
    finally:
        server.shutdown()
    return record


async def long_scenario(store: MemoryStore) -> Record:
    agent, record, server = agent_with(LongModel(1), store, [], "You help.")
    try:
        for user in ("carol-bench", "dave-bench"):
            food.CURRENT_USER.set(user)
            rng = random.Random(user)
            for i in range(11):
                ask = "What did we decide last time?" if i == 10 else babble(rng, 20_000)
                await agent.run(ask, session=agent.create_session())
    finally:
        server.shutdown()
    return record


class ScriptedModel:
    """Replays a conversation: answers each run with the next scripted assistant turns (one
    message), then with a short reply."""

    def __init__(self) -> None:
        self.next: list[str] = []

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        texts, self.next = self.next or ["OK."], []
        return {"text": "\n".join(texts)}


async def locomo_scenario(store: MemoryStore, conversations: int, questions: int) -> Record:
    """LoCoMo conversations replayed through the agent (one session per LoCoMo session, one run
    per exchange: the first speaker's turns as the user, the second's as the reply), then
    ``questions`` of each conversation's questions asked in fresh sessions; only those
    questions' injections count."""
    from bench.retrieval._datasets import DEFAULT_DATA_DIR, load_locomo, locomo_provider_messages

    path = DEFAULT_DATA_DIR / "locomo10.json.gz"
    messages = locomo_provider_messages(path)
    data = load_locomo(path)
    model = ScriptedModel()
    agent, record, server = agent_with(model, store, [], "You help.")
    try:
        await _replay(agent, record, model, messages, data, conversations, questions)
    finally:
        server.shutdown()
    record.sizes = record.kept
    return record


async def _replay(
    agent: Agent,
    record: Record,
    model: ScriptedModel,
    messages: Any,
    data: Any,
    conversations: int,
    questions: int,
) -> None:
    for conv in list(messages)[:conversations]:
        user = f"locomo-{conv}"
        exchanges: list[tuple[str, list[str], list[str]]] = []  # (session, user, assistant)
        for m in messages[conv]:
            if m.role == "user" and (
                not exchanges or exchanges[-1][2] or exchanges[-1][0] != m.session_id
            ):
                exchanges.append((m.session_id, [], []))
            if not exchanges:
                exchanges.append((m.session_id, [], []))
            exchanges[-1][1 if m.role == "user" else 2].append(m.text)
        food.CURRENT_USER.set(user)
        session: AgentSession | None = None
        current = None
        for session_id, asked, answered in tqdm(exchanges, desc=f"replay {conv}", leave=False):
            if session is None or current != session_id:
                session, current = agent.create_session(), session_id
            model.next = answered
            await agent.run([Message("user", [t]) for t in asked] or "…", session=session)
        record.sizes = {k: [] for k in record.sizes}  # only the questions' injections count
        for q in [q for q in data.questions if q.scope == conv][:questions]:
            await agent.run(q.text, session=agent.create_session())
        record.kept = {k: record.kept.get(k, []) + v for k, v in record.sizes.items()}


def row(name: str, texts: list[str]) -> str:
    def stats(values: list[int]) -> str:
        values = sorted(values)
        p50 = statistics.median(values)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        return f"{p50:>8,.0f} {p95:>8,} {max(values):>8,}"

    chars = [len(t) for t in texts]
    tokens = [estimate_tokens(t) for t in texts]
    return f"| {name:<26} | {len(texts):>3} | {stats(chars)} | {stats(tokens)} |"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios",
        nargs="+",
        choices=("food", "long", "locomo"),
        default=["food", "long", "locomo"],
    )
    parser.add_argument("--locomo-conversations", type=int, default=3, help="default 3 of 10")
    parser.add_argument("--locomo-questions", type=int, default=40, help="per conversation")
    args = parser.parse_args()
    scenarios = {
        "food": food_scenario,
        "long": long_scenario,
        "locomo": lambda store: locomo_scenario(
            store, args.locomo_conversations, args.locomo_questions
        ),
    }
    server = Server()
    try:
        print(server.info())
        print(
            "| scenario / provider        |   n |  chars p50      p95      max |"
            " tokens p50      p95      max |"
        )
        print("|---|---:|---:|---:|")
        for name in args.scenarios:
            with server.scratch(f"inj_{name}") as url:
                async with MemoryStore(url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
                    await store.create_collection(food.COLLECTION)
                    record = await scenarios[name](store)
            print(row(f"{name}: before (unbounded)", record.sizes["unbounded"]))
            print(row(f"{name}: after (default 2000)", record.sizes["bounded"]))
    finally:
        server.close()


if __name__ == "__main__":
    asyncio.run(main())
