"""Large scopes, before and after the approximate path: exact vs store.enable_ann().

    python bench/store/large_scope.py [--rows 20000] [--dims 384] [--queries 100]

One collection holds a huge scope (``--rows`` rows for one user), a small one (200 rows)
and filler for 200 other users, with clustered random vectors. It measures top-3 search
latency and recall@3 (against numpy brute force) for the huge and the small scope, first
exact, then after ``enable_ann`` (index build time included), plus the cost of a 2-record
``store.add`` with and without the HNSW index. Runs on a scratch database of the embedded
server (or PGMEMORY_DATABASE_URL), dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np

from bench._common.scratch import Server
from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings


def clustered(rng: np.random.Generator, n: int, dims: int, centres: np.ndarray) -> np.ndarray:
    v = centres[rng.integers(0, len(centres), n)] + 0.35 * rng.standard_normal((n, dims))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


async def measure(
    store: MemoryStore, user: str, truth_vectors: np.ndarray, queries: np.ndarray
) -> tuple[float, float, float]:
    """p50 ms, p95 ms, recall@3 of top-3 searches in the user's scope."""
    lat, found = [], 0
    for q in queries:
        t = time.perf_counter()
        hits = await store.search("big", MemoryScope(user_id=user), vector=q, limit=3, audit=False)
        lat.append((time.perf_counter() - t) * 1000)
        truth = set(np.argsort(-(truth_vectors @ q))[:3].tolist())
        found += len(truth & {int(h.memory.content.split()[-1]) for h in hits})
    lat = lat[5:]
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 95)), found / (3 * len(queries))


async def add_cost(
    store: MemoryStore, dims: int, rng: np.random.Generator, n: int = 50
) -> tuple[float, float]:
    lat = []
    for i in range(n):
        v = rng.standard_normal((2, dims)).astype(np.float32)
        recs = [
            MemoryRecord(
                content=f"turn {i} {j}", scope=MemoryScope(user_id="writer"), embedding=v[j]
            )
            for j in range(2)
        ]
        t = time.perf_counter()
        await store.add("big", recs)
        lat.append((time.perf_counter() - t) * 1000)
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 95))


async def run(url: str, rows: int, dims: int, n_queries: int) -> None:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((64, dims))
    huge = clustered(rng, rows, dims, centres)
    small = clustered(rng, 200, dims, centres)
    queries = clustered(rng, n_queries, dims, centres)
    async with MemoryStore(url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
        await store.create_collection("big", dimensions=dims, embedding_model="random")
        records = [
            MemoryRecord(content=f"huge {i}", scope=MemoryScope(user_id="huge"), embedding=v)
            for i, v in enumerate(huge)
        ]
        records += [
            MemoryRecord(content=f"small {i}", scope=MemoryScope(user_id="small"), embedding=v)
            for i, v in enumerate(small)
        ]
        records += [
            MemoryRecord(content=f"fill {i}", scope=MemoryScope(user_id=f"f{i % 200}"), embedding=v)
            for i, v in enumerate(clustered(rng, rows // 2, dims, centres))
        ]
        t = time.perf_counter()
        await store.import_records("big", records, progress=True)
        print(
            f"imported {len(records):,} rows ({rows:,} in the huge scope, {dims} d) in {time.perf_counter() - t:.1f} s"
        )
        async with store.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            await raw.set_autocommit(True)
            await raw.execute("VACUUM (ANALYZE) pgmemory_memories")
            await raw.execute("SET maintenance_work_mem = '1GB'")
        print(f"{'path':<34}{'scope':>8}{'p50 ms':>9}{'p95 ms':>9}{'recall@3':>10}")
        before = {}
        for user, vecs in (("huge", huge), ("small", small)):
            before[user] = await measure(store, user, vecs, queries)
            p50, p95, rec = before[user]
            print(f"{'exact (covering B-tree)':<34}{user:>8}{p50:>9.2f}{p95:>9.2f}{rec:>10.3f}")
        add_before = await add_cost(store, dims, rng)
        t = time.perf_counter()
        status = await store.enable_ann("big", maintenance_work_mem="1GB")
        print(f"enable_ann: index built and probed in {time.perf_counter() - t:.1f} s -> {status}")
        for user, vecs in (("huge", huge), ("small", small)):
            p50, p95, rec = await measure(store, user, vecs, queries)
            took_ann = user == "huge" and status.enabled
            path = (
                f"HNSW path (ef_search {status.ef_search})"
                if took_ann
                else "exact (below threshold)"
            )
            ratio = f"   ({before[user][0] / p50:.1f}x faster at p50)" if took_ann else ""
            print(f"{path:<34}{user:>8}{p50:>9.2f}{p95:>9.2f}{rec:>10.3f}{ratio}")
        add_after = await add_cost(store, dims, rng)
        print(
            f"store.add of 2 records: p50 {add_before[0]:.2f} -> {add_after[0]:.2f} ms, "
            f"p95 {add_before[1]:.2f} -> {add_after[1]:.2f} ms (without -> with the HNSW index)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    server = Server()
    try:
        with server.scratch("large") as url:
            asyncio.run(run(url, args.rows, args.dims, args.queries))
    finally:
        server.close()


if __name__ == "__main__":
    main()
