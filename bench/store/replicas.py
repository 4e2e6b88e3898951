"""What read replicas cost per call: a store on the primary alone beside one with a hot standby.

    python bench/store/replicas.py                  # ~1 min on 2 cores
    python bench/store/replicas.py --json bench/results/replicas.json

Starts a primary and a streaming hot standby on loopback ports from the embedded wheel's
binaries (as the replica tests do: tests/store/replica_pair.py), loads ``--rows`` memories
(384 d, ``--users`` users), then measures, one call after another, in one run:

* an audited top-3 search: on the primary alone the audit row is written by the search
  statement itself; with the standby, the search runs there and the audit row is a separate
  INSERT on the primary;
* the same search unaudited;
* ``add`` of 2 records: with replicas, each commit also reads the primary's WAL position
  (read-your-writes), and the next search of that user waits for the standby to replay it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)
from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.store import migrate
from tests.store.replica_pair import primary_and_standby

DIMS = 384


def _vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIMS), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def _load(url: str, rows: int, users: int, rng: np.random.Generator) -> None:
    async with MemoryStore(url) as store:
        await store.create_collection("c", dimensions=DIMS, embedding_model="bench")
        vectors = _vectors(rng, rows)
        await store.import_records(
            "c",
            (
                MemoryRecord(
                    content=f"memory {i}",
                    scope=MemoryScope(user_id=f"u{i % users}"),
                    embedding=vectors[i],
                )
                for i in range(rows)
            ),
        )


async def _measure(store: MemoryStore, args: argparse.Namespace, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    queries = _vectors(rng, args.calls)
    timings: dict[str, list[float]] = {"search_audited": [], "search": [], "add": [], "turn": []}
    for i in range(args.calls):
        scope = MemoryScope(user_id=f"u{i % args.users}")
        for name, audit in (("search_audited", True), ("search", False)):
            t = time.perf_counter()
            await store.search("c", scope, vector=queries[i], limit=3, audit=audit)
            timings[name].append(time.perf_counter() - t)
        records = [
            MemoryRecord(content=f"turn {i} {k}", scope=scope, embedding=queries[i])
            for k in range(2)
        ]
        t = time.perf_counter()
        await store.add("c", records)
        timings["add"].append(time.perf_counter() - t)
        t = time.perf_counter()  # the same user's next recall, right after the write
        await store.search("c", scope, vector=queries[i], limit=3)
        timings["turn"].append(time.perf_counter() - t)
    return {name: statistics.median(values) * 1000 for name, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with primary_and_standby() as (primary, standby):
        admin = sa.create_engine(primary.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE bench"))
        admin.dispose()
        url, read_url = primary.url("bench"), standby.url("bench")
        migrate.upgrade(url)
        asyncio.run(_load(url, args.rows, args.users, np.random.default_rng(1)))
        settings = Settings(_env_file=None)  # type: ignore[call-arg]

        async def run(read_urls: list[str], seed: int) -> dict[str, float]:
            async with MemoryStore(url, settings=settings, read_urls=read_urls) as store:
                figures = await _measure(store, args, seed)
                if store._db.replicas is not None:
                    figures["served_by_standby"] = store._db.replicas.replicas[0].served
                return figures

        # Alternate (primary, replica, primary, replica) so drift on a shared machine evens out.
        for round_ in range(2):
            for label, urls in (("primary only", []), ("with standby", [read_url])):
                figures = asyncio.run(run(urls, seed=round_))
                results.setdefault(label, []).append(figures)
    print(f"{args.rows:,} rows x {DIMS} d, {args.users} users, {args.calls} calls each, p50 ms:")
    names = ("search_audited", "search", "add", "turn")
    print(f"{'':<14}" + "".join(f"{n:>16}" for n in names) + f"{'standby served':>16}")
    for label, runs in results.items():
        for figures in runs:
            served = figures.get("served_by_standby", "-")
            print(
                f"{label:<14}" + "".join(f"{figures[n]:>16.2f}" for n in names) + f"{served!s:>16}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
