"""Isolation property test: random scopes, memories and searches, checked against brute force.

Memories get random scopes whose values include quotes, ``%``, ``_``, backslashes, the
printable ``\\u0000``, CJK and SQL-looking text (some rows have no scope at all); searches pick
random scopes, modes (vector, text, hybrid), limits, time windows and weights. Every result must
belong to the search scope and match the top-k computed in Python from the same rows (ties
allowed: equal scores may come in either order). Each search runs twice: with the server's
default plans (statements repeat, so psycopg prepares them) and with
``plan_cache_mode = force_generic_plan``; at 16 and 700 dimensions (the covering index and the
plain scan), and with the approximate path enabled for the one large user scope.

The fast version runs by default; the one marked ``reliability`` (more rows and searches) is
skipped unless the run selects it (``pytest -m reliability``). ``PGMEMORY_ISOLATION_SEED``
picks another random draw.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, text

from pgmemory.settings import Settings
from pgmemory.store.reads import DISTANT_FUTURE, DISTANT_PAST
from pgmemory.store.records import MemoryHit, MemoryRecord, MemoryScope, SearchWeights
from pgmemory.store.store import MemoryStore
from pgmemory.text.clean import clean_query
from pgmemory.text.terms import terms
from tests.conftest import unique

SEED = int(os.environ.get("PGMEMORY_ISOLATION_SEED", "9"))
DIMENSIONS = ("user_id", "application_id", "agent_id", "session_id")
#: Scope values: metacharacters of LIKE, quoting and escaping, CJK, near-duplicates.
VALUES = [
    "alice", "ALICE", "alice ", "bob", "o'brien", 'say "hi"', "'; DROP TABLE x; --", "%", "_",
    "a%", "a_", "a%b", "a_b", "a\\b", "a\\\\b", "\\u0000", "用户", "用户甲", "$1", ":user_id", "*",
]  # fmt: skip
WORDS = [
    "apple", "banana", "cherry", "delta", "echo", "falcon", "garden", "harbor", "island",
    "jungle", "kettle", "lemon", "mango", "nectar", "olive", "pepper", "quartz", "river",
    "salmon", "tiger", "violet", "walnut", "用户", "中文搜索", "记忆", "辣",
]  # fmt: skip
LARGE_USER = "alice"
NOW = datetime.now(UTC)


def heavy(request: pytest.FixtureRequest) -> None:
    """Skip a heavy test unless the run selects the ``reliability`` marker."""
    if "reliability" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("heavy: run with `pytest -m reliability`")


class HashEmbedder:
    """A deterministic stand-in embedder: a text's vector is drawn from its hash."""

    def __init__(self, dimensions: int) -> None:
        self._dimensions = dimensions

    @property
    def model_id(self) -> str:
        return f"hash-{self._dimensions}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    def vector(self, text_: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text_.encode("utf-8")).digest()[:8], "big")
        return np.random.default_rng(seed).standard_normal(self._dimensions).astype(np.float32)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vector(t) for t in texts])


@dataclass
class Row:
    id: uuid.UUID
    scope: dict[str, str]
    terms: list[str]
    unit: np.ndarray
    created_at: datetime
    expires_at: datetime | None


@dataclass
class Search:
    scope: dict[str, str]
    mode: str
    limit: int
    query: str | None
    vector: np.ndarray | None
    since: datetime | None
    until: datetime | None
    weights: SearchWeights
    audit: bool

    def describe(self) -> str:
        return (f"mode={self.mode} limit={self.limit} scope={self.scope} query={self.query!r} "
                f"since={self.since} until={self.until} weights={self.weights}")  # fmt: skip


# --- data --------------------------------------------------------------------------------------


def make_records(rng: random.Random, n: int, embedder: HashEmbedder) -> list[MemoryRecord]:
    records: list[MemoryRecord] = []
    stamps = rng.sample(range(10 * 24 * 3600 * 1000), n)  # distinct milliseconds over ten days
    for i in range(n):
        if i % 25 == 0:
            scope = MemoryScope()  # stored for everybody: must never show up in a scoped search
        elif rng.random() < 0.35:
            scope = MemoryScope(user_id=LARGE_USER, session_id=rng.choice([None, *VALUES[:6]]))
        else:
            scope = MemoryScope(**{d: rng.choice(VALUES) for d in DIMENSIONS if rng.random() < 0.6})
        content = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
        if records and rng.random() < 0.1:
            embedding = records[rng.randrange(len(records))].embedding  # exact ties
        else:
            embedding = embedder.vector(f"row {i} {rng.random()}")
        expires_at = None
        if scope.user_id != LARGE_USER:  # the large scope stays eligible for the approximate path
            expires_at = rng.choice([None, None, NOW - timedelta(days=1), NOW + timedelta(days=30)])
        records.append(
            MemoryRecord(
                content=content,
                scope=scope,
                embedding=embedding,
                created_at=NOW - timedelta(days=10) + timedelta(milliseconds=stamps[i]),
                expires_at=expires_at,
                message_id=f"m{i}" if rng.random() < 0.5 else None,
                metadata={"i": i},
            )
        )
    return records


