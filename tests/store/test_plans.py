"""The plans of pgmemory's statements: exact, and right for a busy user under generic plans.

An HNSW index under a selective scope filter post-filters its approximate candidates and
returns a fraction of the right rows. The first tests give the planner every reason to use one
(an index on the column, sorting disabled, prepared statements forced onto generic plans) and
check that scoped search still returns exactly the brute-force top-k, while the naive
statement does not. The others check what the statements read under the generic plans
pgmemory's connections run (which estimate a user's rows from the table's average): the
covering index, the term index, one primary-key probe per row read back.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable

import numpy as np
import psycopg.sql
import pytest
import sqlalchemy as sa
from sqlalchemy import text

from pgmemory.admin import Admin
from pgmemory.embedders import CachedEmbedder
from pgmemory.settings import Settings
from pgmemory.store import migrate, queries as q
from pgmemory.store._ranking.candidates import FirstPass
from pgmemory.store._ranking.recall import recall_memories
from pgmemory.store._ranking.search import search_memories
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
        # The binary codes are generated from the untyped column, which PostgreSQL then refuses
        # to retype; the exact path this test runs never reads them.
        conn.execute(text("ALTER TABLE pgmemory_memories DROP COLUMN embedding_code"))
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
    return search_memories(("user_id",), covering=True, audit=False)


def explain_params(query: np.ndarray) -> dict:
    from pgmemory.store.reads import (
        DISTANT_FUTURE as _DISTANT_FUTURE,
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


def _numbered(statement: str) -> tuple[str, list[str]]:
    """A statement's ``:name`` parameters as ``$1``, ``$2``, ..., and the names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"(?<!:):(\w+)", number, statement), names


def _generic_plan(url: str, statement: str) -> str:
    """EXPLAIN (GENERIC_PLAN) of a statement with ``:name`` parameters: the plan a prepared
    statement runs once it runs its generic plan, whatever the values."""
    numbered, _ = _numbered(statement)
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN (GENERIC_PLAN) " + numbered).scalars().all()
    engine.dispose()
    return "\n".join(rows)


def _executed_plan(url: str, statement: str, values: dict, *, plan_mode: str) -> object:
    """EXPLAIN (ANALYZE, FORMAT JSON) of ``statement`` prepared and executed with ``values``
    under ``plan_cache_mode = plan_mode``, on a fresh VACUUM ANALYZE of the memories."""
    numbered, names = _numbered(statement)
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("VACUUM ANALYZE pgmemory_memories"))
            conn.exec_driver_sql(f"SET plan_cache_mode = {plan_mode}")
            conn.exec_driver_sql("PREPARE measured AS " + numbered)
            # the values as literals (psycopg quotes them): EXECUTE's arguments take no
            # parameters of their own; a vector as pgvector's text form
            driver = conn.connection.driver_connection
            arguments = ", ".join(
                psycopg.sql.Literal(
                    str([float(x) for x in v]) if isinstance(v, np.ndarray) else v
                ).as_string(driver)
                for v in (values[n] for n in names)
            )
            return conn.exec_driver_sql(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE measured({arguments})"
            ).scalar_one()
    finally:
        engine.dispose()


async def _imported(
    url: str, dimensions: int, records: Iterable[MemoryRecord], *, halves: bool = False
) -> None:
    """Migrate ``url`` (adding the half vectors with ``halves``) and import ``records`` into a
    collection ``c`` of ``dimensions``."""
    migrate.upgrade(url)
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    async with MemoryStore(url, settings=settings) as store:
        if halves:
            await Admin(store).add_half_vectors()
        await store.create_collection("c", dimensions=dimensions, embedding_model="test")
        await store.import_records("c", records)


