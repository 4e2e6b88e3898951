"""Opt-in hash partitioning of the memories table by user (``pgmemory db partition``): the
partitioned table answers every read and write exactly as the plain one does, and the
command refuses what it cannot do safely, changing nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from pgmemory.admin import Admin
from pgmemory.cli import run
from pgmemory.embedders.cache import CachedEmbedder
from pgmemory.errors import DatabaseNotReadyError, InvalidInputError
from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import _database

NAME = "notes"
USERS = [f"user-{i}" for i in range(6)]
TOPICS = ["hiking in the alps", "baking sourdough bread", "tax return deadline", "python code"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _records() -> list[MemoryRecord]:
    """The same memories, with the same ids and times, for both databases."""
    out = []
    for u, user in enumerate(USERS):
        for i in range(4 + 3 * u):
            topic = TOPICS[(i + u) % len(TOPICS)]
            out.append(
                MemoryRecord(
                    id=uuid.UUID(int=1000 * u + i + 1),
                    content=f"{user} note {i} about {topic}",
                    scope=MemoryScope(user_id=user, session_id=f"s{i % 2}"),
                    created_at=T0 + timedelta(minutes=7 * i + u),
                )
            )
    return out


def _settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def _memories_layout(url: str) -> dict[str, object]:
    """The memories table's kind, partitions, constraints and indexes, as the catalog says."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            kind = conn.execute(
                sa.text(
                    "SELECT relkind::text FROM pg_class WHERE oid = 'pgmemory_memories'::regclass"
                )
            ).scalar_one()
            parts = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_inherits "
                    "WHERE inhparent = 'pgmemory_memories'::regclass"
                )
            ).scalar_one()
            constraints = conn.execute(
                sa.text(
                    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conrelid = 'pgmemory_memories'::regclass ORDER BY conname"
                )
            ).all()
            indexes = (
                conn.execute(
                    sa.text(
                        "SELECT indexname FROM pg_indexes "
                        "WHERE tablename = 'pgmemory_memories' ORDER BY indexname"
                    )
                )
                .scalars()
                .all()
            )
            triggers = (
                conn.execute(
                    sa.text(
                        "SELECT tgname FROM pg_trigger WHERE tgrelid = "
                        "'pgmemory_memories'::regclass AND NOT tgisinternal ORDER BY tgname"
                    )
                )
                .scalars()
                .all()
            )
            columns = conn.execute(
                sa.text(
                    "SELECT attname, format_type(atttypid, atttypmod), attnotnull, attstorage, "
                    "pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute AS a "
                    "LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
                    "WHERE a.attrelid = 'pgmemory_memories'::regclass AND a.attnum > 0 "
                    "AND NOT a.attisdropped ORDER BY a.attnum"
                )
            ).all()
    finally:
        engine.dispose()
    return {
        "kind": kind,
        "partitions": parts,
        "constraints": [tuple(c) for c in constraints],
        "indexes": list(indexes),
        "triggers": list(triggers),
        "columns": [tuple(c) for c in columns],
    }


@pytest.fixture
async def pair(
    fresh_database: str, server_url: str, embedder: CachedEmbedder
) -> AsyncIterator[tuple[MemoryStore, MemoryStore, str]]:
    """A plain and a partitioned store (4 partitions), both migrated, collections made."""
    with _database(server_url, "pgmemory_part") as parted_url:
        migrate.upgrade(fresh_database)
        migrate.upgrade(parted_url)
        async with (
            MemoryStore(fresh_database, settings=_settings(), embedder=embedder) as plain,
            MemoryStore(parted_url, settings=_settings(), embedder=embedder) as parted,
        ):
            report = await Admin(parted).partition_memories(partitions=4)
            assert report.as_dict() == {
                "table": "pgmemory_memories",
                "partitions": 4,
                "key": "user_id",
            }
            for store in (plain, parted):
                await store.create_collection(NAME)
            yield plain, parted, parted_url


async def test_partitioned_table_keeps_every_column_key_and_index(
    pair: tuple[MemoryStore, MemoryStore, str],
) -> None:
    plain, _, parted_url = pair
    before, after = _memories_layout(str(plain.url)), _memories_layout(parted_url)
    assert (before["kind"], before["partitions"]) == ("r", 0)
    assert (after["kind"], after["partitions"]) == ("p", 4)
    for what in ("columns", "constraints", "indexes", "triggers"):
        assert after[what] == before[what], what
    assert before["indexes"] and before["constraints"]
    assert before["triggers"] == ["pgmemory_note_deletion"]  # a deletion's evidence (0023)