def make_searches(
    rng: random.Random, n: int, embedder: HashEmbedder, records: list[MemoryRecord]
) -> list[Search]:
    searches = []
    for i in range(n):
        mode = rng.choice(["vector", "vector", "text", "hybrid"])
        if i % 5 == 0:
            scope = {"user_id": LARGE_USER}  # the approximate path's scope
            mode = rng.choice(["vector", "vector", "vector", mode])
        elif rng.random() < 0.6:  # part of a stored row's scope: searches that find something
            stored = rng.choice([r.scope.as_dict() for r in records if not r.scope.is_empty])
            scope = dict(rng.sample(sorted(stored.items()), rng.randint(1, len(stored))))
        else:  # any values: mostly scopes that match nothing, or near misses ('alice ', 'a%')
            picked = rng.sample(DIMENSIONS, rng.randint(1, 3))
            scope = {d: rng.choice(VALUES) for d in picked}
        vocabulary = WORDS if rng.random() < 0.9 else ["the", "zzz", *WORDS]  # stop word, no match
        query = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 4)))
        vector = None
        if mode == "vector" and rng.random() < 0.5:
            query, vector = None, embedder.vector(f"query {i}")
        since = until = None
        if rng.random() < 0.25:
            since = NOW - timedelta(days=rng.uniform(2, 11))
            until = since + timedelta(days=rng.uniform(1, 8)) if rng.random() < 0.7 else None
        weights = rng.choice(
            [
                SearchWeights(),
                SearchWeights(recency=0.5),
                SearchWeights(vector=0.5, text=2.0, recency=1.0, pool=7),
                SearchWeights(pool=1),  # rows outside both pools lose, however good their sum
                SearchWeights(neighbour=0.0),  # no neighbours: the pooled rows only
                SearchWeights(neighbour=2.0, recency=0.5, pool=3),
                SearchWeights(fusion="rank"),
                SearchWeights(recency=0.5, fusion="rank"),
                SearchWeights(vector=0.5, text=2.0, recency=1.0, pool=7, fusion="rank"),
            ]
        )
        searches.append(
            Search(
                scope,
                mode,
                rng.randint(1, 12),
                query,
                vector,
                since,
                until,
                weights,
                rng.random() < 0.2,
            )
        )
    return searches


# --- brute force ---------------------------------------------------------------------------------


def eligible(rows: list[Row], search: Search) -> list[Row]:
    since, until = search.since or DISTANT_PAST, search.until or DISTANT_FUTURE
    return [
        r for r in rows
        if all(r.scope[d] == v for d, v in search.scope.items())
        and (r.expires_at is None or r.expires_at > NOW)
        and since <= r.created_at < until
    ]  # fmt: skip


def bm25(rows: list[Row], query: str) -> list[tuple[float, Row]]:
    """The keyword ranking as the search statement computes it (see pgmemory.store._ranking.search.search_memories)."""
    wanted = list(dict.fromkeys(terms(query)))
    matched = [r for r in rows if set(r.terms) & set(wanted)]
    if not matched:
        return []
    n = len(rows)
    df = Counter(t for r in matched for t in set(r.terms) if t in wanted)
    avgdl = sum(len(set(r.terms)) for r in matched) / len(matched)
    ranked = []
    for r in matched:
        tf, dl = Counter(r.terms), len(set(r.terms))
        relevance = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf[t] * 2.2 / (tf[t] + 1.2 * (0.25 + 0.75 * dl / avgdl))
            for t in sorted(set(r.terms) & set(wanted))
        )  # fmt: skip
        ranked.append((relevance, r))
    ranked.sort(key=lambda x: (-x[0], x[1].id))
    return ranked


