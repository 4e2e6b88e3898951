"""Hybrid search's neighbours (SearchWeights.neighbour): the message next to the match counts.

Every vector here is built with a chosen cosine to the query's own embedding, and only the
matching message contains the query's words, so each fused score is known in advance:
similarity min-max scaled over the scope (the fillers have cosine 0, the match 1, so a row's
part is its cosine) plus BM25 / the scope's best (1 for the match, 0 elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from pgmemory.embedders import CachedEmbedder
from pgmemory.errors import InvalidInputError
from pgmemory.store._ranking import fusion
from pgmemory.store._ranking.search import search_memories
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
    plain = search_memories(("user_id",), covering=True, audit=False, mode="hybrid")
    near = search_memories(("user_id",), covering=True, audit=False, mode="hybrid", neighbours=True)
    assert "OVER conversation" not in plain and "OVER conversation" in near
    with pytest.raises(ValueError, match="neighbours"):
        search_memories(
            ("user_id",), covering=True, audit=False, mode="hybrid", fusion="rank", neighbours=True
        )


def _brute_force(
    rows: list[tuple[str, str, datetime, str, np.ndarray]],
    query: np.ndarray,
    weights: SearchWeights,
    limit: int,
) -> list[tuple[str, float]]:
    """Score fusion with neighbours over every row of the scope, as SearchWeights defines it:
    ``rows`` are (id, session, created_at, content, vector); returns (id, score), best first."""
    from math import log

    from pgmemory.text import terms

    distance = {r[0]: 1 - float(r[4] @ query / np.linalg.norm(r[4])) for r in rows}
    dmin, dmax = min(distance.values()), max(distance.values())
    when = {r[0]: r[2].timestamp() for r in rows}
    tmin, tmax = min(when.values()), max(when.values())
    wanted = set(terms.terms(QUERY))
    counts = {r[0]: terms.terms(r[3]) for r in rows}
    matched = {i: c for i, c in counts.items() if wanted & set(c)}
    df = {t: sum(t in set(c) for c in matched.values()) for t in wanted}
    avgdl = np.mean([len(set(c)) for c in matched.values()]) if matched else 1.0
    bm25 = {}
    for i, c in matched.items():
        dl = len(set(c))
        bm25[i] = sum(
            log(1 + (len(rows) - df[t] + 0.5) / (df[t] + 0.5))
            * c.count(t) * 2.2 / (c.count(t) + 1.2 * (0.25 + 0.75 * dl / avgdl))
            for t in wanted & set(c)
        )  # fmt: skip
    rmax = max(bm25.values(), default=0.0)
    fused = {
        i: weights.vector * ((dmax - distance[i]) / (dmax - dmin) if dmax > dmin else 1)
        + weights.recency * ((when[i] - tmin) / (tmax - tmin) if tmax > tmin else 1)
        + weights.text * (bm25.get(i, 0.0) / rmax if rmax else 0.0)
        for i in distance
    }
    pool = max(weights.pool, limit)  # as the store binds it
    pooled = set(sorted(distance, key=lambda i: (distance[i], i))[:pool])
    pooled |= set(sorted(bm25, key=lambda i: (-bm25[i], i))[:pool])
    if weights.recency > 0:
        pooled |= set(sorted(when, key=lambda i: (when[i], i), reverse=True)[:pool])
    scored = []
    for session in {r[1] for r in rows}:
        chat = sorted((r for r in rows if r[1] == session), key=lambda r: (r[2], r[0]))
        for k, r in enumerate(chat):
            around = [chat[j][0] for j in (k - 1, k + 1) if 0 <= j < len(chat)]
            if r[0] in pooled or pooled & set(around):
                lent = max((fused[j] for j in around), default=0.0)
                scored.append((r[0], float(np.float32(fused[r[0]] + weights.neighbour * lent))))
    return sorted(scored, key=lambda s: (-s[1], s[0]))[:limit]


@pytest.fixture(params=["window", "probes"])
def links(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """How the statement finds the pooled rows' neighbours: the window over every scope row (a
    scope of up to NEIGHBOUR_PROBES_FROM rows), or probes of the conversation index (larger
    scopes; forced here by a bound of 0)."""
    if request.param == "probes":
        monkeypatch.setattr(fusion, "NEIGHBOUR_PROBES_FROM", 0)
    search_memories.cache_clear()
    yield request.param
    search_memories.cache_clear()


async def test_the_ranking_with_neighbours_is_the_brute_force_one_over_the_whole_scope(
    store: MemoryStore, collection: str, embedder: CachedEmbedder, links: str
) -> None:
    """Small pools in interleaved conversations: the statement ranks only the rows near a
    pooled one, and must still give exactly the ranking computed over every scope row, both
    when a window links every scope row and when probes link the pooled ones."""
    q, make = await at_cosine(embedder, seed=5)
    rng = np.random.default_rng(5)
    words = ["zebra", "quartz", "lamp", "river", "stone", "paper", "violin", "tea"]
    scope = MemoryScope(user_id=unique("u"))
    records = []
    for i in range(240):
        text = " ".join(rng.choice(words, size=int(rng.integers(2, 7))))
        chat = MemoryScope(user_id=scope.user_id, session_id=f"chat-{int(rng.integers(0, 6))}")
        records.append(record(text, make(float(rng.uniform(-0.3, 0.9))), chat, int(i * 7)))
    ids = await store.add(collection, records)
    rows = [
        (str(i), r.scope.session_id, r.created_at, r.content, np.asarray(r.embedding))
        for i, r in zip(ids, records, strict=True)
    ]
    for weights in (
        SearchWeights(pool=5),
        SearchWeights(pool=20, recency=0.3, neighbour=0.8),
        # a large neighbour share: a row's score is mostly its better neighbour's
        SearchWeights(pool=5, text=2.0, neighbour=3.0),
    ):
        hits = await store.search(
            collection, scope, query=QUERY, mode="hybrid", limit=30, weights=weights
        )
        expected = _brute_force(rows, q, weights, limit=30)
        assert [str(h.memory.id) for h in hits] == [i for i, _ in expected]
        assert [h.score for h in hits] == pytest.approx([s for _, s in expected], abs=1e-5)
