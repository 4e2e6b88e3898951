"""Which queue for derived memory: pgmemory's own table, or procrastinate? Measured side by side.

    .venv/bin/python bench/store/queue_choice.py [--json bench/results/queue-choice.json]

On one scratch database per side (the embedded server, or PGMEMORY_DATABASE_URL), the same two
things, each on the queue's own API:

* **the turn's cost**: a turn's write transaction (one INSERT into a stand-in table) alone, and
  with one job queued in the same transaction (pgmemory: ``JobQueue.enqueue`` inside
  ``store.shared_transaction()``; procrastinate 3: ``task.configure(connection=conn)
  .defer_async``), p50 over ``--turns`` turns, interleaved;
* **draining**: ``--jobs`` jobs over ``--users`` users, processed by 1 and by 4 concurrent
  workers that do no work but the queue's own (pgmemory: ``due_users``, ``lease``, then
  ``complete`` in a transaction; procrastinate: its worker with a task that does nothing).

procrastinate runs in its own venv (bench/.peers/procrastinate, created on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import sqlalchemy as sa

from bench._common.paths import ROOT
from bench._common.scratch import Server
from pgmemory import MemoryScope, MemoryStore, Settings
from pgmemory.store.jobs import JobQueue

PEER_ENV = ROOT / "bench" / ".peers" / "procrastinate"
PEER_REQUIREMENTS = ["procrastinate==3.10.0", "psycopg[binary,pool]>=3.2"]
NAMESPACE = "derive"


async def pgmemory_side(url: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE bench_turns (user_id text NOT NULL, body text)"))
    engine.dispose()
    result: dict[str, Any] = {}
    async with MemoryStore(url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
        queue = JobQueue(store.database)

        async def turn(user: str, enqueue: bool) -> float:
            started = time.perf_counter()
            async with store.shared_transaction():
                async with store.database.write(users=(user,)) as conn:
                    await conn.execute(
                        sa.text("INSERT INTO bench_turns (user_id, body) VALUES (:u, 'hello')"),
                        {"u": user},
                    )
                if enqueue:
                    await queue.enqueue(
                        NAMESPACE, MemoryScope(user_id=user), {"messages": ["I live in Lisbon."]}
                    )
            return (time.perf_counter() - started) * 1000

        times: dict[bool, list[float]] = {False: [], True: []}
        for enqueue in (False, True, False, True):
            for t in range(args.turns // 2):
                times[enqueue].append(await turn(f"u{t % 50}", enqueue))
        result["turn_alone_ms"] = round(statistics.median(times[False]), 3)
        result["turn_with_enqueue_ms"] = round(statistics.median(times[True]), 3)
        async with store.database.write(users=()) as conn:
            await conn.execute(sa.text("DELETE FROM pgmemory_jobs"))

        async def worker() -> int:
            leases = 0
            while users := await queue.due_users([NAMESPACE], limit=16):
                random.shuffle(users)  # as FactWorker.run_once does
                for user in users:
                    lease = await queue.lease(user, [NAMESPACE])
                    if lease is None:
                        continue
                    async with store.shared_transaction():
                        await queue.complete(lease)
                    leases += 1
            return leases

        for workers in (1, 4):
            for j in range(args.jobs):
                await queue.enqueue(
                    NAMESPACE, MemoryScope(user_id=f"u{j % args.users}"), {"messages": ["x"]}
                )
            started = time.perf_counter()
            leases = sum(await asyncio.gather(*(worker() for _ in range(workers))))
            result[f"drain_jobs_per_s_{workers}"] = round(
                args.jobs / (time.perf_counter() - started), 1
            )
            result[f"drain_leases_{workers}"] = leases
    return result


def peer_python() -> Path:
    python = PEER_ENV / "bin" / "python"
    stamp = PEER_ENV / ".installed"
    want = "\n".join(PEER_REQUIREMENTS)
    if not (python.exists() and stamp.exists() and stamp.read_text() == want):
        print(f"creating {PEER_ENV.relative_to(ROOT)} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEER_ENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)
        stamp.write_text(want)
    return python


def procrastinate_side(url: str, args: argparse.Namespace) -> dict[str, Any]:
    out = ROOT / "bench" / ".cache" / f"queue-choice-{uuid.uuid4().hex[:6]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    libpq = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    subprocess.run(
        [str(peer_python()), str(ROOT / "bench" / "peers" / "procrastinate_queue.py"), libpq,
         str(out), "--turns", str(args.turns), "--jobs", str(args.jobs),
         "--users", str(args.users), "--workers", "1,4"],
        check=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    out.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    server = Server()
    try:
        with server.scratch("queue_pgmemory") as url:
            ours = asyncio.run(pgmemory_side(url, args))
        with server.scratch("queue_procrastinate", pgmemory_schema=False) as url:
            theirs = procrastinate_side(url, args)
        info = server.info()
    finally:
        server.close()
    rows = [
        ("turn write alone, p50 ms", "turn_alone_ms"),
        ("turn write + enqueue, p50 ms", "turn_with_enqueue_ms"),
        ("drain, 1 worker, jobs/s", "drain_jobs_per_s_1"),
        ("drain, 4 workers, jobs/s", "drain_jobs_per_s_4"),
    ]
    print(f"\n{info}; {args.jobs} jobs over {args.users} users")
    print(f"{'':<32} {'pgmemory':>10} {'procrastinate ' + theirs['version']:>20}")
    for label, key in rows:
        print(f"{label:<32} {ours[key]:>10} {theirs[key]:>20}")
    for side, values in (("pgmemory", ours), ("procrastinate", theirs)):
        added = values["turn_with_enqueue_ms"] - values["turn_alone_ms"]
        print(f"{side}: the enqueue adds {added:.3f} ms to the turn")
    if args.json:
        args.json.write_text(
            json.dumps({"server": info, "pgmemory": ours, "procrastinate": theirs}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