def reference(
    rows: list[Row], search: Search, query_vector: np.ndarray | None
) -> tuple[list[tuple[uuid.UUID, float]], bool]:
    """The expected ranking (id, score), best first, and whether near-ties make it ambiguous."""
    pool = eligible(rows, search)
    sims: dict[uuid.UUID, float] = {}
    if query_vector is not None:
        q = query_vector.astype(np.float64) / np.linalg.norm(query_vector)
        sims = {r.id: float(r.unit @ q) for r in pool}
    if search.mode == "vector":
        return sorted(((i, s) for i, s in sims.items()), key=lambda x: (-x[1], x[0])), False
    assert search.query is not None
    text_ranking = bm25(pool, search.query)
    if search.mode == "text":
        return [(r.id, rel) for rel, r in text_ranking], False
    w = search.weights
    size = max(w.pool, search.limit)
    by_vector = sorted(pool, key=lambda r: (-sims[r.id], r.id))
    by_time = sorted(pool, key=lambda r: (r.created_at, r.id), reverse=True)
    rankings = ((w.vector, [r.id for r in by_vector]), (w.text, [r.id for _, r in text_ranking]),
                (w.recency, [r.id for r in by_time]))  # fmt: skip
    score: Counter[uuid.UUID] = Counter()
    if w.fusion == "rank":
        for weight, ranking in rankings:
            for rank, i in enumerate(ranking[:size], start=1):
                score[i] += weight / (w.rrf_k + rank)
    elif pool:  # each signal scaled to 0..1 over the scope, summed over the union of the pools
        pooled = {i for weight, ranking in rankings if weight > 0 for i in ranking[:size]}
        relevance = {r.id: rel for rel, r in text_ranking}
        top_relevance = max(relevance.values(), default=0.0)
        low, high = min(sims.values()), max(sims.values())
        first, last = min(r.created_at for r in pool), max(r.created_at for r in pool)
        fused = {
            r.id: w.vector * ((sims[r.id] - low) / (high - low) if high > low else 1.0)
            + w.text * (relevance.get(r.id, 0.0) / top_relevance if top_relevance else 0.0)
            + w.recency * ((r.created_at - first) / (last - first) if last > first else 1.0)
            for r in pool
        }
        # neighbours: the rows just before and after in the same conversation (user,
        # application, agent, session) lend neighbour x their better score, and the pooled
        # rows' neighbours are ranked too
        conversations: dict[tuple[str, ...], list[Row]] = {}
        for r in pool:
            key = tuple(r.scope[d] for d in ("user_id", "application_id", "agent_id", "session_id"))
            conversations.setdefault(key, []).append(r)
        for rows_of in conversations.values():
            rows_of.sort(key=lambda r: (r.created_at, r.id))
            for j, r in enumerate(rows_of):
                near = [n.id for n in rows_of[max(0, j - 1) : j + 2] if n.id != r.id]
                if w.neighbour == 0:
                    near = []
                if r.id in pooled or any(i in pooled for i in near):
                    score[r.id] = fused[r.id] + w.neighbour * max(
                        (fused[i] for i in near), default=0.0
                    )
    fused = sorted(
        ((i, float(np.float32(s))) for i, s in score.items() if s > 0 or w.fusion == "score"),
        key=lambda x: (-x[1], x[0]),
    )
    # Ranks decide the pools (and rank fusion's scores): a near-tie (float32 in the server,
    # float64 here) may swap two.
    gaps = np.diff(sorted(-sims[r.id] for r in by_vector[: size + 1]))
    relevances = [rel for rel, _ in text_ranking[: size + 1]]
    text_gaps = [a - b for a, b in itertools.pairwise(relevances) if a != b]
    ambiguous = bool(np.any(gaps < 1e-5)) or any(
        g < 1e-9 * max(1.0, relevances[0]) for g in text_gaps
    )
    return fused, ambiguous


def check(
    hits: list[MemoryHit],
    expected: list[tuple[uuid.UUID, float]],
    ambiguous: bool,
    search: Search,
    where: str,
) -> None:
    context = f"{where}, seed {SEED}: {search.describe()}"
    for hit in hits:  # isolation, whatever the ranking
        scope = hit.memory.scope
        assert all(getattr(scope, d) == v for d, v in search.scope.items()), (
            f"scope leak: {context}"
        )
    scores = dict(expected)
    got = [(h.memory.id, h.score) for h in hits]
    assert all(i in scores for i, _ in got), f"a hit the brute force does not allow: {context}"
    if ambiguous:
        assert len(got) <= search.limit, context
        return
    k = min(search.limit, len(expected))
    assert len(got) == k and len({i for i, _ in got}) == k, (
        f"{len(got)} hits, expected {k}: {context}"
    )

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-4 * max(1.0, abs(b))

    assert all(close(s, scores[i]) for i, s in got), f"scores differ: {context}"
    assert all(close(got[j][1], expected[j][1]) for j in range(k)), f"ranking differs: {context}"
    if k:
        kth = expected[k - 1][1]
        must = {i for i, s in expected if s > kth and not close(s, kth)}
        assert must <= {i for i, _ in got}, f"a better hit is missing: {context}"


