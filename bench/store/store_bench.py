"""Store timings: adding 1,000 records, and exact scoped search p50/p95 over 10,000 rows.

    python bench/store/store_bench.py [--dims 512] [--queries 200]

Runs on a scratch database (created and dropped) of the embedded server, or of the server
PGMEMORY_DATABASE_URL points at. Vectors are random unit vectors, precomputed, so embedding
time is excluded except in the line that says otherwise.
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
from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings, USEEmbedder


def unit(rng: np.random.Generator, n: int, dims: int) -> np.ndarray:
    v = rng.standard_normal((n, dims)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


async def run(url: str, dims: int, queries: int) -> None:
    rng = np.random.default_rng(0)
    async with MemoryStore(url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
        await store.create_collection("bench", dimensions=dims, embedding_model="random")

        # 1. add 1,000 records in one transaction (precomputed vectors)
        vecs = unit(rng, 1000, dims)
        records = [
            MemoryRecord(
                content=f"memory number {i}", scope=MemoryScope(user_id="adder"), embedding=v
            )
            for i, v in enumerate(vecs)
        ]
        t = time.perf_counter()
        await store.add("bench", records)
        add_s = time.perf_counter() - t
        print(
            f"add 1,000 records ({dims}-d vectors given), one transaction: {add_s * 1000:.0f} ms "
            f"({1000 / add_s:,.0f} rows/s)"
        )

        # 2. 10,000 rows: one user with 10,000 rows, and 20 users with 500 rows each
        for user, n in [("big", 10_000)] + [(f"u{i:02d}", 500) for i in range(20)]:
            v = unit(rng, n, dims)
            t = time.perf_counter()
            await store.import_records(
                "bench",
                (
                    MemoryRecord(
                        content=f"{user} {i}", scope=MemoryScope(user_id=user), embedding=x
                    )
                    for i, x in enumerate(v)
                ),
            )
            if user == "big":
                el = time.perf_counter() - t
                print(f"binary COPY import of 10,000 rows: {el:.2f} s ({n / el:,.0f} rows/s)")
        # VACUUM sets the visibility map, so the covering index is read index-only.
        async with store.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            await raw.driver_connection.set_autocommit(True)
            await raw.driver_connection.execute("VACUUM (ANALYZE) pgmemory_memories")
            await raw.driver_connection.set_autocommit(False)

        # 3. scoped exact top-3
        qs = unit(rng, queries, dims)
        for label, user, rows in [
            ("scope of 10,000 rows", "big", 10_000),
            ("scope of 500 rows (of 20,000)", "u07", 500),
        ]:
            for audit in (False, True):
                lat = []
                for q in qs:
                    t = time.perf_counter()
                    hits = await store.search(
                        "bench", MemoryScope(user_id=user), vector=q, limit=3, audit=audit
                    )
                    lat.append((time.perf_counter() - t) * 1000)
                    assert len(hits) == 3
                lat = lat[5:]  # warm-up
                print(
                    f"search top-3, {label}, audit={'on ' if audit else 'off'}: p50 {pct(lat, 50):.2f} ms, "
                    f"p95 {pct(lat, 95):.2f} ms  ({pct(lat, 50) * 1000 / rows:.2f} µs/row at p50)"
                )

    # 4. with the default embedder: add 1,000 short texts (embedding included)
    embedder = USEEmbedder()
    await embedder.embed(["warm up"])
    async with MemoryStore(url, settings=Settings(_env_file=None), embedder=embedder) as store:  # type: ignore[call-arg]
        await store.create_collection("bench_text")
        texts = [
            MemoryRecord(
                content=f"User note {i}: prefers dish {i % 7} with {i % 3} portions",
                scope=MemoryScope(user_id="texter"),
            )
            for i in range(1000)
        ]
        t = time.perf_counter()
        await store.add("bench_text", texts)
        el = time.perf_counter() - t
        print(
            f"add 1,000 texts embedded by multilingual USE (1 thread): {el:.2f} s ({1000 / el:,.0f} rows/s)"
        )
        t = time.perf_counter()
        for i in range(50):
            await store.search(
                "bench_text", MemoryScope(user_id="texter"), query=f"what does the user prefer {i}"
            )
        print(
            f"search by text (embed + exact top-3 over 1,000 rows): {(time.perf_counter() - t) / 50 * 1000:.1f} ms mean"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, default=512)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    server = Server()
    try:
        with server.scratch("store") as url:
            asyncio.run(run(url, args.dims, args.queries))
    finally:
        server.close()


if __name__ == "__main__":
    main()