async def _keyword_search_plan(
    url: str, owners: list[str], contents: list[str], user: str, *, plan_mode: str
) -> object:
    """Store row i as ``contents[i]`` of user ``owners[i]`` (3-d vectors), then the executed
    plan (:func:`_executed_plan`) of ``user``'s keyword search for "green tea"."""
    from pgmemory.text import terms

    await _imported(
        url,
        3,
        (
            MemoryRecord(content=c, scope=MemoryScope(user_id=o), embedding=[1, i, 0])
            for i, (o, c) in enumerate(zip(owners, contents, strict=True))
        ),
    )
    statement = search_memories(("user_id",), covering=True, audit=False, mode="text")
    values = {
        "collection": "c",
        "user_id": user,
        "terms": terms.query("green tea"),
        "term_list": terms.terms("green tea"),
        "pool": 50,
        "limit": 10,
        "min_score": -2.0,
    }
    return _executed_plan(url, statement, values, plan_mode=plan_mode)


async def test_a_generic_plan_reads_a_large_scope_from_the_covering_index(
    fresh_database: str,
) -> None:
    """Without a time window the search names no time bound: a generic plan then scans the
    covering index (no heap access), where a generic plan priced the open bounds as selective
    and read every scope row from the heap through the (user, created_at) index; with
    neighbours, each pooled row's from the conversation index."""
    migrate.upgrade(fresh_database)
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    rng = np.random.default_rng(3)
    # "big" writes every other row, 2,000 other users the rest: its rows are spread over the
    # heap; vectors of a real embedder's size make the covering index wide, as in use
    dims = 384
    owners = ["big" if i % 2 == 0 else f"u{i % 2000}" for i in range(6000)]
    async with MemoryStore(fresh_database, settings=settings) as store:
        await store.create_collection("c", dimensions=dims, embedding_model="test")
        await store.add(
            "c",
            [
                MemoryRecord(content=f"m{i}", scope=MemoryScope(user_id=o), embedding=v)
                for i, (o, v) in enumerate(
                    zip(owners, rng.standard_normal((len(owners), dims)), strict=True)
                )
            ],
        )
    engine = sa.create_engine(fresh_database, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("VACUUM ANALYZE pgmemory_memories"))
    engine.dispose()
    defaults = [  # vector search, audited or not, and the chat-history recall's hybrid search
        search_memories(("user_id",), covering=True, audit=False),
        search_memories(("user_id",), covering=True, audit=True),
        search_memories(("user_id",), covering=True, audit=True, mode="hybrid", neighbours=True),
    ]
    neighbours = [  # the statements that rank the pooled rows' neighbours too
        defaults[-1],
        recall_memories(("user_id",), covering=True, mode="hybrid", neighbours=True),
    ]
    for statement in [*defaults, neighbours[-1]]:
        # no time bound for a generic plan to misprice (on 100k-1M rows a generic plan read
        # every scope row from the heap through the (user, created_at) index: bench/store/scale.py)
        assert "created_at >=" not in statement and ":since" not in statement
        plan = _generic_plan(fresh_database, statement)
        assert "Index Only Scan using ix_pgmemory_memories_user_cover" in plan, plan
    for statement in neighbours:
        # a large scope's neighbours: two probes of the conversation index per pooled row
        # (0021), and the scope's rows are not sorted by conversation on the way
        plan = _generic_plan(fresh_database, statement)
        probes = re.findall(
            r"Index (?:Only )?Scan (Backward )?using ix_pgmemory_memories_conversation .*\n.*"
            r"Index Cond: .*hashtextextended.* = p_\d+\.conversation\) AND \(ROW\(created_at",
            plan,
        )
        assert sorted(probes) == ["", "Backward "], plan  # one probe each way
        assert not re.search(r"Sort Key: m(_\d+)?\.session_id", plan), plan


