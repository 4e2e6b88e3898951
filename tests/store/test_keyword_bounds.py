"""The keyword side of text and hybrid search reads a bounded number of rows in a large scope
(see pgmemory.store.queries._keyword_ranking), and stays exact where nothing was cut off.

Scopes here are larger than ``SMALL_SCOPE``, so the large-scope path runs: per-term index
lookups, a pre-ranking, exact BM25 for the best. Vectors are random (given), so the only
text work is the query's.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from pgmemory.store import queries
from pgmemory.store.records import MemoryRecord, MemoryScope, SearchWeights
from pgmemory.store.store import MemoryStore
from pgmemory.text import terms
from tests.conftest import unique

ROWS = queries.SMALL_SCOPE + 100
WORDS = [f"w{i:03d}" for i in range(300)]


def contents(rng: np.random.Generator, n: int) -> list[str]:
    """Texts of 6-12 filler words; a few rows also hold the rare words the queries ask for."""
    out = []
    for i in range(n):
        words = list(rng.choice(WORDS, size=int(rng.integers(6, 13))))
        if i % 50 == 7:
            words += ["passport", "passport"] if i % 100 == 7 else ["passport"]
        if i % 40 == 3 or i == 107:
            words.append("embassy")
        out.append(" ".join(words))
    return out


async def fill(store: MemoryStore, collection: str, texts: list[str]) -> MemoryScope:
    scope = MemoryScope(user_id=unique("u"), session_id="s")
    rng = np.random.default_rng(11)
    vectors = rng.standard_normal((len(texts), 512)).astype(np.float32)
    await store.import_records(
        collection,
        [
            MemoryRecord(content=t, scope=scope, embedding=v)
            for t, v in zip(texts, vectors, strict=True)
        ],
    )
    return scope


def bm25(texts: list[str], query: str) -> dict[str, float]:
    """BM25 (k1 1.2, b 0.75) of every matching text, as the small-scope path computes it:
    df among the scope, N the scope's size, length = distinct terms, avgdl over the matches."""
    q = set(terms.terms(query))
    docs = [Counter(terms.terms(t)) for t in texts]
    matched = [(t, d) for t, d in zip(texts, docs, strict=True) if q & d.keys()]
    df = Counter(term for _, d in matched for term in q & d.keys())
    n = len(texts)
    avgdl = sum(len(d) for _, d in matched) / len(matched)
    out = {}
    for text, d in matched:
        out[text] = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            * d[t]
            * 2.2
            / (d[t] + 1.2 * (0.25 + 0.75 * len(d) / avgdl))
            for t in q & d.keys()
        )
    return out


async def test_a_large_scope_with_rare_terms_is_ranked_by_exact_bm25(
    store: MemoryStore, collection: str
) -> None:
    texts = contents(np.random.default_rng(5), ROWS)
    scope = await fill(store, collection, texts)
    query = "passport embassy"
    expected = bm25(texts, query)
    assert len(expected) <= queries.KEYWORD_CANDIDATES  # nothing is cut off
    hits = await store.search(collection, scope, query=query, mode="text", limit=len(expected))
    assert len(hits) == len(expected)
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.memory.content], rel=1e-5)
    # rows holding both rare words come first, the doubled 'passport' ahead
    assert "passport passport" in hits[0].memory.content or "embassy" in hits[0].memory.content


async def test_a_term_in_most_rows_counts_little_and_ranks_the_same_each_time(
    store: MemoryStore, collection: str
) -> None:
    rows = 4 * queries.TERM_ROWS + 100
    texts = [f"{t} common" for t in contents(np.random.default_rng(6), rows)]
    scope = await fill(store, collection, texts)
    # 'common' is in every row of a scope above four times TERM_ROWS: its document frequency
    # is estimated from a sample
    first = await store.search(collection, scope, query="common passport", mode="text", limit=10)
    again = await store.search(collection, scope, query="common passport", mode="text", limit=10)
    assert [(h.memory.id, h.score) for h in first] == [(h.memory.id, h.score) for h in again]
    # the rare word decides: every row holding it ranks above the rows holding 'common' only
    holding = sum("passport" in t for t in texts)
    assert all("passport" in h.memory.content for h in first[:holding])
    hybrid = await store.search(collection, scope, query="common passport", mode="hybrid", limit=10)
    assert len(hybrid) == 10


@pytest.mark.parametrize("rows", [40, ROWS])
async def test_odd_and_huge_queries_are_searched_like_stored_text(
    store: MemoryStore, collection: str, rows: int
) -> None:
    odd = [
        "straße Ärger naïve café",
        "我们的猫很可爱",
        "x² ½ ٣ \U0001d518nicode",
        "it's a \"quoted\" back\\slash or -minus & | ! ( ) : * <-> '",
        "emoji 🎉🎉 party",
    ]
    texts = odd + contents(np.random.default_rng(8), rows - len(odd))
    scope = await fill(store, collection, texts)
    for query in [
        "straße",
        "猫",
        "我们",
        "x²",
        "'",
        "\\",
        "or",
        "& | ! ( ) : * <->",
        '"quoted" -minus',
        "🎉",
        " ".join(f"word{i}" for i in range(5000)) + " passport",
        "passport " * 3000,
    ]:
        for mode in ("text", "hybrid"):
            hits = await store.search(collection, scope, query=query, mode=mode, limit=5)
            assert len(hits) <= 5
    found = await store.search(collection, scope, query="straße café", mode="text", limit=3)
    assert found[0].memory.content == odd[0]
    found = await store.search(collection, scope, query="我们的猫", mode="text", limit=3)
    assert found[0].memory.content == odd[1]


async def test_hybrid_in_a_large_scope_keeps_the_fused_scale(
    store: MemoryStore, collection: str
) -> None:
    texts = contents(np.random.default_rng(9), ROWS)
    scope = await fill(store, collection, texts)
    weights = SearchWeights(neighbour=0.0)
    hits = await store.search(
        collection, scope, query="passport embassy", mode="hybrid", limit=20, weights=weights
    )
    # similarity scaled 0-1 over the scope plus BM25 over the best: at most 2, and the best
    # keyword match (scaled 1) is in the list
    assert all(0 <= h.score <= 2 + 1e-6 for h in hits)
    assert any("passport passport" in h.memory.content for h in hits)
