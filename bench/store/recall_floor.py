"""Where a small recall's time goes: ``store.search`` beside the floors under it, interleaved.

    python bench/store/recall_floor.py [--rows 20] [--rounds 3000] [--json F]

One user's scope of ``--rows`` rows (384-d). Each round runs, one after another in the same
process and connection pool:

* ``search``, ``search (audit off)``: ``store.search`` as users call it;
* ``db.fetch``: the statement ``search`` sends, through the database's fast verb alone
  (``Database.fetch``: no argument checks, no hit objects);
* ``pool checkout + return``: ``Database.connections.driver_autocommit`` with nothing run in it (a
  connection the fast path holds, taken and held again: ``pgmemory.store._engine.held``);
* ``raw: audited statement``, ``raw: search statement, no audit``, ``raw: SELECT 1``: the same
  statements on a psycopg connection of their own (prepared, autocommit, pgmemory's adapters,
  rows read as dicts by psycopg's ``dict_row``), with nothing of pgmemory around them: the
  floor any implementation of this audit has on this machine;
* ``raw: audited statement, tuples``: the same, its rows read as plain tuples (the least a
  caller can do with them; ``dict_row`` decodes the column names again for every result);
* ``search, prepared_statements=False``, ``raw: the same, unprepared``: both again without
  prepared statements, as behind a pooler in transaction mode (PgBouncer): the cost of
  parsing and planning the statement on every run;
* ``raw: what search sends``: what ``search`` sends exactly, on that connection, the floor of
  ``search`` itself. On one server in READ COMMITTED that is the audited statement alone (it
  takes the user's erasure lock itself: ``Database.guards_reads``), so this is the
  previous step once more; elsewhere (Citus, another isolation) the user's erasure lock and
  the audited statement in one pipeline (one round trip, one implicit transaction; the lock
  makes an erasure running meanwhile either see the audit row or precede it).

The audited statement and its parameters are the very ones ``search`` sent (captured once from
the fast path). Each round runs the steps in an order of its own (shuffled with ``--seed``), so
machine noise, position and the step run just before hit them alike: with a fixed order, a step
that followed several steps on other connections found its backend asleep more often than one
that followed a step on its own connection (two identical raw steps read 7-10 % apart). On an
idle virtual machine a round trip is often slower than under load (idle cores, and a backend
that slept, wake up late).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from bench._common.scratch import Server


async def run(url: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    import psycopg
    from pgvector.psycopg import register_vector_async
    from psycopg.rows import dict_row, tuple_row

    from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
    from pgmemory.store._engine import connector, fastpath
    from pgmemory.store._engine.fastpath import lock_statement
    from pgmemory.store._ranking.search import search_memories

    sent: dict[str, Any] = {}
    run_one = fastpath.run

    async def spy(conn: Any, statement: str, params: Any, **options: Any) -> list[dict[str, Any]]:
        sent.setdefault("statement", statement)
        sent.setdefault("params", dict(params))
        sent.setdefault("lock_users", tuple(options.get("lock_users", ())))
        return await run_one(conn, statement, params, **options)

    rng = np.random.default_rng(args.seed)
    scope = MemoryScope(user_id="floor-user")
    async with MemoryStore(url) as store:
        await store.create_collection("floor", dimensions=384, embedding_model="synthetic")
        vectors = rng.standard_normal((args.rows, 384)).astype(np.float32)
        await store.add(
            "floor",
            [
                MemoryRecord(content=f"m{i}", scope=scope, embedding=v)
                for i, v in enumerate(vectors)
            ],
        )
        query = rng.standard_normal(384).astype(np.float32)
        fastpath.run = spy  # capture the audited statement and its parameters, once
        try:
            await store.search("floor", scope, vector=query, limit=3)
        finally:
            fastpath.run = run_one
        audited = fastpath.driver_statement(sent["statement"])
        plain = fastpath.driver_statement(search_memories(("user_id",), covering=True, audit=False))
        params = sent["params"]
        db = store.database
        # the plan mode the store's own connections run (connector.GENERIC_PLANS, not on a
        # distributed database), so the floor is the same statement run the same way
        raw = await psycopg.AsyncConnection.connect(
            url.replace("postgresql+psycopg://", "postgresql://"),
            autocommit=True,
            options="" if db.distributed else connector.GENERIC_PLANS,
        )
        await register_vector_async(raw)
        connector.register_adapters(raw)
        # Behind a pooler in transaction mode (PgBouncer) nothing may be prepared.
        unprepared = await MemoryStore(url, settings=Settings(prepared_statements=False)).open()

        async def raw_run(statement: fastpath.DriverStatement, *, as_dicts: bool = True) -> None:
            cursor = psycopg.AsyncRawCursor(raw, row_factory=dict_row if as_dicts else tuple_row)
            await cursor.execute(statement.sql, statement.values(params), prepare=True)
            await cursor.fetchall()

        lock_sql, lock_params = lock_statement(sent["lock_users"])
        lock = fastpath.driver_statement(lock_sql)

        async def raw_sent(prepare: bool = True) -> None:
            cursor = psycopg.AsyncRawCursor(raw, row_factory=dict_row)
            if not sent["lock_users"]:
                await cursor.execute(audited.sql, audited.values(params), prepare=prepare)
            else:
                async with raw.pipeline():
                    await psycopg.AsyncRawCursor(raw).execute(
                        lock.sql, lock.values(lock_params), prepare=prepare
                    )
                    await cursor.execute(audited.sql, audited.values(params), prepare=prepare)
            await cursor.fetchall()

        async def pool_only() -> None:
            async with db.connections.driver_autocommit():
                pass

        steps: dict[str, Callable[[], Awaitable[Any]]] = {
            "search": lambda: store.search("floor", scope, vector=query, limit=3),
            "search (audit off)": lambda: store.search(
                "floor", scope, vector=query, limit=3, audit=False
            ),
            "search, prepared_statements=False": lambda: unprepared.search(
                "floor", scope, vector=query, limit=3
            ),
            "db.fetch": lambda: db.fetch(sent["statement"], params),
            "pool checkout + return": pool_only,
            "raw: what search sends": raw_sent,
            "raw: the same, unprepared": lambda: raw_sent(prepare=False),
            "raw: audited statement": lambda: raw_run(audited),
            "raw: audited statement, tuples": lambda: raw_run(audited, as_dicts=False),
            "raw: search statement, no audit": lambda: raw_run(plain),
            "raw: SELECT 1": lambda: raw_run(fastpath.driver_statement("SELECT 1")),
        }
        lat: dict[str, list[float]] = {name: [] for name in steps}
        try:
            names = list(steps)
            order = random.Random(args.seed)
            for warm in (True, False):
                for _ in range(200 if warm else args.rounds):
                    # a fresh order each round: every step runs after every other one alike
                    # (the first statement after a pause wakes a sleeping backend)
                    order.shuffle(names)
                    for name in names:
                        step = steps[name]
                        t = time.perf_counter()
                        await step()
                        if not warm:
                            lat[name].append((time.perf_counter() - t) * 1000)
        finally:
            await raw.close()
            await unprepared.close()
    return {
        name: {f"p{p}_ms": float(np.percentile(v, p)) for p in (50, 95, 99)}
        for name, v in lat.items()
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20, help="rows in the scope")
    p.add_argument("--rounds", type=int, default=3000)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args()
    server = Server()
    try:
        with server.scratch("floor") as url:
            figures = asyncio.run(run(url, args))
    finally:
        server.close()
    print(f"{args.rounds} rounds, scope of {args.rows} rows, top-3 (ms)")
    print(f"{'step':<34} {'p50':>7} {'p95':>7} {'p99':>7}")
    for name, f in figures.items():
        print(f"{name:<34} {f['p50_ms']:>7.3f} {f['p95_ms']:>7.3f} {f['p99_ms']:>7.3f}")
    search = figures["search"]["p50_ms"]
    for floor in (
        "raw: what search sends",
        "raw: audited statement",
        "raw: audited statement, tuples",
    ):
        print(f"search / {floor}: {search / figures[floor]['p50_ms']:.2f}x at p50")
    unprepared = figures["search, prepared_statements=False"]["p50_ms"]
    print(f"search unprepared / prepared: {unprepared / search:.2f}x at p50")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "rounds": args.rounds, **figures}))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
