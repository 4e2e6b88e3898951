"""The two-phase path for large scopes (binary codes or half vectors, then an exact re-rank):
recall@k >= 0.99 against brute force at several scope sizes through each first pass, with
default and forced generic plans; small, narrow and windowed scopes stay exact; collections
whose vectors the codes do not keep apart take the half vectors, and stay exact when no pass
keeps the probe's floor; both copies follow every write."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from sqlalchemy import event, text

from pgmemory.admin import Admin
from pgmemory.errors import CollectionError
from pgmemory.settings import Settings
from pgmemory.store import migrate, probing, reads
from pgmemory.store._ranking.candidates import FirstPass
from pgmemory.store._ranking.search import search_memories
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.shortlist import shortlist_for
from pgmemory.store.store import MemoryStore
from tests.citus import cluster as citus_cluster
from tests.conftest import _database

DIM = 128
SIZES = (500, 2_500, 6_000)
EMBEDDED = "embedded"  # vectors with the low intrinsic dimension of real embeddings
RANDOM = "random"  # uniform on the sphere: the codes' worst case


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _embedding_like(rng: np.random.Generator, mixing: np.ndarray, n: int) -> np.ndarray:
    """Vectors on an 8-dimensional subspace of DIM, as real sentence embeddings concentrate
    on few directions (measured USE 512-d vectors behave alike: docs/performance.md)."""
    return _unit(rng.standard_normal((n, mixing.shape[0])) @ mixing)


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    rng = np.random.default_rng(23)
    mixing = rng.standard_normal((8, DIM))
    rows = {n: _embedding_like(rng, mixing, n) for n in SIZES}
    return {
        "rows": rows,
        "queries": _embedding_like(rng, mixing, 1_000),
        "random": _unit(rng.standard_normal((3_000, DIM))),
        "small": _embedding_like(rng, mixing, 50),
    }


def _records(name: str, vectors: np.ndarray, scope: MemoryScope) -> list[MemoryRecord]:
    return [
        MemoryRecord(content=f"{name} {i}", scope=scope, embedding=v) for i, v in enumerate(vectors)
    ]


@pytest.fixture(scope="module")
def twophase_url(server_url: str) -> Iterator[str]:
    """A database of this module's own, migrated (and distributed by user on Citus)."""
    with _database(server_url, "twophase") as url:
        migrate.upgrade(url)
        if citus_cluster.serving(url) is not None:
            citus_cluster.distribute(url)  # as the session's database is
        yield url


