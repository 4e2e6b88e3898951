"""The recall statement (``MemoryStore.recall``'s one statement), before and after a change.

    python bench/store/recall_statement.py --before 27b9e1d [--sizes 20 100 1000] [--queries 200]
        [--json bench/results/recall-statement.json]

One collection on a scratch database (embedded server, or PGMEMORY_DATABASE_URL), one user per
size holding that many chat messages: ``bench/store/hybrid_statement.py``'s corpus and
bag-of-words embedder, conversations of 20 messages. Each query is recalled once through
``store.recall`` as the chat-history provider calls it (its default options: hybrid, 3
matches, 2 recent turns, 2,000 tokens, audited), and the statement and parameters it sent are
captured. Both sides then run them on one connection, as the store does (one prepared round
trip, psycopg directly), in alternating order: today's statement and the statement
``pgmemory/store/queries.py`` made at ``--before`` with the same arguments. Both must return
the same rows (ids, reasons, caps, scores); each run writes its audit row, as a recall does.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np

from bench._common.layout import ranking_at, ranking_now
from bench._common.scratch import Server
from bench.store.hybrid_statement import BagEmbedder, Corpus, seed_users

COLLECTION = "recall"


def arguments_of(statement: str, now: Any) -> dict[str, Any]:
    """The ``recall_memories`` arguments that make ``statement`` today (one user scope)."""
    flags = itertools.product((True, False), repeat=2)
    for relax_commit, guarded in flags:
        arguments = {
            "covering": True,
            "mode": "hybrid",
            "fusion": "score",
            "neighbours": True,
            "max_results": 3,
            "audit": True,
            "relax_commit": relax_commit,
            "guarded": guarded,
        }
        if now.recall_memories(("user_id",), **arguments) == statement:
            return arguments
    raise SystemExit("the captured recall statement is not one this benchmark builds")


def shown(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["id"], r["reason"], r["cap"], round(float(r["score"]), 5)) for r in rows]


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from pgmemory import MemoryScope, MemoryStore, Settings
    from pgmemory.store._engine import fastpath

    now, before = ranking_now(), ranking_at(args.before)
    embedder = BagEmbedder()
    corpus = Corpus()
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    captured: list[tuple[str, dict[str, Any]]] = []
    run = fastpath.run

    async def spy(conn: Any, statement: str, params: Any, **options: Any) -> Any:
        captured.append((statement, dict(params)))
        return await run(conn, statement, params, **options)

    figures: dict[str, Any] = {}
    async with MemoryStore(url, settings=settings, embedder=embedder) as store:
        texts = await seed_users(store, COLLECTION, embedder, corpus, args.sizes)
        for n in args.sizes:
            scope = MemoryScope(user_id=f"user{n}")
            picks = corpus.rng.integers(0, n, size=args.queries)
            calls = []
            for i in picks:
                captured.clear()
                fastpath.run = spy
                try:
                    await store.recall(COLLECTION, scope, query=corpus.query(texts[i]))
                finally:
                    fastpath.run = run
                [call] = captured
                calls.append(call)
            statements = {
                "after": calls[0][0],
                "before": before.recall_memories(("user_id",), **arguments_of(calls[0][0], now)),
            }
            lat: dict[str, list[float]] = {side: [] for side in statements}
            sides = list(statements)
            async with store.database.connections.driver_autocommit() as conn:
                for j, (statement, params) in enumerate(calls):
                    assert statement == statements["after"]
                    got = {}
                    for side in sides if j % 2 == 0 else sides[::-1]:
                        t = time.perf_counter()
                        rows = await fastpath.run(conn, statements[side], params)
                        elapsed = (time.perf_counter() - t) * 1000
                        got[side] = shown(rows)
                        if j >= args.warm_up:
                            lat[side].append(elapsed)
                    if got["before"] != got["after"]:
                        raise SystemExit(f"{n} messages, query {j}: the two sides differ")
            p50 = {side: float(np.percentile(v, 50)) for side, v in lat.items()}
            figures[str(n)] = {
                "p50_ms": p50,
                "p95_ms": {side: float(np.percentile(v, 95)) for side, v in lat.items()},
                "after_over_before": p50["after"] / p50["before"],
                "queries": len(lat["after"]),
            }
            print(
                f"{n:>6} messages: before {p50['before']:.3f} ms, after {p50['after']:.3f} ms "
                f"p50 ({p50['after'] / p50['before']:.2f}x), same rows in {len(calls)} recalls",
                flush=True,
            )
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="git ref whose recall statement is 'before'")
    p.add_argument("--sizes", type=int, nargs="+", default=[20, 100, 1000])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--warm-up", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    server = Server()
    try:
        with server.scratch("recall_statement") as url:
            figures = asyncio.run(measure(url, args))
        if args.json:
            out = {"before": args.before, "server": server.info(), "sizes": figures}
            args.json.write_text(json.dumps(out, indent=2) + "\n")
            print(f"wrote {args.json}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
