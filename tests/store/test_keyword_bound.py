"""The keyword ranking of a large user scope: a bounded pool instead of every matching row.

Above ``KEYWORD_BOUND_FROM`` live rows, each query term's first ``KEYWORD_TERM_ROWS`` matching
rows are read; rows holding a rare term are all ranked, rows holding only common words are
ranked from the rows read (see ``pgmemory.store._ranking.keywords.keyword_ranking``).
"""

from __future__ import annotations

import numpy as np

from pgmemory.store._engine import fastpath
from pgmemory.store._ranking.keywords import KEYWORD_BOUND_FROM, KEYWORD_TERM_ROWS
from pgmemory.store._ranking.search import search_memories
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from pgmemory.text import terms
from tests.conftest import unique
from tests.store.test_plans import _plan_nodes

RARE = [f"my passport number {i} is in the weather drawer" for i in range(5)]


async def _large_scope(store: MemoryStore, collection: str) -> MemoryScope:
    """A user above the bound: every row but the rare ones holds the common word."""
    assert KEYWORD_TERM_ROWS < KEYWORD_BOUND_FROM
    scope = MemoryScope(user_id=unique("big"))
    common = KEYWORD_BOUND_FROM + 100
    texts = [f"the weather report {i} says sunny" for i in range(common)] + RARE
    vectors = np.random.default_rng(7).standard_normal((len(texts), 512)).astype(np.float32)
    await store.import_records(
        collection,
        [
            MemoryRecord(content=t, scope=scope, embedding=v)
            for t, v in zip(texts, vectors, strict=True)
        ],
    )
    return scope


async def test_rows_with_a_rare_term_lead_and_common_rows_fill_the_limit(
    store: MemoryStore, collection: str
) -> None:
    scope = await _large_scope(store, collection)
    hits = await store.search(collection, scope, query="weather passport", mode="text", limit=10)
    contents = [h.memory.content for h in hits]
    # every row holding the rare word ranks first; rows read for the common word fill the rest
    assert set(contents[:5]) == set(RARE)
    assert len(hits) == 10
    assert all("weather report" in c for c in contents[5:])
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert all(h.score > 0 for h in hits)


async def test_a_query_of_common_words_only_still_ranks(
    store: MemoryStore, collection: str
) -> None:
    scope = await _large_scope(store, collection)
    hits = await store.search(collection, scope, query="sunny weather", mode="text", limit=12)
    assert len(hits) == 12
    assert all("sunny" in h.memory.content for h in hits)
    # the hybrid ranking of the same scope keeps the rare rows' keyword share
    hybrid = await store.search(collection, scope, query="passport drawer", limit=5)
    assert {h.memory.content for h in hybrid} == set(RARE)


async def test_each_term_reads_a_bounded_number_of_rows(
    store: MemoryStore, collection: str
) -> None:
    """The plan of a large scope's keyword search: the exact part (every row holding a query
    term) does not run, and the scan for each term keeps at most KEYWORD_TERM_ROWS rows,
    though the common word is in more than KEYWORD_BOUND_FROM."""
    scope = await _large_scope(store, collection)
    statement = search_memories(
        ("user_id",),
        covering=True,
        audit=False,
        mode="text",
        distributed=store.database.distributed,
    )
    params = {
        "collection": collection,
        "user_id": scope.user_id,
        "terms": terms.query("weather passport"),
        "term_list": terms.terms("weather passport"),
        "pool": 50,
        "limit": 10,
        "min_score": -2.0,
    }
    async with store.database.connections.driver_autocommit() as conn:
        rows = await fastpath.run(
            conn, "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params, prepare=False
        )
    nodes = _plan_nodes(rows[0]["QUERY PLAN"])
    # the scans testing rows for query terms: through the term index (a bitmap heap scan's
    # recheck), or row by row (a filter: the plan for a table whose statistics are stale)
    term_scans = [
        n
        for n in nodes
        if "pgmemory_scope_terms" in n.get("Recheck Cond", "") + n.get("Filter", "")
    ]
    ran = [n for n in term_scans if n["Actual Loops"] > 0]
    assert ran, term_scans
    # only the per-term part ran: one loop per query term, each stopped at the bound
    assert all(n["Actual Loops"] == 2 for n in ran), ran
    assert all(n["Actual Rows"] <= KEYWORD_TERM_ROWS for n in ran), ran
