"""Opt-in half vectors (``pgmemory db half-vectors``): added once, as the schema's copy of every
vector, stores opened after it take them as a first pass, and a pgvector without
``l2_normalize`` is refused with nothing changed."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import sqlalchemy as sa

from pgmemory.cli import run
from pgmemory.errors import DatabaseNotReadyError
from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore


def _settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def _halves(url: str) -> list[tuple[str, bool]]:
    """Each row's content and whether its half vector is its unit vector in half precision."""
    engine = sa.create_engine(migrate.normalise_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT content, embedding_half IS NOT DISTINCT FROM"
                    " CAST(l2_normalize(embedding) AS halfvec) FROM pgmemory_memories"
                    " ORDER BY content"
                )
            )
            return [(str(r[0]), bool(r[1])) for r in rows]
    finally:
        engine.dispose()


async def test_the_command_adds_them_once_and_every_row_keeps_its_copy(
    fresh_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate.upgrade(fresh_database)
    rng = np.random.default_rng(2)
    scope = MemoryScope(user_id="u")
    async with MemoryStore(fresh_database, settings=_settings()) as store:
        assert store._db.first_passes == ("codes",)  # not part of the migrated schema
        await store.create_collection("c", dimensions=8, embedding_model="test")
        await store.add("c", [MemoryRecord(content="before", scope=scope, embedding=rng.random(8))])

    assert (
        await asyncio.to_thread(run, ["db", "half-vectors", "--url", fresh_database, "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["added"] is True
    again = await asyncio.to_thread(run, ["db", "half-vectors", "--url", fresh_database])
    assert again == 0  # nothing to do
    assert "already" in capsys.readouterr().out

    async with MemoryStore(fresh_database, settings=_settings()) as store:
        assert store._db.first_passes == ("codes", "halves")
        await store.add("c", [MemoryRecord(content="after", scope=scope, embedding=rng.random(8))])
        await store.import_records(
            "c", [MemoryRecord(content="imported", scope=scope, embedding=rng.random(8))]
        )
    # rows stored before (the table was rewritten) and after, by each write path
    assert _halves(fresh_database) == [("after", True), ("before", True), ("imported", True)]


async def test_a_pgvector_without_l2_normalize_is_refused_with_nothing_changed(
    fresh_database: str,
) -> None:
    migrate.upgrade(fresh_database)
    engine = sa.create_engine(migrate.normalise_url(fresh_database))
    try:
        with engine.begin() as conn:  # what an older pgvector lacks
            conn.execute(sa.text("ALTER EXTENSION vector DROP FUNCTION l2_normalize(vector)"))
            conn.execute(sa.text("DROP FUNCTION l2_normalize(vector)"))
    finally:
        engine.dispose()
    from pgmemory.admin import Admin

    async with MemoryStore(fresh_database, settings=_settings()) as store:
        with pytest.raises(DatabaseNotReadyError, match=r"pgvector >= 0\.7.*nothing was changed"):
            await Admin(store).add_half_vectors()
        assert store._db.first_passes == ("codes",)
