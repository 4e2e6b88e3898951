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

    # In a script (no terminal to ask on) it refuses without --yes, and changes nothing.
    refused = await asyncio.to_thread(run, ["db", "half-vectors", "--url", fresh_database])
    assert refused == 2
    assert "pass --yes" in capsys.readouterr().err
    async with MemoryStore(fresh_database, settings=_settings()) as store:
        assert store._db.first_passes == ("codes",)
    added = ["db", "half-vectors", "--url", fresh_database, "--yes", "--json"]
    assert await asyncio.to_thread(run, added) == 0
    assert json.loads(capsys.readouterr().out)["added"] is True
    again = await asyncio.to_thread(run, ["db", "half-vectors", "--url", fresh_database, "--yes"])
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


async def test_two_phase_says_when_the_codes_fail_and_the_halves_then_serve(
    fresh_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's loop: `pgmemory two-phase` measures the codes below the floor on random
    vectors and names the command that adds the halves; after it, the halves serve."""
    migrate.upgrade(fresh_database)
    vectors = np.random.default_rng(7).standard_normal((3_000, 128))
    async with MemoryStore(fresh_database, settings=_settings()) as store:
        await store.create_collection("c", dimensions=128, embedding_model="test")
        await store.import_records(
            "c",
            [
                MemoryRecord(content=f"m {i}", scope=MemoryScope(user_id="heavy"), embedding=v)
                for i, v in enumerate(vectors)
            ],
        )

    async def probe() -> dict[str, object]:
        argv = ["two-phase", "c", "--url", fresh_database, "--json"]
        assert await asyncio.to_thread(run, argv) == 0
        document: dict[str, object] = json.loads(capsys.readouterr().out)
        return document

    before = await probe()
    assert (before["first_passes"], before["first_pass"]) == (["codes"], None)
    assert (before["large_scopes"], before["probed_scopes"]) == (1, 1)
    assert before["recalls"]["codes"] < before["recall_floor"]  # type: ignore[index,operator]
    assert "pgmemory db half-vectors" in str(before["advice"])
    assert "heavy" not in json.dumps(before)  # counts and recalls, never a user id

    assert await asyncio.to_thread(run, ["db", "half-vectors", "--url", fresh_database, "-y"]) == 0
    capsys.readouterr()
    after = await probe()
    assert (after["first_passes"], after["first_pass"], after["advice"]) == (
        ["codes", "halves"], "halves", None,
    )  # fmt: skip
    assert after["recalls"]["halves"] >= after["recall_floor"]  # type: ignore[index,operator]
    # the table for a person, and an unknown collection named with the ones there are
    assert await asyncio.to_thread(run, ["two-phase", "c", "--url", fresh_database]) == 0
    out = capsys.readouterr().out
    assert "first pass of large-scope searches: halves" in out and "hint" not in out
    assert await asyncio.to_thread(run, ["two-phase", "nope", "--url", fresh_database]) == 2
    assert "unknown collection 'nope'; existing collections: c" in capsys.readouterr().err


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
