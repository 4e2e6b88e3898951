"""Small recalls, before and after a change of the read path, interleaved in one process.

    python bench/retrieval/recall_ab.py --before ad3613f          # the search path of that commit vs now

The ``before`` side is the read path (``pgmemory/store/queries.py``, ``recall.py`` and
``reads.py``) as it was at ``--before`` (read with ``git show``), loaded as modules of their own
next to today's, and run on the SAME store: same pool, same catalogue. Every query runs on
both sides, in ABBA order, so machine noise hits both alike, and both sides must return the
same hits. Audit on (the default) and off.

Data: ``--users`` users per scope size (3, 30 and 100 rows: the ``small`` bucket of
bench/store/scale.py, 1-100 rows; and 700 rows, ``mid``), 384-d unit vectors, queries drawn afresh.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from bench._common.layout import modules_at, ranking_paths
from bench._common.scratch import Server

SIZES = (3, 30, 100, 700)


#: The read path's modules (with the ranking's builders at the ref: :func:`ranking_paths`).
READ_PATH = ("queries", "recall", "reads")


def reads_at(ref: str) -> ModuleType:
    """``pgmemory.store.reads`` as it was at git ``ref`` (with that ref's ``queries``,
    ``recall`` and ranking), as modules of their own beside today's."""
    paths = [f"pgmemory/store/{name}.py" for name in READ_PATH]
    paths += [p for p in ranking_paths(ref) if p not in paths]
    return modules_at(ref, paths)["pgmemory.store.reads"]


async def run(url: str, args: argparse.Namespace) -> None:
    from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
    from pgmemory.store import reads

    before = reads_at(args.before)
    settings = Settings(_env_file=None, pool_size=8, max_overflow=2)  # type: ignore[call-arg]
    rng = np.random.default_rng(args.seed)
    async with MemoryStore(url, settings=settings) as store:
        await store.create_collection("ab", dimensions=384, embedding_model="synthetic")
        users = [(f"s{n}-{k}", n) for n in SIZES for k in range(args.users)]
        records = []
        for user, n in users:
            v = rng.standard_normal((n, 384)).astype(np.float32)
            records += [
                MemoryRecord(content=f"{user} {i}", scope=MemoryScope(user_id=user), embedding=x)
                for i, x in enumerate(v)
            ]
        await store.import_records("ab", records)

        def call(module: ModuleType, user: str, vector: np.ndarray, audit: bool) -> Any:
            return module.search(
                store._db, store._catalogue, store._ann, "ab", MemoryScope(user_id=user),
                query=None, vector=vector, limit=3, mode="vector", weights=None, min_score=None,
                since=None, until=None, allow_unscoped=False, audit=audit, trace=None,
            )  # fmt: skip

        sides = {"before": before, "after": reads}
        lat: dict[tuple[str, int, bool], list[float]] = {}
        queries = rng.standard_normal((args.queries, 384)).astype(np.float32)
        for warm in (True, False):
            for j in range(args.queries if not warm else 60):
                user, n = users[j % len(users)]
                for audit in (True, False):
                    order = ("before", "after") if j % 2 == 0 else ("after", "before")
                    got = []
                    for side in order:
                        t = time.perf_counter()
                        hits = await call(sides[side], user, queries[j], audit)
                        elapsed = (time.perf_counter() - t) * 1000
                        got.append([(h.memory.id, h.score) for h in hits])
                        if not warm:
                            lat.setdefault((side, n, audit), []).append(elapsed)
                    assert got[0] == got[1], "both sides must answer alike"

    print(f"{args.queries} queries, each on both sides (ABBA), {args.users} users per scope size")
    print(f"{'scope rows':>10} {'audit':>5} | {'before p50':>10} {'p95':>7} {'p99':>7} | "
          f"{'after p50':>9} {'p95':>7} {'p99':>7} | {'p50 ratio':>9} {'p95 ratio':>9}")  # fmt: skip
    for n in SIZES:
        for audit in (True, False):
            b, a = lat[("before", n, audit)], lat[("after", n, audit)]
            pb = [float(np.percentile(b, q)) for q in (50, 95, 99)]
            pa = [float(np.percentile(a, q)) for q in (50, 95, 99)]
            print(f"{n:>10} {'on' if audit else 'off':>5} | {pb[0]:>10.3f} {pb[1]:>7.3f} "
                  f"{pb[2]:>7.3f} | {pa[0]:>9.3f} {pa[1]:>7.3f} {pa[2]:>7.3f} | "
                  f"{pb[0] / pa[0]:>8.2f}x {pb[1] / pa[1]:>8.2f}x")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="git ref whose read path is 'before'")
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--users", type=int, default=20, help="users per scope size")
    p.add_argument("--seed", type=int, default=5)
    args = p.parse_args()
    server = Server()
    try:
        print(server.info())
        with server.scratch("ab") as url:
            asyncio.run(run(url, args))
    finally:
        server.close()


if __name__ == "__main__":
    main()
