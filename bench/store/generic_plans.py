"""The turn path's statements on a realistic tenant mix: custom plan against generic plan.

    python bench/store/generic_plans.py [--rows 12000] [--big 3000 1500] [--json F]

pgmemory's connections prepare their statements, and PostgreSQL runs a prepared statement on
its generic plan after its first executions (:data:`pgmemory.store._engine.connector.GENERIC_PLANS`).
A generic plan does not know whose scope it reads: it estimates a user's rows from the table's
average. With many small users beside a busy one (every production table), that estimate is a
row or two where the busy user has thousands, and a plan that is right for one row can be very
wrong for them. The other benchmarks seed one user or a few big ones, where the average is
large too, so they cannot show it.

Per ``--big`` size: a scratch database of ``--rows`` chat messages (bench/store/
hybrid_statement.py's Zipf-worded corpus and bag-of-words embedder: no model needed), that
many of them the busy user's and the rest spread over ``--users`` users. The statements the
store sends for the busy user are captured through the public API: a vector search (top 3),
a hybrid and a keyword search (top 10; the query: words of one of the user's messages and two
common ones), a recall, and the audit page's read of what the user's last 20 recalls
returned (``Admin.user_recalls``'s statement) and ``store.delete``'s statement for one id
the user does not hold; each is then prepared
on a connection of its own and run under ``plan_cache_mode = force_custom_plan`` and
``force_generic_plan``, ``--runs`` times each; the figure is the fastest server execution time
(EXPLAIN ANALYZE's, no round trip). A generic plan slower than the custom one by much is a
plan hazard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np

from bench._common.scratch import Server
from bench.store.hybrid_statement import BagEmbedder, Corpus

COLLECTION = "plans"


def numbered(statement: str) -> tuple[str, list[str]]:
    """``:name`` parameters as ``$1``, ``$2``, ... (PREPARE's form), and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"(?<!:):(\w+)", number, statement), names


async def captured(url: str, big: int, args: argparse.Namespace) -> list[tuple[str, str, dict]]:
    """Seed the scratch database; the statements the store sends for the busy user."""
    from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
    from pgmemory.admin import statements as admin_statements
    from pgmemory.store import queries
    from pgmemory.store._engine.database import Database

    embedder = BagEmbedder()
    corpus = Corpus(seed=args.seed)
    texts = corpus.messages(args.rows)
    vectors = await embedder.embed(texts)
    owners = ["busy"] * big + [f"u{i % args.users}" for i in range(args.rows - big)]
    np.random.default_rng(args.seed).shuffle(owners)  # the busy user's rows spread over the heap
    # a query as bench/store/hybrid_statement.py makes them: words of one of the user's messages
    query = corpus.query(texts[owners.index("busy")])
    start = datetime(2025, 1, 1, tzinfo=UTC)
    sent: list[tuple[str, dict]] = []
    fetch = Database.fetch

    async def spy(self: Database, statement: str, params: Any, **kwargs: Any) -> Any:
        sent.append((statement, dict(params)))
        return await fetch(self, statement, params, **kwargs)

    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(url, settings=settings, embedder=embedder) as store:
        await store.create_collection(COLLECTION, dimensions=512, embedding_model=embedder.model_id)
        await store.import_records(
            COLLECTION,
            (
                MemoryRecord(
                    content=texts[i],
                    scope=MemoryScope(user_id=owners[i], session_id=f"s{i // 20}"),
                    role="user" if i % 2 == 0 else "assistant",
                    embedding=vectors[i],
                    created_at=start + timedelta(minutes=i),
                )
                for i in range(args.rows)
            ),
        )
        busy = MemoryScope(user_id="busy")
        runs = [
            ("vector search", store.search(COLLECTION, busy, vector=vectors[0], limit=3)),
            ("hybrid search", store.search(COLLECTION, busy, query=query, limit=10)),
            ("keyword search", store.search(COLLECTION, busy, query=query, limit=10, mode="text")),
            ("recall", store.recall(COLLECTION, busy, query=query)),
        ]
        named = []
        Database.fetch = spy  # type: ignore[method-assign]
        try:
            for name, call in runs:
                del sent[:]
                await call
                statement, params = next(s for s in sent if "pgmemory_memories" in s[0])
                named.append((name, statement, params))
        finally:
            Database.fetch = fetch  # type: ignore[method-assign]
        # the audit page's read of what the busy user's last 20 recalls returned (the
        # statement Admin.user_recalls runs, with the ids of those recalls)
        for i in range(20):
            await store.search(COLLECTION, busy, vector=vectors[i + 1], limit=5)
        async with store.database.connections.driver_autocommit() as conn:
            cur = await conn.execute(
                "SELECT id FROM pgmemory_recall_audit WHERE user_id = 'busy' ORDER BY id DESC"
                " LIMIT 20"
            )
            recall_ids = [row[0] for row in await cur.fetchall()]
    params = {"user_id": "busy", "recall_ids": recall_ids, "per_recall": 5}
    named.append(("audit page", admin_statements.RECALLED_MEMORIES, params))
    # store.delete(ids=[...]) of one id the user does not hold (each run deletes nothing,
    # whatever the plan reads to find that out)
    absent = {"collection": COLLECTION, "user_id": "busy", "ids": [uuid.uuid4()], "actor": ""}
    named.append(("delete by id", queries.delete_ids(("user_id",)), absent))
    return named


async def timed(url: str, statements: list[tuple[str, str, dict]], runs: int) -> dict:
    """Each statement's fastest execution (ms) under a custom and under a generic plan."""
    import psycopg
    import psycopg.sql

    figures: dict[str, dict[str, float]] = {}
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    async with await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, prepare_threshold=None
    ) as conn:
        await conn.execute("VACUUM ANALYZE pgmemory_memories")
        for name, statement, params in statements:
            text, names = numbered(statement)
            values = [
                str([float(x) for x in v]) if isinstance(v, np.ndarray) else v
                for v in (params[n] for n in names)
            ]
            arguments = ", ".join(psycopg.sql.Literal(v).as_string(conn) for v in values)
            figures[name] = {}
            for mode in ("force_custom_plan", "force_generic_plan"):
                await conn.execute(f"SET plan_cache_mode = {mode}")
                await conn.execute("DEALLOCATE ALL")
                await conn.execute(f"PREPARE measured AS {text}")  # type: ignore[arg-type]
                best = float("inf")
                for _ in range(runs):
                    cur = await conn.execute(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE measured({arguments})"  # type: ignore[arg-type]
                    )
                    row = await cur.fetchone()
                    assert row is not None
                    best = min(best, float(row[0][0]["Execution Time"]))
                figures[name][mode.split("_")[1]] = best
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=12_000, help="chat messages in the table")
    p.add_argument("--big", type=int, nargs="+", default=[3000, 1500], help="the busy user's rows")
    p.add_argument("--users", type=int, default=3000, help="users sharing the other rows")
    p.add_argument("--runs", type=int, default=5, help="executions per statement and plan")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args()
    results: dict[str, Any] = {}
    server = Server()
    try:
        for big in args.big:
            with server.scratch(f"plans{big}") as url:
                statements = asyncio.run(captured(url, big, args))
                results[str(big)] = asyncio.run(timed(url, statements, args.runs))
    finally:
        server.close()
    print(f"{args.rows:,} messages, {args.users:,} users beside the busy one; fastest of "
          f"{args.runs} executions, ms")  # fmt: skip
    print(f"{'busy rows':>9} | {'statement':<15} {'custom':>8} {'generic':>8} {'ratio':>6}")
    for big, figures in results.items():
        for name, f in figures.items():
            ratio = f["generic"] / f["custom"]
            print(f"{big:>9} | {name:<15} {f['custom']:>8.2f} {f['generic']:>8.2f} {ratio:>5.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "users": args.users, "busy": results}))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
