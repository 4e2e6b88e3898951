"""Each part of the ranking wing (:mod:`pgmemory.store._ranking`), read and run on its own.

* **Golden SQL**: what each part builds for representative arguments is kept, one file a part,
  in ``tests/golden/ranking/``: a change to one part is a diff to that part's file, reviewed in
  the same commit (``PGMEMORY_UPDATE_GOLDEN=1 pytest tests/store/test_ranking_parts.py -k
  golden``). The whole statements are kept by the wire goldens
  (``tests/package/test_statements_at_wire.py``).
* **Plans**: what a part reads under the generic plans pgmemory's connections run, on a busy
  user among others: the neighbours' probes of the conversation index, the recall walk's
  reads, the audit row's one step, the budget's stages (which read no table at all). The
  vector and keyword sides' plans are checked in ``tests/store/test_plans.py``,
  ``test_two_phase.py`` and ``test_keyword_bound.py``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy import text

from pgmemory.embedders import CachedEmbedder
from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store._engine.database import Database
from pgmemory.store._ranking import (
    audit,
    budget,
    candidates,
    fusion,
    keywords,
    scope,
    signals,
    top,
)
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.store.test_plans import _executed_plan, _plan_nodes

GOLDEN = Path(__file__).parents[1] / "golden" / "ranking"
USER = ("user_id",)
SESSION = ("session_id",)

#: Each part's representative calls: (what the call is, the SQL it builds).
PARTS: dict[str, list[tuple[str, Callable[[], str]]]] = {
    "scope": [
        ("scope_where(user)", lambda: scope.scope_where(USER)),
        ("scope_where(user, session)", lambda: scope.scope_where(("user_id", "session_id"))),
        ("scope_and_window(agent, windowed)", lambda: "\n".join(
            scope.scope_and_window(("agent_id",), windowed=True))),
        ("read_back(routed)", lambda: scope.read_back("t", "m.id", routed=True)),
        ("read_back_scoped(session)", lambda: scope.read_back_scoped("t", "m.id", SESSION)),
    ],
    "candidates": [
        (f"vector_candidates({dims}, covering={covering}, windowed={windowed})",
         lambda dims=dims, covering=covering, windowed=windowed: candidates.vector_candidates(
             dims, covering=covering, windowed=windowed, conversation=False,
             materialized=False, ann_dimensions=None))
        for dims, covering, windowed in ((USER, True, False), (SESSION, False, True))
    ] + [
        ("vector_candidates(user, conversation, materialized)",
         lambda: candidates.vector_candidates(USER, covering=True, windowed=False,
                                              conversation=True, materialized=True,
                                              ann_dimensions=None)),
        ("vector_candidates(user, ann 384)",
         lambda: candidates.vector_candidates(USER, covering=True, windowed=False,
                                              conversation=False, materialized=False,
                                              ann_dimensions=384)),
    ] + [
        (f"vector_candidates(user, shortlist {p})",
         lambda p=p: candidates.vector_candidates(USER, covering=True, windowed=False,
                                                  conversation=False, materialized=False,
                                                  ann_dimensions=None, shortlist=p))
        for p in ("codes", "halves")
    ],
    "keywords": [
        (f"keyword_ranking({dims}, from candidates={c}, distributed={d})",
         lambda dims=dims, c=c, d=d: keywords.keyword_ranking(
             dims, windowed=False, scope_from_candidates=c, distributed=d))
        for dims, c, d in ((USER, False, False), (USER, True, True), (SESSION, True, False))
    ],
    "fusion": [
        (f"hybrid_ranking(user, {f}, neighbours={n})",
         lambda f=f, n=n: fusion.hybrid_ranking(USER, "<candidates>", "<keywords>",
                                                fusion=f, neighbours=n, windowed=False))
        for f, n in (("rank", False), ("score", False), ("score", True))
    ],
    "signals": [
        (f"explained_signals({m}, {f})", lambda m=m, f=f: signals.explained_signals(mode=m, fusion=f))
        for m, f in (("vector", "score"), ("text", "score"), ("hybrid", "rank"), ("hybrid", "score"))
    ],
    "top": [
        (f"mode_ranking(user, {m})",
         lambda m=m: top.mode_ranking(USER, covering=True, mode=m, fusion="score",
                                      neighbours=False, ann_dimensions=None, windowed=False))
        for m in ("vector", "text")
    ] + [
        ("read_hits(user)", lambda: top.read_hits(USER)),
        ("read_hits(session, embedding)", lambda: top.read_hits(SESSION, columns=("embedding",))),
    ],
    "audit": [
        (f"recall_audit(relax_commit={r}, guarded={g}, explained={e})",
         lambda r=r, g=g, e=e: audit.recall_audit(relax_commit=r, guarded=g, explained=e))
        for r, g, e in ((False, False, False), (True, True, True))
    ],
    "budget": [("budget_stages()", lambda: ",\n".join(budget.budget_stages()))],
}  # fmt: skip


def _rendered(part: str) -> str:
    return "".join(f"-- {what}\n{build().strip()}\n\n" for what, build in PARTS[part])


def test_every_part_of_the_wing_has_its_golden_file() -> None:
    import pgmemory.store._ranking as wing

    modules = {p.stem for p in Path(wing.__file__).parent.glob("*.py")} - {"__init__"}
    # the catalogues' whole statements are the wire goldens'
    assert set(PARTS) == modules - {"search", "recall"}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_each_part_builds_its_golden_sql(part: str) -> None:
    got = _rendered(part)
    golden = GOLDEN / f"{part}.sql"
    if os.environ.get("PGMEMORY_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(got, encoding="utf-8")
    assert golden.read_text(encoding="utf-8") == got, (
        f"pgmemory.store._ranking.{part} builds other SQL than tests/golden/ranking/{part}.sql: "
        "if meant, rewrite it with PGMEMORY_UPDATE_GOLDEN=1 and review the diff"
    )


# --- plans ----------------------------------------------------------------------------------


@pytest.fixture
async def busy(fresh_database: str, embedder: CachedEmbedder) -> tuple[str, list[tuple[str, dict]]]:
    """A busy user's 3,000 memories in 60 conversations among 9,000 of other users, and the
    statements the store sent for that user's hybrid search (with neighbours) and recall."""
    migrate.upgrade(fresh_database)
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    rng = np.random.default_rng(7)
    words = [f"w{k}" for k in range(400)]
    records = []
    for i in range(12_000):
        user = "busy" if i % 4 == 0 else f"u{i % 97}"
        said = " ".join(rng.choice(words, size=5)) + (" green tea" if i % 10 == 0 else "")
        records.append(
            MemoryRecord(
                content=f"{said} {i}",
                role="user" if i % 8 < 4 else "assistant",
                scope=MemoryScope(user_id=user, session_id=f"s{i % 60}"),
                embedding=rng.standard_normal(embedder.dimensions).astype(np.float32),
            )
        )
    captured: list[tuple[str, dict]] = []
    fetch = Database.fetch

    async def spy(self: Database, statement: str, params: dict, **kwargs: object) -> object:
        captured.append((statement, dict(params)))
        return await fetch(self, statement, params, **kwargs)  # type: ignore[arg-type]

    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        await store.create_collection(
            "c", dimensions=embedder.dimensions, embedding_model=embedder.model_id
        )
        await store.import_records("c", records)
        user = MemoryScope(user_id="busy")
        try:
            Database.fetch = spy  # type: ignore[method-assign]
            await store.search("c", user, query="green tea", mode="hybrid")
            await store.recall("c", MemoryScope(user_id="busy", session_id="s0"),
                               query="w1 w2 green", mode="vector", max_results=3)  # fmt: skip
        finally:
            Database.fetch = fetch  # type: ignore[method-assign]
    assert len(captured) == 2
    return fresh_database, captured


