"""On a pgvector without ``binary_quantize`` (before 0.7): the schema migrates without the
binary codes, the store says so once when it opens, and every search of a large scope is exact.

The server here has pgvector 0.8; the test makes the older one by removing the function from the
extension in a database of its own before migration 0013 runs."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import sqlalchemy as sa

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.store import migrate


def _without_binary_quantize(url: str) -> None:
    engine = sa.create_engine(migrate.normalise_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER EXTENSION vector DROP FUNCTION binary_quantize(vector)"))
            conn.execute(sa.text("DROP FUNCTION binary_quantize(vector)"))
    finally:
        engine.dispose()


def _columns(url: str) -> set[str]:
    engine = sa.create_engine(migrate.normalise_url(url))
    try:
        with engine.connect() as conn:
            return {c["name"] for c in sa.inspect(conn).get_columns("pgmemory_memories")}
    finally:
        engine.dispose()


async def test_an_older_pgvector_keeps_every_search_exact_and_says_so_once(
    fresh_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    migrate.upgrade(fresh_database, "0012")
    _without_binary_quantize(fresh_database)
    migrate.upgrade(fresh_database)  # 0013 adds no codes; every later migration applies
    assert migrate.current(fresh_database) == migrate.head_revision()
    assert "embedding_code" not in _columns(fresh_database)

    caplog.set_level(logging.INFO, logger="pgmemory")
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((1_200, 16)).astype(np.float32)
    async with MemoryStore(fresh_database, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
        said = [r for r in caplog.records if "binary_quantize needs pgvector" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        await store.create_collection("c", dimensions=16, embedding_model="test")
        scope = MemoryScope(user_id="big")
        await store.import_records(
            "c",
            [
                MemoryRecord(content=f"row {i}", scope=scope, embedding=v)
                for i, v in enumerate(rows)
            ],
        )
        store._shortlists.min_scope_rows, store._shortlists.first_probe = 1_000, 1
        unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        for query in rng.standard_normal((40, 16)).astype(np.float32):
            hits = await store.search("c", scope, vector=query, limit=3, audit=False)
            truth = np.argsort(-(unit @ (query / np.linalg.norm(query))), kind="stable")[:3]
            assert [int(h.memory.content.split()[1]) for h in hits] == list(truth)
        assert not store._shortlists.state("c").probed  # never routed, never probed
    assert not [
        r for r in caplog.records if "probe" in r.getMessage() and "failed" in r.getMessage()
    ]
    assert len([r for r in caplog.records if "binary_quantize needs" in r.getMessage()]) == 1
    migrate.downgrade(fresh_database, "0012")  # and back, without the codes it never added
