"""The recall budget: whatever was said before, the injected message stays within
``max_context_tokens`` (estimated), shortened memories are marked, and order is kept."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from agent_framework import Agent

from pgmemory import (
    ChatHistoryMemoryProvider,
    ChatHistoryMemoryProviderOptions,
    InvalidInputError,
    MemoryScope,
    MemoryStore,
)
from pgmemory.integrations.agent_framework.rendering import (
    RECENT_HEADING,
    RELATED_HEADING,
    UNTRUSTED_NOTE,
    fit_recall,
    format_recall,
    shorten,
)
from pgmemory.store.records import Memory
from pgmemory.text.tokens import estimate_tokens
from tests.conftest import unique
from tests.openai_server import OpenAIServer, text

HEADING = "## Memories\nConsider the following memories when answering user questions:"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def memory(content: str, *, role: str = "user", minutes: int = 0) -> Memory:
    return Memory(
        id=uuid.uuid4(),
        collection="c",
        scope=MemoryScope(user_id="u"),
        role=role,
        content=content,
        author_name=None,
        message_id=None,
        source_type="chat",
        source_id=None,
        embedding_model="m",
        created_at=T0 + timedelta(minutes=minutes),
        expires_at=None,
        metadata={},
    )


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


def test_shorten_keeps_head_and_tail_with_a_marker() -> None:
    long = "START " + "x y z " * 5000 + " END"
    short = shorten(long, 100)
    assert estimate_tokens(short) <= 100
    assert short.startswith("START") and short.endswith("END")
    assert "characters omitted …]" in short
    omitted = int(short.split("[… ")[1].split(" characters")[0].replace(",", ""))
    assert omitted > 25_000
    assert shorten("short", 100) == "short"


@pytest.mark.parametrize("budget", [100, 300, 2000, 8000])
@pytest.mark.parametrize("seed", range(5))
def test_never_over_budget_adversarial(budget: int, seed: int) -> None:
    rng = random.Random(seed)
    similar = [
        (memory(babble(rng, rng.choice([50, 2_000, 20_000, 32_000])), minutes=i), 1.0 - i / 10)
        for i in range(rng.randint(0, 10))
    ]
    recent = [
        memory(
            babble(rng, rng.choice([10, 500, 30_000])),
            role=rng.choice(["user", "assistant", "tool"]),
            minutes=1000 + i,
        )
        for i in range(rng.randint(0, 100))
    ]
    for heading in (HEADING, None):
        fitted = fit_recall(similar, recent, heading=heading, max_tokens=budget)
        assert estimate_tokens(fitted.text) <= budget
        # Similar memories: a prefix of the ranking; recent ones: the newest, oldest first.
        assert fitted.memories == similar[: len(fitted.memories)]
        assert fitted.recent == recent[len(recent) - len(fitted.recent) :]
        if budget >= 2000 and (similar or recent):
            assert fitted.memories or fitted.recent


def test_shortened_memories_are_marked_and_both_kinds_share_the_budget() -> None:
    similar = [(memory("我不能吃辣。" + "问" * 20_000, minutes=i), 1.0) for i in range(3)]
    recent = [
        memory("Q" + " question" * 2_500, minutes=100),
        memory("A" + " answer" * 5_000, role="assistant", minutes=101),
    ]
    fitted = fit_recall(similar, recent, heading=HEADING, max_tokens=2000)
    assert estimate_tokens(fitted.text) <= 2000
    assert len(fitted.memories) == 3 and fitted.recent == recent
    assert fitted.text.count("characters omitted …]") == 5
    assert "我不能吃辣" in fitted.text
    assert fitted.text.index(RELATED_HEADING) < fitted.text.index(RECENT_HEADING)
    # Recent messages still read oldest first.
    assert fitted.text.index('"Q ') < fitted.text.index('"A ')


def test_newest_recent_messages_win_when_not_all_fit() -> None:
    recent = [memory(f"turn {i} " + "word " * 400, minutes=i) for i in range(30)]
    fitted = fit_recall([], recent, heading=HEADING, max_tokens=1000)
    assert estimate_tokens(fitted.text) <= 1000
    assert fitted.recent and fitted.recent[-1] is recent[-1]
    assert len(fitted.recent) < len(recent)
    assert "turn 29 " in fitted.text and "turn 0 " not in fitted.text


def test_unbounded_and_too_small_budgets() -> None:
    similar = [(memory("x" * 40_000), 1.0)]
    assert len(format_recall(similar, [], heading=HEADING)) > 40_000
    none = fit_recall(similar, [], heading=HEADING, max_tokens=None)
    assert none.text == format_recall(similar, [], heading=HEADING)
    # A heading larger than the budget: nothing is shown rather than too much.
    nothing = fit_recall(similar, [], heading="h " * 500, max_tokens=100)
    assert nothing.text == "" and not nothing.memories
    assert UNTRUSTED_NOTE in fit_recall(similar, [], heading=None, max_tokens=200).text


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
