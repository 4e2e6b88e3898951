"""The approximate path under the red team's cases: rows without a user, failures, windows,
expiring rows, and collection names that look like driver placeholders.

The test marked ``reliability`` (a 15k-row scope) is skipped unless the run selects it
(``pytest -m reliability``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
import pytest_asyncio
from sqlalchemy import text

from pgmemory.admin import Admin
from pgmemory.errors import CollectionError
from pgmemory.settings import Settings
from pgmemory.store import ann, migrate, probing, queries, reads
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import _database, unique

DIM = 16
NOW = datetime.now(UTC)


def heavy(request: pytest.FixtureRequest) -> None:
    """Skip a heavy test unless the run selects the ``reliability`` marker."""
    if "reliability" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("heavy: run with `pytest -m reliability`")


@pytest.fixture(scope="module")
def ann_database(server_url: str) -> Iterator[str]:
    """A database of this module's own: HNSW builds run CONCURRENTLY, which waits for every
    older transaction in the database, so other tests' sessions stay out of the way."""
    with _database(server_url, "pgmemory_ann") as url:
        migrate.upgrade(url)
        yield url


@pytest_asyncio.fixture
async def store(ann_database: str) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(ann_database, settings=Settings(_env_file=None)) as opened:  # type: ignore[call-arg]
        yield opened


def vectors(n: int, seed: int, dimensions: int = DIM) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((8, dimensions))
    return (centres[rng.integers(0, 8, n)] + 0.3 * rng.standard_normal((n, dimensions))).astype(
        np.float32
    )


async def _collection(
    store: MemoryStore, name: str, users: dict[MemoryScope, int], seed: int
) -> dict[str, np.ndarray]:
    """A collection holding ``n`` random memories per scope; returns each user's vectors."""
    await store.create_collection(name, dimensions=DIM, embedding_model="test")
    records, by_user = [], {}
    for k, (scope, n) in enumerate(users.items()):
        vs = vectors(n, seed + k)
        by_user[scope.user_id or ""] = vs
        records += [
            MemoryRecord(content=f"{name} {scope.user_id} {i}", scope=scope, embedding=v)
            for i, v in enumerate(vs)
        ]
    await store.import_records(name, records)
    return by_user