def _reads(plan: object, index: str | None = None) -> list[dict]:
    """The plan's executed reads of pgmemory_memories (through ``index``, when given)."""
    return [
        n
        for n in _plan_nodes(plan)
        if n.get("Relation Name") == "pgmemory_memories"
        and n.get("Actual Loops", 0) > 0
        and (index is None or n.get("Index Name") == index)
    ]


async def test_the_neighbours_are_two_probes_of_the_conversation_index_per_pooled_row(
    busy: tuple[str, list[tuple[str, dict]]],
) -> None:
    """fusion: in a scope of more than NEIGHBOUR_PROBES_FROM rows, each pooled row's
    neighbours come from two probes of the conversation index, each reading its two rows (not
    a window over the scope's 3,000)."""
    url, ((statement, params), _) = busy
    assert "pooled_rows" in statement  # the search ranked with neighbours
    plan = _executed_plan(url, statement, params, plan_mode="force_generic_plan")
    probes = _reads(plan, "ix_pgmemory_memories_conversation")
    assert len(probes) == 2, plan  # before and after
    pooled = probes[0]["Actual Loops"]
    assert all(p["Actual Loops"] == pooled for p in probes)
    assert 0 < pooled <= 3 * params["pool"]  # at most the three pools, once each
    assert all(p["Actual Rows"] <= 2 for p in probes), plan
    windows = [n for n in _plan_nodes(plan) if n["Node Type"] == "WindowAgg"]
    assert all(n.get("Actual Loops", 0) == 0 or n["Actual Rows"] < 3_000 for n in windows), plan


