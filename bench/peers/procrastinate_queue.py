"""procrastinate's side of bench/store/queue_choice.py, run in its own venv (bench/.peers/).

    python procrastinate_queue.py URL OUT.json --turns N --jobs J --users U --workers 1,4

On the scratch database URL names: applies procrastinate's schema, then measures (1) a turn's
write transaction (one INSERT into a stand-in table) with and without deferring one job on the
same connection (``task.configure(connection=conn)``: in the turn's transaction), and (2) how
fast procrastinate's worker drains J jobs over U users with a task that does nothing, with each
concurrency. Writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import procrastinate
import psycopg


async def derive_nothing(user_id: str, messages: list[str]) -> None:
    """The job's work is left out: only the queue's own cost is measured."""


async def turn_ms(url: str, turns: int, defer: bool, derive: Any) -> list[float]:
    out = []
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for t in range(turns):
            user = f"u{t % 50}"
            started = time.perf_counter()
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO bench_turns (user_id, body) VALUES (%s, %s)", (user, "hello")
                )
                if defer:
                    await derive.configure(connection=conn).defer_async(
                        user_id=user, messages=["I live in Lisbon."]
                    )
            out.append((time.perf_counter() - started) * 1000)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--workers", default="1,4")
    args = parser.parse_args()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.url))
    derive = app.task(queue="derive", name="derive")(derive_nothing)
    result: dict = {"version": procrastinate.__version__}
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
            await conn.execute("CREATE TABLE bench_turns (user_id text NOT NULL, body text)")
            result["schema_tables"] = (
                await (
                    await conn.execute(
                        "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'procrastinate%%'"
                    )
                ).fetchone()
            )[0]
        for defer in (False, True, False, True):  # interleaved, twice
            key = "turn_with_enqueue_ms" if defer else "turn_alone_ms"
            result.setdefault(key, []).extend(
                await turn_ms(args.url, args.turns // 2, defer, derive)
            )
        for key in ("turn_alone_ms", "turn_with_enqueue_ms"):
            result[key] = round(statistics.median(result[key]), 3)
        async with await psycopg.AsyncConnection.connect(args.url, autocommit=True) as conn:
            await conn.execute("DELETE FROM procrastinate_jobs")
        for workers in [int(w) for w in args.workers.split(",")]:
            for j in range(args.jobs):
                await derive.defer_async(user_id=f"u{j % args.users}", messages=["x"])
            started = time.perf_counter()
            await app.run_worker_async(
                queues=["derive"], concurrency=workers, wait=False, install_signal_handlers=False,
                listen_notify=False, delete_jobs="always",
            )  # fmt: skip
            result[f"drain_jobs_per_s_{workers}"] = round(
                args.jobs / (time.perf_counter() - started), 1
            )
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
