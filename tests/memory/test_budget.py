"""The recall budget: whatever was said before, the injected message stays within
``max_context_tokens`` (estimated), shortened memories are marked, and order is kept."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from agent_framework import Agent

from pgmemory import (
    ChatHistoryMemoryProvider,
    ChatHistoryMemoryProviderOptions,
    InvalidInputError,
    MemoryScope,
    MemoryStore,
)
from pgmemory.store.recall_text import RECENT_HEADING
from pgmemory.store.records import MemoryRecord
from pgmemory.text.tokens import estimate_tokens
from tests.conftest import unique
from tests.openai_server import OpenAIServer, text

HEADING = "## Memories\nConsider the following memories when answering user questions:"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def babble(rng: random.Random, chars: int) -> str:
    """English, Chinese, JSON and numbers, mixed."""
    pieces = [
        "I ordered two pizzas and a salad. ",
        "帮我点一份外卖，一荤一素，我不能吃辣。",
        '{"dish": "清蒸鲈鱼", "quantity": 1}, ',
        "1234567890 ",
        '\n\t"quoted" \\ back\\slash ',
    ]
    out: list[str] = []
    while sum(map(len, out)) < chars:
        out.append(rng.choice(pieces))
    return "".join(out)[:chars]


@pytest.mark.parametrize("budget", [100, 300, 2000, 8000])
@pytest.mark.parametrize("seed", range(3))
async def test_never_over_budget_adversarial(
    store: MemoryStore, collection: str, budget: int, seed: int
) -> None:
    """Whatever was stored (long, CJK, JSON, escapes), the recall's text stays within the
    budget; shown matches keep their ranking and shown recent turns are the newest."""
    rng = random.Random(seed)
    scope = MemoryScope(user_id=unique("budget"))
    rows = [
        MemoryRecord(
            content=babble(rng, rng.choice([10, 500, 2_000, 20_000, 32_000])),
            scope=scope,
            role="user" if i % 2 == 0 else "assistant",
            created_at=T0 + timedelta(minutes=i),
            embedding=np.random.default_rng(seed * 100 + i).standard_normal(512).tolist(),
        )
        for i in range(rng.randint(0, 30))
    ]
    if rows:
        await store.add(collection, rows)
    for heading in (HEADING, None):
        shown = await store.recall(
            collection, scope, query="pizza 外卖 salad", max_tokens=budget, heading=heading
        )
        assert estimate_tokens(shown.text) <= budget
        recent = [item.memory for item in shown.items if item.reason == "recent"]
        newest = sorted(rows, key=lambda r: r.created_at)[len(rows) - len(recent) :]
        assert [m.content for m in recent] == [r.content for r in newest]
        if budget >= 2000 and rows:
            assert shown.items
        if shown.items and any(len(r.content) > 4 * budget for r in rows):
            assert "characters omitted …]" in shown.text or len(shown.items) < len(rows)


async def test_unbounded_and_too_small_budgets(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id=unique("budget"))
    await store.add(collection, [MemoryRecord(content="x " * 15_000, scope=scope)])
    unbounded = await store.recall(collection, scope, query="x", max_tokens=None, heading=HEADING)
    assert len(unbounded.text) > 30_000 and "omitted" not in unbounded.text
    # A heading larger than the budget: nothing is shown rather than too much.
    nothing = await store.recall(collection, scope, query="x", max_tokens=100, heading="h " * 500)
    assert nothing.text == "" and not nothing.items


def test_option_is_checked() -> None:
    assert ChatHistoryMemoryProviderOptions().max_context_tokens == 2000
    assert ChatHistoryMemoryProviderOptions(max_context_tokens=None).max_context_tokens is None
    for wrong in (0, 99, "2000", 2000.0, True):
        with pytest.raises(InvalidInputError, match="max_context_tokens"):
            ChatHistoryMemoryProviderOptions(max_context_tokens=wrong)  # type: ignore[arg-type]


def _injected(request: dict[str, Any]) -> str:
    (found,) = [
        m["content"]
        for m in request["messages"]
        if m["role"] == "user" and (m.get("content") or "").startswith(HEADING)
    ]
    return str(found)


@pytest.mark.slow
async def test_ten_long_sessions_then_a_short_question(
    store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    """The issue's case: 20k-character questions, 30k-character answers, in CJK and English."""
    collection = unique("budget")
    user = unique("u")
    memory_provider = ChatHistoryMemoryProvider(store, collection, user_id=user)
    agent = Agent(chat_client, "You help.", context_providers=[memory_provider])
    rng = random.Random(7)
    for i in range(10):
        session = agent.create_session()
        openai_server.queue(text(f"answer {i} " + babble(rng, 30_000)))
        await agent.run(f"question {i} " + babble(rng, 20_000), session=session)
    session = agent.create_session()
    openai_server.queue(text("ok"))
    start = len(openai_server.requests)
    await agent.run("What did I order last time?", session=session)
    injected = _injected(openai_server.requests[start])
    assert estimate_tokens(injected) <= 2000
    assert "characters omitted …]" in injected
    recent = injected.split(RECENT_HEADING)[1]
    assert "answer 9 " in recent and "question 9 " in recent  # the newest turn, shortened