@pytest_asyncio.fixture(scope="module")
async def loaded(twophase_url: str, data: dict[str, Any]) -> str:
    """One collection of embedding-like vectors (a user per size, a small one) and one of
    random vectors, imported and vacuumed, in memories that keep half vectors too."""
    async with MemoryStore(twophase_url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
        assert (await Admin(store).add_half_vectors()).added  # the opt-in second pass
        await store.create_collection(EMBEDDED, dimensions=DIM, embedding_model="test")
        await store.create_collection(RANDOM, dimensions=DIM, embedding_model="test")
        records = _records("small", data["small"], MemoryScope(user_id="small"))
        for n, vectors in data["rows"].items():
            records += _records(f"u{n}", vectors, MemoryScope(user_id=f"u{n}"))
        await store.import_records(EMBEDDED, records)
        await store.import_records(
            RANDOM, _records("random", data["random"], MemoryScope(user_id="r"))
        )
        async with store.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM ANALYZE pgmemory_memories"))
    return twophase_url


def _force_generic_plans(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.run_async(
        lambda conn: conn.execute("SET plan_cache_mode = force_generic_plan")
    )


@pytest_asyncio.fixture(params=["default plans", "generic plans"])
async def store(request: pytest.FixtureRequest, loaded: str) -> AsyncIterator[MemoryStore]:
    async with MemoryStore(loaded, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
        if request.param == "generic plans":
            event.listen(store.engine.sync_engine, "connect", _force_generic_plans)
            await store.engine.dispose()
            async with store.engine.connect() as conn:
                mode = (await conn.execute(text("SHOW plan_cache_mode"))).scalar()
                assert mode == "force_generic_plan"
        yield store


def _truth(rows: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    sims = rows.astype(np.float64) @ query.astype(np.float64)
    return [int(i) for i in np.argsort(-sims, kind="stable")[:k]]


@pytest.mark.parametrize(
    ("size", "first_pass"),
    [*((n, "codes") for n in SIZES), *((n, "halves") for n in (*SIZES, RANDOM))],
)
async def test_two_phase_recall_is_at_least_099_against_brute_force(
    store: MemoryStore, data: dict[str, Any], size: int | str, first_pass: FirstPass
) -> None:
    """1,000 queries a scope size (3,000 hits at k=3), with the shortlist searches use; every
    hit's score is its exact cosine similarity. Random vectors only through half vectors (the
    codes lose them: the probe keeps those collections off the codes)."""
    k = 3
    collection, user = (RANDOM, "r") if size == RANDOM else (EMBEDDED, f"u{size}")
    rows = data["random"] if size == RANDOM else data["rows"][size]
    queries = _unit(np.random.default_rng(5).standard_normal((1_000, DIM)))
    scope = MemoryScope(user_id=user)
    found = 0
    for query in queries if size == RANDOM else data["queries"]:
        hits = await reads.probe_search(
            store._db,
            store._catalogue,
            store._ann,
            collection,
            scope,
            query,
            k,
            None,
            shortlist_for(k, first_pass),
        )
        got = [int(h.memory.content.split()[1]) for h in hits]
        assert len(got) == k and {h.memory.scope.user_id for h in hits} == {user}
        found += len(set(got) & set(_truth(rows, query, k)))
        exact_scores = rows[got].astype(np.float64) @ query.astype(np.float64)
        assert np.allclose([h.score for h in hits], exact_scores, atol=1e-5)
    recall = found / (k * len(data["queries"]))
    assert recall >= 0.99, f"recall@{k} {recall:.4f} at {size} rows through {first_pass}"


async def test_large_scopes_take_the_path_small_ones_stay_exact(
    store: MemoryStore, data: dict[str, Any]
) -> None:
    """The library's own choice: the probe passes on embedding-like vectors, only scopes above
    the threshold take the path, and a small scope's answers are the brute-force ones, in
    order."""
    shortlists = store._shortlists
    shortlists.min_scope_rows, shortlists.first_probe = 2_000, 3
    big, mid = MemoryScope(user_id="u6000"), MemoryScope(user_id="u500")
    # the first searches of the collection in the process are exact, and do not probe
    assert [await shortlists.route(EMBEDDED, big, 3) for _ in range(2)] == [None, None]
    assert not shortlists.state(EMBEDDED).probed
    assert await shortlists.route(EMBEDDED, big, 3) == shortlist_for(3)  # the third probes
    state = shortlists.state(EMBEDDED)
    assert state.first_pass == "codes" and state.probed_scopes == 2  # the cheaper pass first
    assert min(state.recalls.values()) >= 0.99 and set(state.recalls) == {"codes", "halves"}
    assert state.large_users == {"u2500", "u6000"}
    assert await shortlists.route(EMBEDDED, mid, 3) is None
    assert await shortlists.route(EMBEDDED, MemoryScope(user_id="small"), 3) is None
    # probed again once due (searches, and a minute since), beside the searches
    first, shortlists.probe_every = state.probed_at, 2
    assert await shortlists.route(EMBEDDED, big, 3) == shortlist_for(3)
    assert not store._probes.running(f"shortlist {EMBEDDED}")  # not a minute yet
    probing.PROBE_INTERVAL_S, interval = 0.0, probing.PROBE_INTERVAL_S
    try:
        assert await shortlists.route(EMBEDDED, big, 3) == shortlist_for(3)  # the last decision
        assert store._probes.running(f"shortlist {EMBEDDED}")
        await store._probes.settle()
    finally:
        probing.PROBE_INTERVAL_S = interval
    assert state.probed_at > first and state.searches == 0 and state.first_pass == "codes"
    # narrower than a user: exact whatever the user's size
    assert await shortlists.route(EMBEDDED, MemoryScope(user_id="u6000", session_id="s"), 3) is None
    for query in data["queries"][:50]:
        for user, rows in (("small", data["small"]), ("u500", data["rows"][500])):
            hits = await store.search(
                EMBEDDED, MemoryScope(user_id=user), vector=query, limit=5, audit=False
            )
            assert [int(h.memory.content.split()[1]) for h in hits] == _truth(rows, query, 5)


async def test_a_windowed_search_of_a_large_scope_stays_exact(
    store: MemoryStore, data: dict[str, Any]
) -> None:
    store._shortlists.min_scope_rows = 2_000
    rows = data["rows"][6000]
    for query in data["queries"][:20]:
        hits = await store.search(
            EMBEDDED, MemoryScope(user_id="u6000"), vector=query, limit=3, audit=False,
            since=datetime(2000, 1, 1, tzinfo=UTC),
        )  # fmt: skip
        assert [int(h.memory.content.split()[1]) for h in hits] == _truth(rows, query, 3)
    assert store._shortlists.state(EMBEDDED).searches == 0  # never asked


async def test_vectors_the_codes_do_not_keep_apart_take_the_half_vectors(
    store: MemoryStore, data: dict[str, Any]
) -> None:
    """Random vectors: the probe measures the codes' recall below the floor and the half
    vectors' above it, so searches take the half vectors, and find the brute-force hits."""
    store._shortlists.min_scope_rows, store._shortlists.first_probe = 1_000, 1
    scope = MemoryScope(user_id="r")
    assert await store._shortlists.route(RANDOM, scope, 3) == shortlist_for(3, "halves")
    state = store._shortlists.state(RANDOM)
    assert state.large_users == {"r"} and state.first_pass == "halves"
    assert state.recalls["codes"] < 0.99 <= state.recalls["halves"]
    rng = np.random.default_rng(3)
    for query in _unit(rng.standard_normal((20, DIM))):
        hits = await store.search(RANDOM, scope, vector=query, limit=3, audit=False)
        got = [int(h.memory.content.split()[1]) for h in hits]
        assert got == _truth(data["random"], query, 3)


async def test_an_explicit_probe_reports_each_pass_and_decides_at_once(
    store: MemoryStore,
) -> None:
    """``probe_two_phase``: what the searches' own probe measures, returned, and in force for
    the searches after it (no probe of their own first); an unknown collection is an error."""
    store._shortlists.min_scope_rows = 1_000
    status = await store.probe_two_phase(RANDOM)
    assert (status.collection, status.first_passes, status.first_pass) == (
        RANDOM, ("codes", "halves"), "halves",
    )  # fmt: skip
    assert status.recalls["codes"] < status.recall_floor <= status.recalls["halves"]
    assert (status.large_scopes, status.probed_scopes, status.min_scope_rows) == (1, 1, 1_000)
    assert status.as_dict()["first_passes"] == ["codes", "halves"]
    route = await store._shortlists.route(RANDOM, MemoryScope(user_id="r"), 3)
    assert route == shortlist_for(3, "halves") and store._shortlists.state(RANDOM).searches == 1
    with pytest.raises(CollectionError, match="nope"):
        await store.probe_two_phase("nope")


async def test_a_collection_no_pass_keeps_at_the_floor_stays_exact(
    store: MemoryStore, data: dict[str, Any]
) -> None:
    """A floor no pass measures (here above 1) leaves the path off: every search is exact."""
    shortlists = store._shortlists
    shortlists.min_scope_rows, shortlists.first_probe, shortlists.recall_floor = 1_000, 1, 1.01
    scope = MemoryScope(user_id="r")
    assert await shortlists.route(RANDOM, scope, 3) is None
    state = shortlists.state(RANDOM)
    assert state.probed and state.first_pass is None and set(state.recalls) == {"codes", "halves"}
    rng = np.random.default_rng(4)
    for query in _unit(rng.standard_normal((20, DIM))):
        hits = await store.search(RANDOM, scope, vector=query, limit=3, audit=False)
        got = [int(h.memory.content.split()[1]) for h in hits]
        assert got == _truth(data["random"], query, 3)


def _numbered(statement: str) -> str:
    """``:name`` parameters as ``$n`` (for EXPLAIN (GENERIC_PLAN))."""
    names: dict[str, int] = {}
    return re.sub(
        r"(?<![:\w]):([a-z_]+)", lambda m: f"${names.setdefault(m.group(1), len(names) + 1)}",
        statement,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("first_pass", "index"),
    [("codes", "ix_pgmemory_memories_user_codes"), ("halves", "ix_pgmemory_memories_user_halves")],
)
async def test_the_generic_plan_scans_the_first_pass_index_only_and_looks_up_the_shortlist(
    loaded: str, first_pass: FirstPass, index: str
) -> None:
    """However the parameters turn out, the first pass reads its own index only (never the
    vectors) and the re-rank fetches the shortlist's rows by primary key."""
    statement = search_memories(("user_id",), covering=True, audit=True, shortlist=first_pass)
    # Citus routes each read of the memories table to the user's shard only with the filter.
    reads = re.findall(r"FROM pgmemory_memories AS m\s+WHERE(.*?)(?:\)|$)", statement, re.S)
    assert reads and all("m.user_id = :user_id" in where for where in reads)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(loaded, settings=settings) as store, store.engine.connect() as conn:
        explained = await conn.execute(text("EXPLAIN (GENERIC_PLAN) " + _numbered(statement)))
        plan = "\n".join(explained.scalars().all())
    assert f"Index Only Scan using {index}" in plan, plan
    assert "Index Scan using pk_pgmemory_memories" in plan, plan
    assert "user_cover" not in plan and "Seq Scan on pgmemory_memories" not in plan, plan


@pytest.mark.parametrize("first_pass", ["codes", "halves"])
async def test_codes_and_halves_follow_every_write(
    store: MemoryStore, data: dict[str, Any], first_pass: FirstPass
) -> None:
    """Rows added one by one get their code and half vector (generated columns), and the path
    finds them at once; no row's copy differs from its vector's."""
    store._shortlists.min_scope_rows = 2_000
    scope = MemoryScope(user_id="u6000")
    query = data["queries"][0]
    marker = f"new {uuid.uuid4().hex}"
    ids = await store.add(EMBEDDED, [MemoryRecord(content=marker, scope=scope, embedding=query)])
    try:
        hits = await reads.probe_search(
            store._db,
            store._catalogue,
            store._ann,
            EMBEDDED,
            scope,
            query,
            3,
            None,
            shortlist_for(3, first_pass),
        )
        assert hits[0].memory.content == marker and hits[0].score == pytest.approx(1.0, abs=1e-5)
        async with store.engine.connect() as conn:
            differing = await conn.execute(
                text(
                    "SELECT count(*) FILTER (WHERE embedding_code IS DISTINCT FROM"
                    " CAST(binary_quantize(embedding) AS bit varying)),"
                    " count(*) FILTER (WHERE embedding_half IS DISTINCT FROM"
                    " CAST(l2_normalize(embedding) AS halfvec))"
                    " FROM pgmemory_memories"
                )
            )
            assert tuple(differing.one()) == (0, 0)
    finally:
        await store.delete(EMBEDDED, ids=ids, scope=scope)