def _plan_nodes(plan: object) -> list[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    nodes: list[dict] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "Node Type" in node:
                nodes.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return nodes


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_a_users_keyword_search_reads_only_that_users_matches(
    fresh_database: str, plan_mode: str
) -> None:
    """The term index is keyed by collection and user (migration 0018): a user's keyword
    search reads the posting lists of its own rows, not those of another user whose every row
    holds the same words (the table-wide index read them all and dropped them afterwards)."""
    owners = ["small" if i % 100 == 0 else "big" for i in range(3000)]
    contents = [f"green tea at noon, note {i}" for i in range(len(owners))]
    plan = await _keyword_search_plan(
        fresh_database, owners, contents, "small", plan_mode=plan_mode
    )
    nodes = _plan_nodes(plan)
    # the scans that ran (a scope this small is ranked exactly: the bounded pool's per-term
    # scans never run)
    scans = [
        n
        for n in nodes
        if n.get("Index Name") == "ix_pgmemory_memories_scope_terms" and n["Actual Loops"] > 0
    ]
    assert scans, plan
    # "small" owns 30 rows, all holding both words; "big" owns 2,970 more
    assert [n["Actual Rows"] for n in scans] == [30]
    assert not [n for n in nodes if "search_vector" in n.get("Index Name", "")]


async def test_new_rows_go_straight_into_the_term_index(fresh_database: str) -> None:
    """The term index has no pending list (0020): a row's keys are in their posting lists
    when its write commits, so a keyword search never reads other writes' unsorted entries
    (PostgreSQL's default, ``fastupdate``, queues them until a vacuum)."""
    migrate.upgrade(fresh_database)
    async with MemoryStore(fresh_database) as store:
        await store.create_collection("c", dimensions=3, embedding_model="test")
        for i in range(40):
            record = MemoryRecord(
                content=f"green tea at noon, note {i}",
                scope=MemoryScope(user_id=f"u{i % 4}"),
                embedding=[1, i, 0],
            )
            await store.add("c", [record])
    engine = sa.create_engine(fresh_database, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
            options = conn.execute(
                text(
                    "SELECT reloptions FROM pg_class "
                    "WHERE oid = 'ix_pgmemory_memories_scope_terms'::regclass"
                )
            ).scalar_one()
            pending = conn.execute(
                text(
                    "SELECT pending_pages, pending_tuples "
                    "FROM pgstatginindex('ix_pgmemory_memories_scope_terms')"
                )
            ).one()
            matched = conn.execute(
                text(
                    "SELECT count(*) FROM pgmemory_memories WHERE "
                    "pgmemory_scope_terms(collection, user_id, search_vector) && "
                    "pgmemory_scope_terms('c', 'u1', to_tsvector('simple', 'tea'))"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    assert options == ["fastupdate=off"]
    assert tuple(pending) == (0, 0)
    assert matched == 10


async def test_the_term_keys_are_the_scopes_digits_before_each_lexeme(store: MemoryStore) -> None:
    """``pgmemory_scope_terms`` (0018, rewritten by 0019 without its subquery): eight hex
    digits of md5(collection, chr(31), user) before each of the tsvector's lexemes, for texts
    whose lexemes hold dots, slashes, at signs, quotes, backslashes, non-ASCII letters and
    whatever control characters sit between words (the body splits on chr(31))."""
    import hashlib

    texts = [
        "",
        "!!!",
        "green tea at noon",
        "see http://example.org/a/b?c=1 or mail bob@example.com",
        "it's a \\back\\slash and \"quotes\" and 'single' ones",
        "Zürich, Łódź, 東京, naïve café",
        "one\x1ftwo\x1fthree\x01four\x7ffive\ttab\nline",
        "x" * 3000,
    ]
    cases = [(c, u, t) for c in ("c", "coll\x1fx") for u in ("u1", "user 2") for t in texts]
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT x.i, pgmemory_scope_terms(x.c, x.u, to_tsvector('simple', x.t)), "
                    "tsvector_to_array(to_tsvector('simple', x.t)) "
                    "FROM unnest(CAST(:c AS text[]), CAST(:u AS text[]), CAST(:t AS text[])) "
                    "WITH ORDINALITY AS x(c, u, t, i) ORDER BY x.i"
                ),
                {"c": [c for c, _, _ in cases], "u": [u for _, u, _ in cases],
                 "t": [t for _, _, t in cases]},
            )
        ).all()  # fmt: skip
    assert len(rows) == len(cases)
    for (collection, user, _), (_, keys, lexemes) in zip(cases, rows, strict=True):
        digits = hashlib.md5(f"{collection}\x1f{user}".encode()).hexdigest()[:8]
        assert keys == [digits + lexeme for lexeme in lexemes]
    assert any(len(keys) > 3 for _, keys, _ in rows)


async def test_a_bulk_import_refreshes_the_planners_statistics(fresh_database: str) -> None:
    """An import of 1,000 rows or more that is at least a tenth of the table vacuums and
    analyses the table when it commits (the planner's row count is then the table's, and every
    page is all-visible, so index-only scans read no row from the heap); a smaller one leaves
    both to autovacuum. The maintenance settings go back to the connection's own after it."""
    migrate.upgrade(fresh_database)

    def rows(n: int, user: str) -> list[MemoryRecord]:
        return [
            MemoryRecord(
                content=f"note {i}", scope=MemoryScope(user_id=user), embedding=[1, i % 7, 0]
            )
            for i in range(n)
        ]

    async def analysed_rows(store: MemoryStore) -> float:
        async with store.engine.connect() as conn:
            return float(
                (
                    await conn.execute(
                        text(
                            "SELECT reltuples FROM pg_class "
                            "WHERE oid = to_regclass('pgmemory_memories')"
                        )
                    )
                ).scalar_one()
            )

    async def pages(store: MemoryStore) -> tuple[int, int]:
        async with store.engine.connect() as conn:
            found = await conn.execute(
                text(
                    "SELECT relpages, relallvisible FROM pg_class "
                    "WHERE oid = to_regclass('pgmemory_memories')"
                )
            )
            total, visible = found.one()
            return int(total), int(visible)

    settings = Settings(_env_file=None, statement_timeout_ms=4_000)  # type: ignore[call-arg]
    async with MemoryStore(fresh_database, settings=settings) as store:
        await store.create_collection("c", dimensions=3, embedding_model="test")
        assert await analysed_rows(store) <= 0  # never analysed
        assert await pages(store) == (0, 0)
        assert await store.import_records("c", rows(1500, "a")) == 1500
        assert await analysed_rows(store) == 1500
        total, visible = await pages(store)
        assert total > 0 and visible == total
        async with store.database.ddl() as conn:
            show = text("SHOW statement_timeout")
            await conn.execute(text(q.MAINTENANCE_SETTINGS), {"maintenance_work_mem": "100MB"})
            assert (await conn.execute(show)).scalar_one() == "0"
            await conn.execute(text(q.MAINTENANCE_RESET))
            assert (await conn.execute(show)).scalar_one() == "4s"
            memory = (await conn.execute(text("SHOW maintenance_work_mem"))).scalar_one()
            assert memory != "100MB"
        assert await store.import_records("c", rows(999, "b")) == 999  # below 1,000 rows
        assert await analysed_rows(store) == 1500
        await store.add("c", rows(20, "c"))  # add never analyses
        assert await store.import_records("c", rows(1000, "d")) == 1000
        assert await analysed_rows(store) == 1500 + 999 + 20 + 1000
        # Another session holding the table's maintenance lock (an index build, a vacuum):
        # the import commits and its vacuum is skipped, not waited for.
        async with store.engine.connect() as holder:
            await holder.execute(
                text("LOCK TABLE pgmemory_memories IN SHARE UPDATE EXCLUSIVE MODE")
            )
            imported = store.import_records("c", rows(4000, "e"))
            assert await asyncio.wait_for(imported, timeout=60) == 4000
            assert await analysed_rows(store) == 1500 + 999 + 20 + 1000
            await holder.rollback()
        assert await store.count("c", MemoryScope(user_id="e")) == 4000


async def test_prepared_statements_run_on_generic_plans_except_on_citus(database_url: str) -> None:
    """The store's connections run prepared statements on their generic plans
    (connector.GENERIC_PLANS), except where nothing is prepared and on a distributed
    database, whose statements Citus cannot plan generically."""
    for prepared in (True, False):
        settings = Settings(_env_file=None, prepared_statements=prepared)  # type: ignore[call-arg]
        async with MemoryStore(database_url, settings=settings) as store:
            async with store.engine.connect() as conn:
                mode = (await conn.execute(text("SHOW plan_cache_mode"))).scalar_one()
            generic = prepared and not store.database.distributed
            assert mode == ("force_generic_plan" if generic else "auto")


async def test_a_generic_plan_reads_each_hit_back_with_one_primary_key_probe(
    fresh_database: str, embedder: CachedEmbedder
) -> None:
    """A search's and a recall's ranked rows are read back one primary-key probe each, under
    a generic plan too: as a join, whose estimates said one ranked row, the read-back once
    served its ``user_id = :user_id`` filter from an index on the user's rows and scanned all
    of them again for every hit (pgmemory.store._ranking.scope.read_back)."""
    from pgmemory.store._engine.database import Database

    migrate.upgrade(fresh_database)
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    rng = np.random.default_rng(5)
    dims = embedder.dimensions
    # "big" owns every fourth row; every other row is a user of its own
    owners = ["big" if i % 4 == 0 else f"u{i}" for i in range(8000)]
    vectors = rng.standard_normal((len(owners), dims)).astype(np.float32)
    captured: list[tuple[str, dict]] = []
    fetch = Database.fetch

    async def spy(self: Database, statement: str, params: dict, **kwargs: object) -> object:
        captured.append((statement, dict(params)))
        return await fetch(self, statement, params, **kwargs)  # type: ignore[arg-type]

    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        await store.create_collection("c", dimensions=dims, embedding_model=embedder.model_id)
        await store.import_records(
            "c",
            (
                MemoryRecord(
                    content=f"green tea note {i}", scope=MemoryScope(user_id=o), embedding=v
                )
                for i, (o, v) in enumerate(zip(owners, vectors, strict=True))
            ),
        )
        big = MemoryScope(user_id="big")
        query = rng.standard_normal(dims).astype(np.float32)
        try:
            Database.fetch = spy  # type: ignore[method-assign]
            await store.search("c", big, vector=query, limit=10)
            await store.search("c", big, query="green tea", limit=10)
            await store.recall("c", big, query="green tea", max_results=5)
        finally:
            Database.fetch = fetch  # type: ignore[method-assign]
    searches = [(s, p) for s, p in captured if "pgmemory_memories" in s]
    assert len(searches) == 3
    for statement, params in searches:
        plan = _executed_plan(fresh_database, statement, params, plan_mode="force_generic_plan")
        # (a keyword side's read of each query term's rows from the term index loops once a
        # term: test_a_generic_plan_asks_the_term_index_for_a_users_matches checks those)
        probes = [
            node
            for node in _plan_nodes(plan)
            if node.get("Relation Name") == "pgmemory_memories"
            and node["Actual Loops"] > 1
            and "pgmemory_scope_terms" not in node.get("Recheck Cond", "")
        ]
        assert probes, plan
        # a probe per outer row reads a row or two (the hit, a neighbour), not the user's 2,000
        assert max(node["Actual Rows"] for node in probes) <= 2, plan


@pytest.mark.parametrize(
    ("first_pass", "column", "function"),
    [("codes", "embedding_code", "binary_quantize"), ("halves", "embedding_half", "l2_normalize")],
)
async def test_a_generic_plan_works_out_the_querys_first_pass_once(
    fresh_database: str, first_pass: FirstPass, column: str, function: str
) -> None:
    """The two-phase path ranks a large scope's codes (or half vectors) by their distance to
    the query's own, worked out once (a scalar subquery, an InitPlan): written inline, a
    generic plan (the store's) quantised the query again for every scope row, which made the
    codes' pass slower than the exact scan it replaces up to a few thousand rows."""
    rng = np.random.default_rng(9)
    dims = 64
    await _imported(
        fresh_database,
        dims,
        (
            MemoryRecord(content=f"note {i}", scope=MemoryScope(user_id="big"), embedding=v)
            for i, v in enumerate(rng.standard_normal((2000, dims)).astype(np.float32))
        ),
        halves=first_pass == "halves",
    )
    statement = search_memories(
        ("user_id",), covering=True, audit=False, mode="vector", shortlist=first_pass
    )
    values = {
        "collection": "c",
        "user_id": "big",
        "query": rng.standard_normal(dims).astype(np.float32),
        "shortlist": 160,
        "limit": 3,
        "min_score": -2.0,
    }
    plan = _executed_plan(fresh_database, statement, values, plan_mode="force_generic_plan")
    nodes = _plan_nodes(plan)
    by_pass = [key for node in nodes for key in node.get("Sort Key", []) if column in key]
    assert by_pass, plan
    assert not any(function in key for key in by_pass), plan
    once = [node for node in nodes if node.get("Subplan Name", "").startswith("InitPlan")]
    assert [node["Actual Loops"] for node in once] == [1], plan


async def test_a_generic_plan_parses_the_query_of_a_scope_without_a_user_once(
    fresh_database: str,
) -> None:
    """A keyword search of a scope without a user tests each scope row against the query's
    tsquery, parsed once (an InitPlan): written inline, a generic plan parsed the query again
    for every row it tested."""
    from pgmemory.text import terms

    await _imported(
        fresh_database,
        3,
        (
            MemoryRecord(
                content="green tea" if i % 3 == 0 else f"note {i}",
                scope=MemoryScope(user_id=f"u{i % 7}", agent_id="helper"),
                embedding=[1, i, 0],
            )
            for i in range(1500)
        ),
    )
    statement = search_memories(("agent_id",), covering=True, audit=False, mode="text")
    values = {
        "collection": "c",
        "agent_id": "helper",
        "terms": terms.or_query(terms.distinct("green tea")),
        "term_list": terms.distinct("green tea"),
        "pool": 50,
        "limit": 5,
        "min_score": -2.0,
    }
    plan = _executed_plan(fresh_database, statement, values, plan_mode="force_generic_plan")
    nodes = _plan_nodes(plan)
    row_tests = [
        node.get("Filter", "") + node.get("Recheck Cond", "") + node.get("Index Cond", "")
        for node in nodes
        if node.get("Relation Name") == "pgmemory_memories"
    ]
    assert any("search_vector @@" in test for test in row_tests), plan
    assert not any("websearch_to_tsquery" in test for test in row_tests), plan
    assert any(node.get("Subplan Name", "").startswith("InitPlan") for node in nodes), plan


@pytest.mark.parametrize("bounded", [False, True])
async def test_a_generic_plan_asks_the_term_index_for_a_users_matches(
    fresh_database: str, bounded: bool
) -> None:
    """A user's keyword matches come from the term index under a generic plan too: every
    matching row (up to KEYWORD_BOUND_FROM rows in the scope), or, above, each query term's
    first rows. A generic plan, estimating a user's rows from the table's average (one or two
    here), once read them through an index on the user's rows, working out every row's term
    keys on the way; the rows now come from the term index, the scope filtered above it."""
    from pgmemory.store._ranking.keywords import KEYWORD_BOUND_FROM

    words = ["green", "tea", "noon", "walk", "river", "bread", "lamp", "chair"]
    rows = 4 * (KEYWORD_BOUND_FROM + (500 if bounded else -500))
    owners = ["big" if i % 4 == 0 else f"u{i}" for i in range(rows)]
    contents = [f"{words[i % 8]} {words[(i // 8) % 8]} note {i}" for i in range(rows)]
    plan = await _keyword_search_plan(
        fresh_database, owners, contents, "big", plan_mode="force_generic_plan"
    )
    ran = [n for n in _plan_nodes(plan) if n.get("Actual Loops", 0) > 0]
    # the rows came from the term index, read once per query term ("green" and "tea"):
    # every row holding it, or (the bounded pool) its first rows ...
    term_scans = [n for n in ran if n.get("Index Name") == "ix_pgmemory_memories_scope_terms"]
    assert [n["Actual Loops"] for n in term_scans] == [2], plan
    # ... and no scan worked out the keys of the rows it read to filter them
    assert not [
        n
        for n in ran
        if n.get("Relation Name") == "pgmemory_memories"
        and "pgmemory_scope_terms" in n.get("Filter", "")
    ], plan


async def test_a_generic_plan_reads_each_recalled_memory_with_one_probe(
    fresh_database: str,
) -> None:
    """The audit page's read of what a user's recalls returned probes each memory by its
    primary key under a generic plan: as a join it read every row of the user and matched them
    against each recalled id."""
    from pgmemory.admin import statements

    migrate.upgrade(fresh_database)
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    owners = ["big" if i % 4 == 0 else f"u{i}" for i in range(8000)]
    big = MemoryScope(user_id="big")
    # random directions: the recalls return memories from all over the user's rows
    rng = np.random.default_rng(11)
    vectors = rng.standard_normal((len(owners) + 10, 3)).astype(np.float32)
    async with MemoryStore(fresh_database, settings=settings) as store:
        await store.create_collection("c", dimensions=3, embedding_model="test")
        await store.import_records(
            "c",
            (
                MemoryRecord(
                    content=f"note {i}", scope=MemoryScope(user_id=o), embedding=vectors[i]
                )
                for i, o in enumerate(owners)
            ),
        )
        for i in range(10):
            await store.search("c", big, vector=vectors[-1 - i], limit=5)
        async with store.engine.connect() as conn:
            ids = (
                (
                    await conn.execute(
                        text("SELECT id FROM pgmemory_recall_audit WHERE user_id = 'big'")
                    )
                )
                .scalars()
                .all()
            )
    values = {"user_id": "big", "recall_ids": list(ids), "per_recall": 5}
    plan = _executed_plan(
        fresh_database, statements.RECALLED_MEMORIES, values, plan_mode="force_generic_plan"
    )
    reads = [
        n
        for n in _plan_nodes(plan)
        if n.get("Relation Name") == "pgmemory_memories" and n.get("Actual Loops", 0) > 0
    ]
    # one probe per recalled memory (10 recalls of 5), each reading that memory only (the
    # join read the user's ~2,000 rows)
    assert [(n["Actual Loops"], n["Actual Rows"]) for n in reads] == [(50, 1.0)], plan


async def test_a_generic_plan_deletes_by_id_with_one_probe_per_id(fresh_database: str) -> None:
    """Deleting a busy user's memories by id finds each id by a primary-key probe under a
    generic plan: with the scope's filter on the deleted table, the plan read every row of the
    user through an index on (collection, user_id) and tested each id."""
    migrate.upgrade(fresh_database)
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    # as bench/store/generic_plans.py: a busy user's 3,000 rows among 3,000 users' 9,000
    owners = ["big" if i % 4 == 0 else f"u{i % 3000}" for i in range(12_000)]
    vectors = np.random.default_rng(3).standard_normal((len(owners), 384)).astype(np.float32)
    async with MemoryStore(fresh_database, settings=settings) as store:
        await store.create_collection("c", dimensions=384, embedding_model="test")
        ids = await store.add(
            "c",
            [
                MemoryRecord(content=f"note {i}", scope=MemoryScope(user_id=o), embedding=v)
                for i, (o, v) in enumerate(zip(owners, vectors, strict=True))
            ],
        )
    big = [i for i, o in zip(ids, owners, strict=True) if o == "big"]
    values = {"collection": "c", "user_id": "big", "ids": big[:3], "actor": ""}
    plan = _executed_plan(
        fresh_database, q.delete_ids(("user_id",)), values, plan_mode="force_generic_plan"
    )
    # rows each scan of the memories read: those it returned and those its filter dropped
    reads = [
        n["Actual Loops"] * (n["Actual Rows"] + n.get("Rows Removed by Filter", 0))
        for n in _plan_nodes(plan)
        if n.get("Relation Name") == "pgmemory_memories" and n.get("Actual Loops", 0) > 0
    ]
    # the three rows deleted, a probe per id and the three rows found by their key; not the
    # user's 3,000
    assert sum(reads) <= 9, (reads, plan)
