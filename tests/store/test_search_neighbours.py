"""Hybrid search's neighbours (SearchWeights.neighbour): the message next to the match counts.

Every vector here is built with a chosen cosine to the query's own embedding, and only the
matching message contains the query's words, so each fused score is known in advance:
similarity min-max scaled over the scope (the fillers have cosine 0, the match 1, so a row's
part is its cosine) plus BM25 / the scope's best (1 for the match, 0 elsewhere).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from pgmemory.embedders import CachedEmbedder
from pgmemory.errors import InvalidInputError
from pgmemory.store import queries
from pgmemory.store.records import MemoryRecord, MemoryScope, SearchWeights
from pgmemory.store.store import MemoryStore
from tests.conftest import unique

QUERY = "zebra quartz"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


async def at_cosine(embedder: CachedEmbedder, seed: int) -> tuple[np.ndarray, object]:
    """The query's unit vector, and a maker of vectors with a given cosine to it."""
    q = (await embedder.embed([QUERY]))[0].astype(np.float64)
    q /= np.linalg.norm(q)
    rng = np.random.default_rng(seed)

    def make(cos: float) -> np.ndarray:
        u = rng.standard_normal(q.size)
        u -= (u @ q) * q
        u /= np.linalg.norm(u)
        return (cos * q + np.sqrt(1 - cos * cos) * u).astype(np.float32)

    return q, make


def record(content: str, vector: np.ndarray, scope: MemoryScope, seconds: int) -> MemoryRecord:
    return MemoryRecord(
        content=content,
        scope=scope,
        embedding=vector,
        created_at=T0 + timedelta(seconds=seconds),
    )


async def test_the_reply_next_to_the_match_overtakes_a_better_lone_match(
    store: MemoryStore, collection: str, embedder: CachedEmbedder
) -> None:
    _, make = await at_cosine(embedder, seed=1)
    scope = MemoryScope(user_id=unique("u"), session_id="chat-1")
    rows = [
        ("small talk before", 0.0),
        (f"{QUERY}, which one do you mean?", 1.0),  # the question turn: matches everything
        ("the answer: the one in the blue drawer", 0.2),  # its reply: weakly similar
        ("filler one", 0.0),
        ("filler two", 0.0),
        ("a distractor, fairly similar on its own", 0.5),
        ("filler three", 0.0),
    ]
    await store.add(
        collection,
        [record(text, make(cos), scope, 60 * i) for i, (text, cos) in enumerate(rows)],
    )

    async def ranking(weights: SearchWeights) -> list[tuple[str, float]]:
        hits = await store.search(
            collection, scope, query=QUERY, mode="hybrid", limit=4, weights=weights
        )
        return [(h.memory.content, round(h.score, 4)) for h in hits]

    without = await ranking(SearchWeights(neighbour=0.0))
    assert without[:3] == [(rows[1][0], 2.0), (rows[5][0], 0.5), (rows[2][0], 0.2)]
    # with neighbours (the default, 0.5): reply 0.2 + 0.5 x 2.0, the question turn 2.0 + 0.5
    # x 0.2, the turn before it 0 + 0.5 x 2.0; the distractor's neighbours are fillers (0)
    assert SearchWeights().neighbour == 0.5
    assert await ranking(SearchWeights()) == [
        (rows[1][0], 2.1),
        (rows[2][0], 1.2),
        (rows[0][0], 1.0),
        (rows[5][0], 0.5),
    ]


async def test_neighbours_come_from_the_same_user_and_conversation_only(
    store: MemoryStore, collection: str, embedder: CachedEmbedder
) -> None:
    _, make = await at_cosine(embedder, seed=2)
    alice, bob = unique("alice"), unique("bob")
    lone = record(
        "a lone note, fairly similar", make(0.5), MemoryScope(user_id=alice, session_id="chat-1"), 0
    )
    later = record("a filler note", make(0.0), MemoryScope(user_id=alice, session_id="chat-1"), 600)
    # right next to the lone note in time, and the best match there is, but in another
    # conversation of Alice's, and in Bob's conversation of the same session id
    other_chat = record(
        f"{QUERY} here", make(1.0), MemoryScope(user_id=alice, session_id="chat-2"), 1
    )
    bobs = record(f"{QUERY} for Bob", make(1.0), MemoryScope(user_id=bob, session_id="chat-1"), -1)
    await store.add(collection, [lone, later, other_chat, bobs])

    for weights in (SearchWeights(), SearchWeights(neighbour=0.0)):
        hits = await store.search(
            collection, MemoryScope(user_id=alice), query=QUERY, mode="hybrid", weights=weights
        )
        got = [(h.memory.content, round(h.score, 4)) for h in hits]
        bonus = weights.neighbour * 0.5  # the filler's one neighbour is the lone note (0.5)
        # the lone note's only neighbour is the filler (score 0): it gains nothing
        assert got == [(other_chat.content, 2.0), (lone.content, 0.5), (later.content, bonus)]
        assert all(h.memory.scope.user_id == alice for h in hits)


def test_neighbour_weight_is_checked_and_zero_keeps_the_plain_statement() -> None:
    with pytest.raises(InvalidInputError, match="SearchWeights.neighbour"):
        SearchWeights(neighbour=-0.1)
    plain = queries.search_memories(("user_id",), covering=True, audit=False, mode="hybrid")
    near = queries.search_memories(
        ("user_id",), covering=True, audit=False, mode="hybrid", neighbours=True
    )
    assert "OVER conversation" not in plain and "OVER conversation" in near
    with pytest.raises(ValueError, match="neighbours"):
        queries.search_memories(
            ("user_id",), covering=True, audit=False, mode="hybrid", fusion="rank", neighbours=True
        )