def _exact(vs: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    unit = vs / np.linalg.norm(vs, axis=1, keepdims=True)
    return list(np.argsort(-(unit @ query))[:k])


async def test_rows_without_a_user_are_no_scope_for_the_probe(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique("c")
    big, small, shared = (
        MemoryScope(user_id="big"),
        MemoryScope(user_id="small"),
        MemoryScope(session_id="kiosk"),
    )
    await _collection(store, name, {shared: 1_500, big: 1_200, small: 50}, seed=1)
    status = await store.enable_ann(name, min_scope_rows=1_000)  # ScopeError before: the '' group
    assert status.enabled and status.probed_scopes == 1
    # re-probe often (each probe saw '' as a scope), beside the searches
    monkeypatch.setattr(ann, "ANN_PROBE_EVERY", 5)
    monkeypatch.setattr(probing, "PROBE_INTERVAL_S", 0.0)
    path = store._ann._paths[name]
    first = path.probed_at
    rng = np.random.default_rng(2)
    for i in range(100):
        scope = (big, small, shared)[i % 3]
        hits = await store.search(name, scope, vector=rng.standard_normal(DIM), limit=5)
        assert len(hits) == 5 and all(h.memory.scope == scope for h in hits)
        await store._probes.settle()
    assert path.probed_at > first and path.probed_scopes == 1
    assert await store._ann_path(name, big) is not None
    assert await store._ann_path(name, shared) is None


async def test_a_probe_made_due_runs_beside_the_searches_and_close_cancels_it(
    ann_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-probe never holds up a search: the search that makes it due, and those after it,
    answer with the path's last decision while it runs; one probe at a time; close() cancels
    one still running."""
    monkeypatch.setattr(ann, "ANN_PROBE_EVERY", 3)
    monkeypatch.setattr(probing, "PROBE_INTERVAL_S", 0.0)
    store = await MemoryStore(ann_database, settings=Settings(_env_file=None)).open()  # type: ignore[call-arg]
    name, big = unique("c"), MemoryScope(user_id="big")
    await _collection(store, name, {big: 1_200}, seed=7)
    assert (await store.enable_ann(name, min_scope_rows=1_000)).enabled
    measure = store._ann._measure
    release, began, ended = asyncio.Event(), [], []

    async def held(*args: object, **kwargs: object) -> None:
        began.append(1)
        try:
            await release.wait()
            await measure(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            ended.append(1)

    monkeypatch.setattr(store._ann, "_measure", held)
    query = np.random.default_rng(8).standard_normal(DIM).astype(np.float32)
    for _ in range(10):  # due after the third; the probe waits, the searches do not
        hits = await asyncio.wait_for(store.search(name, big, vector=query, limit=5), timeout=30)
        assert len(hits) == 5
        await asyncio.sleep(0)
    assert began == [1] and not ended and store._probes.running(f"ann {name}")
    assert await store._ann_path(name, big) is not None  # the last decision stands meanwhile
    release.set()
    await store._probes.settle()
    assert ended == [1] and not store._probes.running(f"ann {name}")
    assert store._ann._paths[name].enabled
    release.clear()
    for _ in range(5):
        await store.search(name, big, vector=query, limit=5)
        await asyncio.sleep(0)
    assert len(began) == 2 and len(ended) == 1
    await asyncio.wait_for(store.close(), timeout=10)  # cancels the waiting probe
    assert len(ended) == 2 and not store._probes.running(f"ann {name}")


async def test_a_probe_made_due_inside_a_shared_transaction_runs_outside_it(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe outlives the turn's unit of work that made it due: its statements run on
    their own connections, not in that (by then finished) transaction."""
    monkeypatch.setattr(ann, "ANN_PROBE_EVERY", 1)
    monkeypatch.setattr(probing, "PROBE_INTERVAL_S", 0.0)
    name, big = unique("c"), MemoryScope(user_id="big")
    await _collection(store, name, {big: 1_200}, seed=10)
    assert (await store.enable_ann(name, min_scope_rows=1_000)).enabled
    path = store._ann._paths[name]
    first = path.probed_at
    measure, release = store._ann._measure, asyncio.Event()

    async def held(*args: object, **kwargs: object) -> None:
        await release.wait()
        await measure(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store._ann, "_measure", held)
    query = np.random.default_rng(11).standard_normal(DIM).astype(np.float32)
    async with store.shared_transaction():
        for _ in range(3):  # the second search makes a probe due
            await store.search(name, big, vector=query, limit=5)
    assert store._probes.running(f"ann {name}")
    release.set()
    await store._probes.settle()
    assert path.probed_at > first and path.enabled and path.probed_scopes == 1


async def test_a_probe_reads_at_most_its_budget_of_scope_rows(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe samples the largest scopes first, as evenly as its samples allow, while its
    exact searches read at most ANN_PROBE_ROWS scope rows (always one row of the largest)."""
    name = unique("c")
    big, mid, small = (MemoryScope(user_id=u) for u in ("big", "mid", "small"))
    await _collection(store, name, {big: 1_500, mid: 1_200, small: 50}, seed=9)
    assert (await store.enable_ann(name, min_scope_rows=1_000)).probed_scopes == 2
    sizes = {"big": 1_500, "mid": 1_200}
    async with store.engine.connect() as conn:
        rows = await probing.sample_largest(conn, name, sizes, samples=20, max_rows=10**9)
        assert [u for u, _, _ in rows] == ["big"] * 10 + ["mid"] * 10
        rows = await probing.sample_largest(conn, name, sizes, samples=20, max_rows=4_300)
        assert [u for u, _, _ in rows] == ["big", "big", "mid"]  # 2 x 1,500 + 1 x 1,200 rows
        rows = await probing.sample_largest(conn, name, sizes, samples=20, max_rows=100)
        assert [u for u, _, _ in rows] == ["big"]  # one row of the largest whatever the budget
    monkeypatch.setattr(ann, "ANN_PROBE_ROWS", 1_600)
    status = await store.probe_ann(name)
    assert status.probed_scopes == 1 and status.enabled


async def test_reembedding_to_another_size_names_the_index_kind_in_its_way(
    store: MemoryStore,
) -> None:
    """An approximate index is built for one vector size: a re-embedding to another size is
    refused first, naming the index's kind and the way out."""

    class Other:
        dimensions, model_id = 8, "test-other@8"

        async def embed(self, texts: list[str]) -> np.ndarray:
            return np.ones((len(texts), 8), dtype=np.float32)

    name, big = unique("c"), MemoryScope(user_id="big")
    await _collection(store, name, {big: 1_200}, seed=12)
    assert (await store.enable_ann(name, method="ivfflat", min_scope_rows=1_000)).enabled
    with pytest.raises(CollectionError, match=r"approximate \(ivfflat\) index over 16-dim"):
        await Admin(store).reembed(name, Other())  # type: ignore[arg-type]
    await store.disable_ann(name, drop_index=True)
    assert (await Admin(store).reembed(name, Other())).dimensions == 8  # type: ignore[arg-type]


async def test_a_failing_path_falls_back_to_exact_without_user_data_in_logs(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique("c")
    user = unique("secret-user")
    scope = MemoryScope(user_id=user)
    by_user = await _collection(store, name, {scope: 1_200}, seed=3)
    assert (await store.enable_ann(name, min_scope_rows=1_000)).enabled
    assert await store._ann_path(name, scope) is not None
    monkeypatch.setattr(
        queries, "ANN_SETTINGS", "SELECT set_config('hnsw.ef_search', 'many', true)"
    )
    query = np.random.default_rng(4).standard_normal(DIM).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="pgmemory"):
        hits = await store.search(name, scope, vector=query, limit=10)
    expected = [f"{name} {user} {i}" for i in _exact(by_user[user], query, 10)]
    assert [h.memory.content for h in hits] == expected  # answered exactly
    assert any("searched exactly" in r.getMessage() for r in caplog.records)
    assert not any(user in r.getMessage() for r in caplog.records)
    async with store.engine.connect() as conn:
        audits = (
            await conn.execute(
                text("SELECT count(*) FROM pgmemory_recall_audit WHERE user_id = :u"), {"u": user}
            )
        ).scalar_one()
    assert audits == 1  # the failed attempt rolled back its audit row
    # A failing probe leaves the path off; searches go on, exactly.
    monkeypatch.setattr(queries, "ANN_LARGE_USERS", "SELECT no_such_column FROM pgmemory_memories")
    status = await store.probe_ann(name)
    assert not status.enabled
    assert await store._ann_path(name, scope) is None
    assert len(await store.search(name, scope, vector=query, limit=3)) == 3


async def test_windowed_searches_and_expiring_scopes_stay_exact(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = unique("c")
    await store.create_collection(name, dimensions=DIM, embedding_model="test")
    vs = vectors(1_200, seed=5)
    start = NOW - timedelta(days=50)
    stamps = [start + timedelta(hours=i) for i in range(len(vs))]
    big, expiring = MemoryScope(user_id="big"), MemoryScope(user_id="expiring")
    records = [
        MemoryRecord(content=f"big {i}", scope=big, embedding=v, created_at=t)
        for i, (v, t) in enumerate(zip(vs, stamps, strict=True))
    ] + [
        MemoryRecord(content=f"expiring {i}", scope=expiring, embedding=v,
                     expires_at=NOW + timedelta(days=365) if i % 10 == 0 else None)
        for i, v in enumerate(vs)
    ]  # fmt: skip
    await store.import_records(name, records)
    assert (await store.enable_ann(name, min_scope_rows=1_000)).enabled
    assert await store._ann_path(name, big) is not None
    assert await store._ann_path(name, expiring) is None  # it holds rows that can expire
    used: list[int | None] = []
    search_memories = reads.search_memories

    def spy(*args: object, **kwargs: object) -> str:
        used.append(kwargs.get("ann_dimensions"))  # type: ignore[arg-type]
        return search_memories(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reads, "search_memories", spy)
    query = np.random.default_rng(6).standard_normal(DIM).astype(np.float32)
    since, until = stamps[600], stamps[602]  # a two-hour window: two memories
    hits = await store.search(name, big, vector=query, limit=10, since=since, until=until)
    assert sorted(h.memory.content for h in hits) == ["big 600", "big 601"]
    await store.search(name, big, vector=query, limit=10, since=since)
    await store.search(name, big, vector=query, limit=10, until=until)
    await store.search(name, expiring, vector=query, limit=10)
    assert used == [None, None, None, None]
    await store.search(name, big, vector=query, limit=10)
    assert used[-1] == DIM  # the same scope unwindowed takes the path


@pytest.mark.parametrize("names", [("100%", "%(name)s", "a%%b")])
async def test_collection_names_that_look_like_placeholders(
    store: MemoryStore, names: tuple[str, ...]
) -> None:
    decoy = "a%b"  # what the driver made of 'a%%b' before
    scope = MemoryScope(user_id="big")
    for k, name in enumerate((*names, decoy)):
        await _collection(store, name, {scope: 1_100}, seed=10 + k)
    for name in names:
        status = await store.enable_ann(name, min_scope_rows=1_000)
        assert status.enabled, name
        assert await store._ann_path(name, scope) is not None
        hits = await store.search(name, scope, vector=np.ones(DIM), limit=5)
        assert {h.memory.collection for h in hits} == {name}
    async with store.engine.connect() as conn:
        predicates = dict(
            (
                await conn.execute(
                    text(
                        "SELECT c.name, pg_get_expr(i.indpred, i.indrelid) FROM pgmemory_collections c "
                        "LEFT JOIN pg_index i ON i.indexrelid = "
                        "to_regclass('pgmemory_ann_' || left(md5(c.name), 16))"
                    )
                )
            ).all()
        )
    for name in names:
        # Each index covers exactly its own collection's rows.
        assert predicates[name] == f"(collection = '{name}'::text)", predicates
    assert predicates[decoy] is None
    for name in names:
        await store.disable_ann(name, drop_index=True)
    async with store.engine.connect() as conn:
        left = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM unnest(CAST(:names AS text[])) AS c(name) "
                    "WHERE to_regclass('pgmemory_ann_' || left(md5(c.name), 16)) IS NOT NULL"
                ),
                {"names": list(names)},
            )
        ).scalar_one()
    assert left == 0


@pytest.mark.reliability
async def test_a_two_hour_window_on_a_15k_scope_keeps_full_recall(
    request: pytest.FixtureRequest, store: MemoryStore
) -> None:
    heavy(request)
    name = unique("c")
    dimensions = 64
    await store.create_collection(name, dimensions=dimensions, embedding_model="test")
    n = 15_000
    vs = vectors(n, seed=20, dimensions=dimensions)
    start = NOW - timedelta(days=60)
    stamps = [
        start + timedelta(minutes=int(m))
        for m in np.sort(np.random.default_rng(21).integers(0, 60 * 24 * 60, n))
    ]
    scope = MemoryScope(user_id="big")
    records = [
        MemoryRecord(content=str(i), scope=scope, embedding=v, created_at=t)
        for i, (v, t) in enumerate(zip(vs, stamps, strict=True))
    ]
    await store.import_records(name, records)
    status = await store.enable_ann(name, min_scope_rows=10_000)
    assert status.enabled
    unit = vs / np.linalg.norm(vs, axis=1, keepdims=True)
    rng = np.random.default_rng(22)
    found = total = 0
    for _ in range(50):
        query = rng.standard_normal(dimensions).astype(np.float32)
        centre = stamps[int(rng.integers(0, n))]
        since, until = centre - timedelta(hours=1), centre + timedelta(hours=1)
        inside = np.array([since <= t < until for t in stamps])
        order = np.argsort(-(unit[inside] @ query))[:10]
        truth = {str(i) for i in np.flatnonzero(inside)[order]}
        hits = await store.search(
            name, scope, vector=query, limit=10, since=since, until=until, audit=False
        )
        found += len(truth & {h.memory.content for h in hits})
        total += len(truth)
    assert found == total  # recall@10 = 1.0 (0.94 when the window took the index)
