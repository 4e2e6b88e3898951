"""The keyword side's parts: a query term as a tsquery, its frequency in a row, and BM25 summed
over the (term, row) pairs (``pgmemory.store._ranking.keywords.keyword_ranking``)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import sqlalchemy as sa

from pgmemory.store._ranking.keywords import _PROBE, _TERM_FREQUENCY
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from pgmemory.text import terms
from tests.conftest import unique


@pytest.fixture
def engine(database_url: str):
    engine = sa.create_engine(database_url)
    yield engine
    engine.dispose()


def test_a_terms_frequency_comes_back_from_its_rank(engine: sa.Engine) -> None:
    """Every count to_tsvector keeps comes back exactly (it keeps at most 255 positions of a
    lexeme, so 256 and more repeats count 255), and a lexeme without positions counts once."""
    frequency = _TERM_FREQUENCY.format(
        vector="to_tsvector('simple', repeat('tea cup ', n))", probe="CAST('tea' AS tsquery)"
    )
    with engine.connect() as conn:
        got = conn.execute(
            sa.text(f"SELECT n, {frequency} FROM generate_series(1, 300) AS n ORDER BY n")
        ).all()
        stripped = conn.execute(
            sa.text(
                "SELECT "
                + _TERM_FREQUENCY.format(
                    vector="strip(to_tsvector('simple', 'tea tea tea'))",
                    probe="CAST('tea' AS tsquery)",
                )
            )
        ).scalar_one()
    assert [int(tf) for _, tf in got[:255]] == list(range(1, 256))
    assert {int(tf) for _, tf in got[255:]} == {255}
    assert stripped == 1


@pytest.mark.parametrize(
    "lexeme", ["tea", "it's", "back\\slash", "a:b", "x & y", "!not", "pre:*", "a <-> b", "茶杯"]
)
def test_a_query_term_is_taken_whole_as_a_tsquery(engine: sa.Engine, lexeme: str) -> None:
    """Whatever a lexeme holds (quotes, backslashes, tsquery operators), its probe is that one
    lexeme: it matches a vector holding it and none holding only a part of it."""
    probe = _PROBE.format(term=":lexeme")
    with engine.connect() as conn:
        holds, partial, text_form = conn.execute(
            sa.text(
                f"""SELECT array_to_tsvector(ARRAY[:lexeme]) @@ {probe},
                          array_to_tsvector(ARRAY[left(:lexeme, 1), 'other']) @@ {probe},
                          CAST({probe} AS text)"""
            ),
            {"lexeme": lexeme},
        ).one()
    assert holds, text_form
    assert not partial, text_form


def _bm25(texts: list[str], query: str) -> dict[str, float]:
    """BM25 as the search statement defines it (k1 1.2, b 0.75): N the scope's rows, document
    frequencies and the average length (distinct terms) over the rows holding a query term."""
    wanted = set(terms.terms(query))
    counts = {t: Counter(terms.terms(t)) for t in texts}
    matched = {t: c for t, c in counts.items() if wanted & set(c)}
    df = {w: sum(w in c for c in matched.values()) for w in wanted}
    avgdl = sum(len(c) for c in matched.values()) / len(matched)

    def idf(w: str) -> float:
        return math.log(1 + (len(texts) - df[w] + 0.5) / (df[w] + 0.5))

    def saturation(tf: int, dl: int) -> float:
        return tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / avgdl))

    return {
        t: sum(idf(w) * saturation(c[w], len(c)) for w in wanted & set(c))
        for t, c in matched.items()
    }


TEXTS = [
    "tea tea tea with lemon",
    "green tea in the morning",
    "lemon cake and lemon tea, lemon again",
    "a walk by the river",
    "river tea house",
    "coffee only",
]


@pytest.mark.parametrize("with_user", [True, False])
async def test_text_scores_are_bm25_over_each_terms_frequency(
    store: MemoryStore, collection: str, with_user: bool
) -> None:
    """A text search's scores are BM25 with each term's count in the row, in a user's scope
    (pairs read per query term from the term index) and in one without a user (each matching
    row cut to the query's terms and paired with those it holds)."""
    scope = MemoryScope(user_id=unique("u"), agent_id=unique("a"))
    await store.add(collection, [MemoryRecord(content=t, scope=scope) for t in TEXTS])
    searched = scope if with_user else MemoryScope(agent_id=scope.agent_id)
    query = "lemon tea river"
    hits = await store.search(collection, searched, query=query, mode="text", limit=10)
    expected = _bm25(TEXTS, query)
    assert {h.memory.content for h in hits} == set(expected)
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.memory.content], rel=1e-6)