async def test_partitioned_reads_and_writes_match_the_plain_table(
    pair: tuple[MemoryStore, MemoryStore, str],
) -> None:
    plain, parted, _ = pair
    records = _records()
    half = len(records) // 2
    for store in (plain, parted):
        await store.add(NAME, records[:half])
        assert await store.import_records(NAME, records[half:]) == len(records) - half

    async def ids_of(store: MemoryStore, user: str, **kwargs: object) -> list[tuple[str, int]]:
        hits = await store.search(NAME, MemoryScope(user_id=user), limit=5, **kwargs)  # type: ignore[arg-type]
        return [(str(h.memory.id), round(h.score, 4)) for h in hits]

    async def state() -> list[object]:
        out: list[object] = []
        for store in (plain, parted):
            seen: list[object] = []
            for user in USERS:
                scope = MemoryScope(user_id=user)
                seen.append(await store.count(NAME, scope))
                seen.append([str(m.id) for m in await store.list(NAME, scope)])
                for mode in ("vector", "text", "hybrid"):
                    seen.append(await ids_of(store, user, query="bread baking", mode=mode))
                seen.append(await ids_of(store, user, query="alps", mode="text"))
            out.append(seen)
        return out

    first = await state()
    assert first[0] == first[1]
    assert sum(first[0][0::6]) == len(records)  # type: ignore[arg-type]
    assert all(first[0][i] for i in range(3, len(first[0]), 6))  # text search finds bread

    doomed = [r.id for r in records if r.scope.user_id == USERS[1]][:2]
    for store in (plain, parted):
        assert (
            await store.delete(
                NAME, ids=[str(i) for i in doomed], scope=MemoryScope(user_id=USERS[1])
            )
            == 2
        )
        assert await store.delete(NAME, scope=MemoryScope(user_id=USERS[2], session_id="s0")) > 0
        erased = await store.erase_user(USERS[3])
        assert erased
    second = await state()
    assert second[0] == second[1]
    assert second[0][3 * 6] == 0  # USERS[3] erased in both
    assert second[0] != first[0]


async def test_refused_when_not_empty_or_already_partitioned_or_bad_count(
    pair: tuple[MemoryStore, MemoryStore, str],
) -> None:
    plain, parted, parted_url = pair
    await plain.add(NAME, _records()[:1])
    before = _memories_layout(str(plain.url))
    with pytest.raises(DatabaseNotReadyError, match="holds memories.*nothing was changed"):
        await Admin(plain).partition_memories(partitions=8)
    assert _memories_layout(str(plain.url)) == before
    with pytest.raises(DatabaseNotReadyError, match=r"already partitioned \(4 partitions\)"):
        await Admin(parted).partition_memories(partitions=8)
    assert _memories_layout(parted_url)["partitions"] == 4
    for bad in (1, 257, 0, -3, True, 16.0, "16"):
        with pytest.raises(InvalidInputError, match=r"partitions must be an int from 2 to 256"):
            await Admin(parted).partition_memories(partitions=bad)  # type: ignore[arg-type]


async def test_enable_ann_on_a_partitioned_table_is_refused_clearly(
    pair: tuple[MemoryStore, MemoryStore, str],
) -> None:
    _, parted, parted_url = pair
    await parted.add(NAME, _records()[:3])
    with pytest.raises(DatabaseNotReadyError, match="CREATE INDEX CONCURRENTLY.*partitioned"):
        await parted.enable_ann(NAME)
    assert "pgmemory_ann_" not in " ".join(_memories_layout(parted_url)["indexes"])  # type: ignore[arg-type]
    hits = await parted.search(NAME, MemoryScope(user_id=USERS[0]), query="bread")
    assert hits  # searches go on, exactly


def test_cli_partition_json_and_refusals(
    fresh_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate.upgrade(fresh_database)
    assert run(["--url", fresh_database, "db", "partition", "--partitions", "1"]) == 2
    out, err = capsys.readouterr()
    assert not out and "partitions must be an int from 2 to 256, got 1" in err
    assert _memories_layout(fresh_database)["kind"] == "r"

    assert run(["--url", fresh_database, "db", "partition", "--partitions", "3", "--json"]) == 0
    out, _ = capsys.readouterr()
    assert json.loads(out) == {"table": "pgmemory_memories", "partitions": 3, "key": "user_id"}
    assert _memories_layout(fresh_database)["partitions"] == 3

    assert run(["--url", fresh_database, "db", "partition"]) == 1
    out, err = capsys.readouterr()
    assert not out and "already partitioned (3 partitions)" in err
