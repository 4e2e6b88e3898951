"""Capacity arithmetic: bytes per memory at each vector size, and recalls per second per core.

    python bench/store/capacity.py                 # ~1 min on 2 cores
    python bench/store/capacity.py --rows 20000 --seconds 10 --json bench/results/capacity.json

For each dimension, a scratch database gets ``--rows`` memories (random unit vectors, a
~120-character text, ``--users`` users), imported with ``import_records``, then VACUUM
ANALYZE; bytes per memory = (table + TOAST + every index of ``pgmemory_memories``, and the
same of ``pgmemory_memory_audit``, whose insert row every memory gets) / rows. Vectors up to
512 dimensions are stored twice (heap and the covering index: index-only exact recall).

Recalls per second: on the 384-d database, ``--clients`` concurrent tasks run audited top-3
searches (``store.search``, vectors given, so no embedding) of random users' scopes for
``--seconds``. Wall-clock throughput depends on whatever else the machine runs, so the figure
per core is counted in CPU time instead: recalls / (CPU seconds of this Python process + of
the server backends serving its connections, from /proc via psutil), i.e. what one fully
busy core serves, client included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np
import sqlalchemy as sa

from bench._common.scratch import Server
from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings

#: 2000 (the most a collection takes) is left out: its vectors no longer fit a page inline and go
#: to TOAST (migration 0008), a different storage regime from the sizes measured here.
DIMENSIONS = (384, 512, 768, 1024, 1536)
SIZE = """
SELECT sum(pg_total_relation_size(CAST(t AS regclass)))
FROM unnest(CAST(:tables AS text[])) AS t
"""


def _records(rows: int, users: int, dims: int, seed: int) -> list[MemoryRecord]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((rows, dims), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [
        MemoryRecord(
            content=f"memory {i}: the user mentioned a preference about topic {i % 97} "
            f"and asked to remember it for later turns.",
            scope=MemoryScope(user_id=f"user-{i % users}"),
            embedding=vectors[i],
            message_id=f"m{i}",
        )
        for i in range(rows)
    ]


async def _load(url: str, args: argparse.Namespace, dims: int) -> dict[str, Any]:
    settings = Settings(pool_size=max(args.clients, 5))
    async with MemoryStore(url, settings=settings) as store:
        await store.create_collection("c", dimensions=dims, embedding_model="bench")
        records = _records(args.rows, args.users, dims, args.seed)
        started = time.perf_counter()
        await store.import_records("c", records)
        import_s = time.perf_counter() - started
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))
        memories = conn.execute(sa.text(SIZE), {"tables": ["pgmemory_memories"]}).scalar_one()
        audit = conn.execute(sa.text(SIZE), {"tables": ["pgmemory_memory_audit"]}).scalar_one()
    engine.dispose()
    return {
        "dimensions": dims,
        "rows": args.rows,
        "import_rows_per_s": round(args.rows / import_s),
        "bytes_per_memory": round(memories / args.rows),
        "audit_bytes_per_memory": round(audit / args.rows),
    }


async def _recalls(url: str, args: argparse.Namespace, dims: int) -> dict[str, Any]:
    settings = Settings(pool_size=max(args.clients, 5))
    rng = random.Random(args.seed)
    query = np.random.default_rng(args.seed + 1).standard_normal(dims).astype(np.float32)
    done = 0
    async with MemoryStore(url, settings=settings) as store:
        await store.search("c", MemoryScope(user_id="user-0"), vector=query, limit=3)
        backends = await _backend_pids(store)
        cpu_before = time.process_time() + _cpu_seconds(backends)
        deadline = time.perf_counter() + args.seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                user = f"user-{rng.randrange(args.users)}"
                await store.search("c", MemoryScope(user_id=user), vector=query, limit=3)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.clients)))
        elapsed = time.perf_counter() - started
        backends |= await _backend_pids(store)
        cpu = time.process_time() + _cpu_seconds(backends) - cpu_before
    return {
        "dimensions": dims,
        "scope_rows": args.rows // args.users,
        "clients": args.clients,
        "recalls": done,
        "recalls_per_s_wall": round(done / elapsed, 1),
        "cpu_s": round(cpu, 2),
        "recalls_per_cpu_s": round(done / cpu, 1),
        "cores": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
    }


async def _backend_pids(store: MemoryStore) -> set[int]:
    """The server processes serving this database's connections."""
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
        )
        return {int(pid) for pid in rows.scalars()}


def _cpu_seconds(pids: set[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (gone ones: 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    server = Server()
    print(server.info())
    results: dict[str, Any] = {"sizes": [], "recall": None}
    try:
        for dims in DIMENSIONS:
            with server.scratch(f"cap{dims}") as url:
                size = asyncio.run(_load(url, args, dims))
                results["sizes"].append(size)
                print(
                    f"{dims:>5} d: {size['bytes_per_memory']:>6} B/memory "
                    f"(+{size['audit_bytes_per_memory']} B insert audit), "
                    f"import {size['import_rows_per_s']} rows/s",
                    flush=True,
                )
                if dims == 384:
                    recall = asyncio.run(_recalls(url, args, dims))
                    results["recall"] = recall
                    print(
                        f"  recalls (audited top-3, scopes of {recall['scope_rows']} rows, "
                        f"{recall['clients']} clients): {recall['recalls']} in {args.seconds} s "
                        f"= {recall['recalls_per_s_wall']}/s wall on {recall['cores']} cores "
                        f"(load average {recall['load_average_1m']:.1f}); "
                        f"{recall['cpu_s']} CPU s = {recall['recalls_per_cpu_s']} recalls per "
                        "CPU second (client + backends)",
                        flush=True,
                    )
    finally:
        server.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