async def test_the_recall_walk_reads_the_rows_it_walks_past_not_every_ranked_row(
    busy: tuple[str, list[tuple[str, dict]]],
) -> None:
    """recall: each kept match's step reads the ranked rows from the previous one's rank up to
    the one it keeps, one primary-key probe each, and stops there: a recall of 3 matches reads
    a few rows, not the :limit it ranked."""
    url, (_, (statement, params)) = busy
    plan = _executed_plan(url, statement, params, plan_mode="force_generic_plan")
    probes = _reads(plan, "pk_pgmemory_memories")  # the walk's, the hits' and the shown rows'
    walked = sum(n["Actual Loops"] for n in probes)
    assert params["limit"] > 30
    assert 3 <= walked < params["limit"], plan


async def test_the_audit_row_is_one_step_with_or_without_hits(fresh_database: str) -> None:
    """audit: the recall audit row's INSERT reads its one-row aggregate once, so a search of
    no hits audits exactly one row too (with the relaxed commit and the erasure guard)."""
    migrate.upgrade(fresh_database)
    statement = f"""WITH hits AS (
    SELECT CAST(NULL AS uuid) AS id, CAST(NULL AS real) AS score WHERE false
){audit.recall_audit(relax_commit=True, guarded=True)}
SELECT count(*) FROM hits"""
    values = {
        "audit_user_id": "u", "collection": "c", "audit_application_id": "",
        "audit_agent_id": "", "audit_session_id": "", "provider": "test", "mode": "vector",
        "requesting_session_id": "", "query_sha256": "00" * 32, "query_text": None,
    }  # fmt: skip
    plan = _executed_plan(fresh_database, statement, values, plan_mode="force_generic_plan")
    [insert] = [n for n in _plan_nodes(plan) if n["Node Type"] == "ModifyTable"]
    assert insert["Relation Name"] == "pgmemory_recall_audit"
    assert insert["Plans"][0]["Actual Rows"] == 1, plan
    engine = sa.create_engine(fresh_database)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT memory_ids, scores FROM pgmemory_recall_audit WHERE user_id = 'u'")
            ).all()
    finally:
        engine.dispose()
    assert [tuple(r) for r in rows] == [([], [])]