# --- the property ------------------------------------------------------------------------------


def _force_generic_plans(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.run_async(
        lambda conn: conn.execute("SET plan_cache_mode = force_generic_plan")
    )


async def _stores(
    database_url: str, embedder: HashEmbedder
) -> AsyncIterator[tuple[str, MemoryStore]]:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(database_url, settings=settings, embedder=embedder) as default:
        yield "default plans", default
    async with MemoryStore(database_url, settings=settings, embedder=embedder) as generic:
        event.listen(generic.engine.sync_engine, "connect", _force_generic_plans)
        await generic.engine.dispose()
        async with generic.engine.connect() as conn:
            assert (
                await conn.execute(text("SHOW plan_cache_mode"))
            ).scalar() == "force_generic_plan"
        yield "generic plans", generic


async def run_property(
    database_url: str, *, dimensions: int, rows: int, searches: int, ann: bool
) -> None:
    rng = random.Random(f"{SEED}-{dimensions}")
    embedder = HashEmbedder(dimensions)
    collection = unique(f"iso{dimensions}")
    records = make_records(rng, rows, embedder)
    plan = make_searches(rng, searches, embedder, records)
    ambiguous_count = 0
    async for where, store in _stores(database_url, embedder):
        if where == "default plans":
            await store.create_collection(
                collection, dimensions=dimensions, embedding_model=embedder.model_id
            )
            ids: list[uuid.UUID] = []
            for start in range(0, len(records), 500):
                ids += await store.add(
                    collection, records[start : start + 500], allow_unscoped=True
                )
            assert len(ids) == len(records)
            table = [
                Row(
                    id=i,
                    scope=r.scope.column_values(),
                    terms=terms(r.content),
                    unit=np.asarray(r.embedding, dtype=np.float64) / np.linalg.norm(r.embedding),
                    created_at=r.created_at,  # type: ignore[arg-type]
                    expires_at=r.expires_at,
                )
                for i, r in zip(ids, records, strict=True)
            ]
        if ann:
            status = await store.enable_ann(collection, min_scope_rows=rows // 5)
            assert status.enabled and status.probed_scopes == 1, status
            assert await store._ann_path(collection, MemoryScope(user_id=LARGE_USER)) is not None
        for search in plan:
            query_vector = search.vector
            if search.query is not None and search.mode != "text":
                query_vector = embedder.vector(
                    clean_query(search.query, max_chars=store.settings.max_text_chars)
                )
            hits = await store.search(
                collection, MemoryScope(**search.scope), query=search.query, vector=search.vector,
                limit=search.limit, mode=search.mode, weights=search.weights, since=search.since,
                until=search.until, audit=search.audit,
            )  # fmt: skip
            expected, ambiguous = reference(table, search, query_vector)
            ambiguous_count += ambiguous
            check(hits, expected, ambiguous, search, where)
        if ann and where == "generic plans":
            await store.disable_ann(collection, drop_index=True)
    hybrids = sum(s.mode == "hybrid" for s in plan) * 2
    assert ambiguous_count <= max(2, hybrids // 4), (
        f"{ambiguous_count} of {hybrids} hybrid searches unchecked"
    )


@pytest.mark.parametrize(("dimensions", "ann"), [(16, True), (700, False)])
async def test_scoped_search_matches_brute_force(
    database_url: str, dimensions: int, ann: bool
) -> None:
    await run_property(database_url, dimensions=dimensions, rows=500, searches=100, ann=ann)


@pytest.mark.reliability
@pytest.mark.parametrize(
    ("dimensions", "ann"), [(16, True), (16, False), (700, True), (700, False)]
)
async def test_scoped_search_matches_brute_force_at_scale(
    request: pytest.FixtureRequest, database_url: str, dimensions: int, ann: bool
) -> None:
    heavy(request)
    await run_property(database_url, dimensions=dimensions, rows=3_000, searches=600, ann=ann)
