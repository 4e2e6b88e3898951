"""The recall statement against today's provider recall path, on one seeded scope, one run.

    python bench/store/recall_statement.py [--messages 1000] [--runs 200] [--mode hybrid]
                                           [--json FILE]

One user's scope of ``--messages`` chat messages (user and assistant turns of about 18 words,
in sessions of 20, one tool call and result per session) in a scratch database. Both paths get
the chat-history provider's default options (hybrid, 3 results, 2 recent turns, 2,000 tokens,
near-duplicates at 0.9) and the same queries (``--mode`` changes the ranking of both), alternated ABAB:

* ``provider``: ``ChatHistoryMemoryProvider._recall`` as it is today (``store.list`` pages of
  the recent turns, up to four unaudited searches, deduplication and fitting in Python, then
  ``record_recall``);
* ``statement``: ``MemoryStore.recall`` (one statement, audit row included).

Query embeddings are cached after a warm-up, so the figures are the SQL and Python of a recall
(the embedding is the same for both). Prints p50 / p95 per path, their ratio, the round trips
of each, and for how many of the queries both show the same memories (with tool rows included
in the statement's recall, as today's path shows them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._common.scratch import Server
from pgmemory.embedders import CachedEmbedder, USEEmbedder
from pgmemory.memory.chat_history import ChatHistoryMemoryProvider
from pgmemory.memory.chat_history_options import ChatHistoryMemoryProviderOptions
from pgmemory.runtime.session import AgentSession
from pgmemory.store.records import MemoryRecord, MemoryScope, RecallTrace
from pgmemory.store.store import MemoryStore

WORDS = [
    "order",
    "pizza",
    "sushi",
    "noodles",
    "curry",
    "spicy",
    "mild",
    "allergy",
    "peanuts",
    "gluten",
    "dinner",
    "lunch",
    "tonight",
    "tomorrow",
    "delivery",
    "address",
    "Lisbon",
    "Berlin",
    "office",
    "home",
    "vegetarian",
    "vegan",
    "chicken",
    "salad",
    "soup",
    "dessert",
    "coffee",
    "tea",
    "budget",
    "cheap",
    "favourite",
    "restaurant",
    "Thai",
    "Indian",
    "Italian",
    "Japanese",
    "again",
    "last",
    "time",
    "different",
    "same",
    "friend",
    "Bob",
    "Alice",
    "birthday",
    "party",
    "quick",
    "late",
    "early",
    "weekend",
]
QUERIES = [
    "order me something for dinner",
    "what did I have last time?",
    "does Bob have any allergies",
    "something different from last time please",
    "cheap vegetarian lunch near the office",
    "is there a Thai restaurant I liked",
    "coffee and dessert for the weekend",
    "what is my delivery address",
]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(18))


async def _seed(store: MemoryStore, scope: MemoryScope, messages: int) -> None:
    rng = random.Random(22)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    records = []
    for i in range(messages):
        session = f"s{i // 20}"
        at = t0 + timedelta(minutes=i)
        where = MemoryScope(user_id=scope.user_id, session_id=session)
        if i % 20 == 18:
            records.append(
                MemoryRecord(
                    content="[called GetMenu with {}]",
                    scope=where,
                    role="assistant",
                    created_at=at,
                    message_id=f"m{i}",
                )
            )
        elif i % 20 == 19:
            records.append(
                MemoryRecord(
                    content=_text(rng), scope=where, role="tool", created_at=at, message_id=f"m{i}"
                )
            )
        else:
            role = "user" if i % 2 == 0 else "assistant"
            records.append(MemoryRecord(content=_text(rng), scope=where, role=role,
                                        created_at=at, message_id=f"m{i}"))  # fmt: skip
    await store.add("chat", records)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(messages: int, runs: int, mode: str) -> dict[str, object]:
    server = Server()
    try:
        with server.scratch("recall") as url:
            embedder = CachedEmbedder(USEEmbedder())
            async with MemoryStore(url, embedder=embedder) as store:
                await store.create_collection("chat")
                scope = MemoryScope(user_id="bench")
                await _seed(store, scope, messages)
                options = ChatHistoryMemoryProviderOptions(recall_mode=mode)  # type: ignore[arg-type]
                provider = ChatHistoryMemoryProvider(
                    store,
                    "chat",
                    state_initializer=lambda s: ChatHistoryMemoryProvider.State(
                        storage_scope=scope
                    ),
                    options=options,
                )
                state = ChatHistoryMemoryProvider.State(storage_scope=scope)
                session = AgentSession(session_id="bench-session")
                trace = RecallTrace(provider="bench", session_id="bench-session")

                async def old(query: str) -> list[object]:
                    shown = await provider._recall(
                        state, session, query, heading=options.context_prompt
                    )
                    return [m.id for m, _ in shown.memories] + [m.id for m in shown.recent]

                async def new(query: str, include_tools: bool = False) -> list[object]:
                    got = await store.recall(
                        "chat", scope, query=query, max_results=options.max_results,
                        recent_turns=options.recent_turns,
                        max_tokens=options.max_context_tokens, mode=options.recall_mode,
                        weights=options.weights,
                        near_duplicate_threshold=options.near_duplicate_threshold,
                        heading=options.context_prompt, trace=trace, include_tools=include_tools,
                    )  # fmt: skip
                    return list(got.memory_ids)

                # Warm-up: embeddings cached, statements prepared, pages cached.
                for q in QUERIES:
                    await old(q)
                    await new(q)
                trips = await _round_trips(store, old, new)
                # Parity: today's path shows tool rows, so compare with include_tools=True.
                same = 0
                for q in QUERIES:
                    same += set(await old(q)) == set(await new(q, include_tools=True))
                times: dict[str, list[float]] = {"provider": [], "statement": []}
                for i in range(runs):
                    q = QUERIES[i % len(QUERIES)]
                    order = [("provider", old), ("statement", new)]
                    if i % 2:
                        order.reverse()
                    shown: dict[str, list[object]] = {}
                    for name, path in order:
                        t = time.perf_counter()
                        shown[name] = await path(q)
                        times[name].append((time.perf_counter() - t) * 1000)
                result = {
                    "messages": messages,
                    "runs": runs,
                    "mode": mode,
                    "server": server.info(),
                    **{
                        name: {
                            "p50_ms": round(statistics.median(v), 2),
                            "p95_ms": round(_p(v, 0.95), 2),
                            "round_trips": trips[name],
                        }
                        for name, v in times.items()
                    },
                    # share of the queries for which both showed the same memories (tools on)
                    "same_memories_shown": round(same / len(QUERIES), 3),
                }
                result["speedup_p50"] = round(
                    result["provider"]["p50_ms"] / result["statement"]["p50_ms"],
                    2,  # type: ignore[index]
                )
                return result
    finally:
        server.close()


async def _round_trips(store: MemoryStore, old: object, new: object) -> dict[str, int]:
    """Statements each path sends for one recall (counted on the database's verbs)."""
    db = store.database
    counts = {"n": 0}
    originals = {name: getattr(db, name) for name in ("fetch", "read")}

    def counting(name: str) -> object:
        original = originals[name]

        def wrapper(*args: object, **kwargs: object) -> object:
            counts["n"] += 1
            return original(*args, **kwargs)

        return wrapper

    out = {}
    for name in ("fetch", "read"):
        setattr(db, name, counting(name))
    try:
        for label, path in (("provider", old), ("statement", new)):
            counts["n"] = 0
            await path(QUERIES[0])  # type: ignore[operator]
            out[label] = counts["n"]
    finally:
        for name, original in originals.items():
            setattr(db, name, original)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--mode", default="hybrid", choices=["hybrid", "vector", "text"])
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    result = asyncio.run(run(args.messages, args.runs, args.mode))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