def _budget_model(
    needs: list[int], recent: list[int], parameters: dict[str, int]
) -> tuple[list[int | None], list[int | None]]:
    """The budget rule in Python: each stage shows rows while the running cost (a row's need
    plus its newline) fits what is left; the first that does not fit whole is cut to the room
    left if that is at least min_cap; the stage stops there."""

    def stage(rows: list[int], limit: int) -> list[int | None]:
        caps: list[int | None] = []
        spent = 0
        for need in rows:
            spent += need + 1
            room = limit - spent + need
            caps.append(need if room >= need else room if room >= parameters["min_cap"] else None)
        return caps

    fixed, related, recent_cost = (parameters[k] for k in ("fixed", "related_cost", "recent_cost"))
    a = stage(needs, parameters["half"] - fixed - related)
    used_a = sum(c + 1 for c in a if c is not None)
    used_a += related if any(c is not None for c in a) else 0
    b = stage(recent, parameters["max_tokens"] - fixed - used_a - recent_cost)
    used_b = sum(c + 1 for c in b if c is not None)
    used_b += recent_cost if any(c is not None for c in b) else 0
    n_a = sum(c is not None for c in a)
    c_caps: list[int | None] = [None] * len(needs)
    if all(c is not None for c in b):
        rest = stage(needs[n_a:], parameters["max_tokens"] - fixed - used_a - used_b
                     - (related if n_a == 0 else 0))  # fmt: skip
        c_caps[n_a:] = rest
    return [x if x is not None else y for x, y in zip(a, c_caps, strict=True)], b


@pytest.mark.parametrize("max_tokens", [60, 150, 400, None])
async def test_the_budget_stages_keep_the_rule_and_read_no_table(
    fresh_database: str, max_tokens: int | None
) -> None:
    """budget: the stages, run over given matches and recent rows, show exactly the rows the
    rule shows, with the same caps (what recall_text then renders within); they read no table."""
    migrate.upgrade(fresh_database)
    parameters = budget.budget_parameters(max_tokens, "Memories:")
    rng = np.random.default_rng(3)
    cap = parameters["item_cap"]
    for needs, recent in itertools.islice(
        ((list(rng.integers(5, 90, size=m)), list(rng.integers(5, 90, size=r)))
         for m, r in itertools.product((0, 1, 4), (0, 2, 5))), None):  # fmt: skip
        needs = [min(int(n), cap) for n in needs]
        recent = [min(int(n), cap) for n in recent]
        matches_rows = (
            " UNION ALL ".join(
                f"SELECT {i + 1} AS ord, CAST({n} AS bigint) AS need" for i, n in enumerate(needs)
            )
            or "SELECT 1 AS ord, CAST(0 AS bigint) AS need WHERE false"
        )
        recent_rows = (
            " UNION ALL ".join(
                f"SELECT {i + 1} AS pos, CAST({n} AS bigint) AS need, false AS seen"
                for i, n in enumerate(recent)
            )
            or "SELECT 1 AS pos, CAST(0 AS bigint) AS need, false AS seen WHERE false"
        )
        stages = ",\n".join(budget.budget_stages())
        statement = f"""WITH matches AS ({matches_rows}),
recent AS ({recent_rows}),
{stages}
SELECT 'a' AS stage, ord AS n, cap FROM stage_a
UNION ALL SELECT 'b', pos, cap FROM stage_b
UNION ALL SELECT 'c', ord, cap FROM stage_c
ORDER BY 1, 2"""
        plan = _executed_plan(fresh_database, statement, parameters, plan_mode="force_generic_plan")
        assert not [n for n in _plan_nodes(plan) if "Relation Name" in n], plan
        engine = sa.create_engine(fresh_database)
        try:
            with engine.connect() as conn:
                got = conn.execute(text(statement), parameters).all()
        finally:
            engine.dispose()
        shown_a = {n: c for s, n, c in got if s == "a" and c is not None}
        shown_c = {n: c for s, n, c in got if s == "c" and c is not None}
        matches = [shown_a.get(i + 1, shown_c.get(i + 1)) for i in range(len(needs))]
        recents = [c for s, _, c in got if s == "b"]
        assert (matches, recents) == _budget_model(needs, recent, parameters), (needs, recent)
