"""Recall stays exact when an HNSW index exists and the planner is tempted to use it.

An HNSW index under a selective scope filter post-filters its approximate candidates and
returns a fraction of the right rows. These tests give the planner every reason to use one
(an index on the column, sorting disabled, prepared statements forced onto generic plans) and
check that scoped search still returns exactly the brute-force top-k, while the naive
statement does not.
"""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy import text

from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore

DIM = 8
NAIVE = """
SELECT id FROM pgmemory_memories
WHERE collection = :collection AND user_id = :user_id
ORDER BY embedding <=> :query LIMIT :limit
"""


@pytest.fixture
def hnsw_database(fresh_database: str) -> str:
    migrate.upgrade(fresh_database)
    engine = sa.create_engine(fresh_database)
    with engine.begin() as conn:
        database = conn.execute(text("SELECT current_database()")).scalar_one()
        conn.execute(
            text(f"ALTER TABLE pgmemory_memories ALTER COLUMN embedding TYPE vector({DIM})")
        )
        conn.execute(
            text(
                "CREATE INDEX memories_hnsw ON pgmemory_memories USING hnsw (embedding vector_cosine_ops)"
            )
        )
        conn.execute(text(f'ALTER DATABASE "{database}" SET plan_cache_mode = force_generic_plan'))
        conn.execute(text(f'ALTER DATABASE "{database}" SET enable_sort = off'))
    engine.dispose()
    return fresh_database


async def test_generic_prepared_plans_stay_exact_with_an_hnsw_index(hnsw_database: str) -> None:
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((3000, DIM)).astype(np.float32)
    # "small" owns 1 row in 100: a selective scope, the case where post-filtering fails.
    owners = ["small" if i % 100 == 0 else "big" for i in range(len(vectors))]
    async with MemoryStore(hnsw_database, settings=settings) as store:
        await store.create_collection("c", dimensions=DIM, embedding_model="test")
        ids = await store.add(
            "c",
            [
                MemoryRecord(content=f"m{i}", scope=MemoryScope(user_id=o), embedding=v)
                for i, (o, v) in enumerate(zip(owners, vectors, strict=True))
            ],
        )
        async with store.engine.begin() as conn:
            await conn.execute(text("ANALYZE pgmemory_memories"))
        small = np.array([i for i, o in enumerate(owners) if o == "small"])
        unit = vectors[small] / np.linalg.norm(vectors[small], axis=1, keepdims=True)
        naive_found = 0
        queries = rng.standard_normal((12, DIM)).astype(np.float32)
        for query in queries:  # > 5 runs: psycopg prepares the statement server-side
            expected = [ids[small[j]] for j in np.argsort(-(unit @ query))[:10]]
            hits = await store.search(
                "c", MemoryScope(user_id="small"), vector=query, limit=10, audit=False
            )
            assert [h.memory.id for h in hits] == expected
            async with store.engine.begin() as conn:
                naive = (
                    (
                        await conn.execute(
                            text(NAIVE),
                            {"collection": "c", "user_id": "small", "query": query, "limit": 10},
                        )
                    )
                    .scalars()
                    .all()
                )
            naive_found += len(set(naive) & set(expected))
        async with store.engine.begin() as conn:
            prepared = (
                await conn.execute(text("SELECT count(*) FROM pg_prepared_statements"))
            ).scalar_one()
            statement = store_statement(store)
            plan = "\n".join(
                (
                    await conn.execute(text("EXPLAIN " + statement), explain_params(queries[0]))
                ).scalars()
            )
            naive_plan = "\n".join(
                (
                    await conn.execute(
                        text("EXPLAIN " + NAIVE),
                        {"collection": "c", "user_id": "small", "query": queries[0], "limit": 10},
                    )
                ).scalars()
            )
    assert prepared >= 1, "psycopg should have prepared the repeated search statement"
    assert "memories_hnsw" not in plan
    # The control: the naive statement does walk the HNSW index and loses most right rows.
    assert "memories_hnsw" in naive_plan
    assert naive_found < 0.5 * 10 * len(queries)


def store_statement(store: MemoryStore) -> str:
    from pgmemory.store import queries

    return queries.search_memories(("user_id",), covering=True, audit=False)


def explain_params(query: np.ndarray) -> dict:
    from pgmemory.store.reads import (
        DISTANT_FUTURE as _DISTANT_FUTURE,
    )
    from pgmemory.store.reads import (
        DISTANT_PAST as _DISTANT_PAST,
    )

    return {
        "collection": "c",
        "user_id": "small",
        "query": query,
        "limit": 10,
        "min_score": -2.0,
        "since": _DISTANT_PAST,
        "until": _DISTANT_FUTURE,
    }
