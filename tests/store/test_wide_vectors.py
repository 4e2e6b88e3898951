"""Every write path stores vectors of every size a collection accepts (up to 2,000-d)."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.store.models import MAX_DIMENSIONS
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import unique


@pytest.mark.parametrize("path", ["add", "import_records"])
async def test_the_largest_vectors_land_and_round_trip(
    store: MemoryStore, owner_engine: AsyncEngine, path: str
) -> None:
    # A 2,000-d float4 vector alone is ~8 kB: with the row's other columns it cannot stay
    # inline in an 8 kB page ("row is too big" under STORAGE PLAIN; migration 0008).
    name = unique("c")
    await store.create_collection(name, dimensions=MAX_DIMENSIONS, embedding_model="wide")
    user = unique("u")
    scope = MemoryScope(user_id=user, session_id="bulk")
    vectors = np.random.default_rng(11).standard_normal((4, MAX_DIMENSIONS)).astype(np.float32)
    records = [
        MemoryRecord(
            content=f"memory {i}: " + "a long remembered sentence about tea and trains. " * 60,
            scope=scope,
            # one row through each staging path: with a message id (keyed) and without
            message_id=f"m{i}" if i % 2 == 0 else None,
            embedding=v,
            metadata={"index": i, "note": "metadata that takes some room " * 40},
        )
        for i, v in enumerate(vectors)
    ]

    if path == "add":
        assert len(await store.add(name, records)) == 4
    else:
        assert await store.import_records(name, records) == 4

    stored = {m.content: m for m in await store.list(name, scope, limit=10)}
    assert set(stored) == {r.content for r in records}
    for record in records:
        memory = stored[record.content]
        assert memory.metadata == record.metadata
        assert memory.message_id == record.message_id
    async with owner_engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT content, embedding::text FROM pgmemory_memories"
                    " WHERE collection = :c AND user_id = :u"
                ),
                {"c": name, "u": user},
            )
        ).all()
    embeddings = {
        content: np.array(vector.strip("[]").split(","), np.float32) for content, vector in rows
    }
    for record, vector in zip(records, vectors, strict=True):
        np.testing.assert_array_equal(embeddings[record.content], vector)


@pytest.mark.parametrize("dimensions", [384, 512, 768])
async def test_search_vectors_stay_in_the_row(
    store: MemoryStore, owner_engine: AsyncEngine, dimensions: int
) -> None:
    # With a vector of 1.5 kB or more a row is past PostgreSQL's 2 kB squeeze point, which
    # moved the search vector out of line (migration 0017 keeps it in): every keyword match
    # then read its terms back through the TOAST table.
    name = unique("c")
    await store.create_collection(name, dimensions=dimensions, embedding_model="inline")
    scope = MemoryScope(user_id=unique("u"), session_id="s")
    vectors = np.random.default_rng(5).standard_normal((6, dimensions)).astype(np.float32)
    words = "tea trains harbour violin pepper lantern orchard cobalt meadow saffron"
    records = [
        MemoryRecord(
            content=f"note {i}: {words} " + " ".join(f"w{i}x{j}" for j in range(30)),
            scope=scope,
            embedding=v,
        )
        for i, v in enumerate(vectors)
    ]
    await store.add(name, records[:3])
    await store.import_records(name, records[3:])
    async with owner_engine.connect() as conn:
        placed = (
            await conn.execute(
                text(
                    "SELECT pg_column_toast_chunk_id(search_vector) IS NULL AS inline,"
                    " length(search_vector) AS terms FROM pgmemory_memories"
                    " WHERE collection = :c AND user_id = :u"
                ),
                {"c": name, "u": scope.user_id},
            )
        ).all()
    assert len(placed) == 6
    assert all(row.terms >= 40 for row in placed)  # a real vector, not an empty one
    assert all(row.inline for row in placed)
    hits = await store.search(name, scope, query="saffron w4x7", mode="text", limit=3)
    assert hits[0].memory.content == records[4].content
