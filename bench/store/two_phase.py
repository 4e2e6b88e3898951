"""The two-phase path (binary codes or half vectors, then exact re-rank) against the exact
scan: recall vs oversampling, and latency vs scope size, through the store's own statements.

    python bench/store/two_phase.py                                  # USE, clustered, random
    python bench/store/two_phase.py --kinds use --sizes 1000,10000 --shortlists 60,120,160,240
    python bench/store/two_phase.py --kinds clustered,random --dims 384 --sizes 1000,10000,150000 --queries 200
    python bench/store/two_phase.py --json bench/results/two-phase.json

For each kind of vectors, one scratch database (created and dropped, on the embedded server
or PGMEMORY_DATABASE_URL) holds one user per scope size (plus 2,000 filler rows of 200 other
users, so the indexes hold other scopes too), imported with ``import_records`` and vacuumed.
``--queries`` queries per size (1,000 by default: a recall of 0.99 is then gated on 3,000
hits, not 300) are searched exactly, through the codes at each ``--shortlists`` size and
through the half vectors at each ``--halves`` size (rows re-ranked; columns ``codes N`` and
``halves N``), one after the other for each query so all see the same machine noise;
recall@k is against numpy brute force (float64) over the user's rows.

Kinds of vectors (512 d unless ``--dims``):

* ``use``: real sentence embeddings, Google's USE v3 (the default local embedder) of
  LongMemEval / LoCoMo texts, read from the embedding caches of bench/retrieval
  (``--embeddings``, SQLite files; none are computed here). Queries are held-out rows.
* ``minilm``: MiniLM (384 d, the other local embedder) of LoCoMo's turns, embedded here
  (about a minute); queries are held-out rows, so scopes reach about 4,800 rows.
* ``clustered``: bench/store/scale.py's synthetic data: normalise(topic centre + noise of norm
  0.8), a handful of Zipf-weighted topics per user; queries drawn the same way.
* ``random``: uniform on the sphere; queries too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from bench._common.scratch import Server
from bench._common.vectors import USE_CACHE, unit, use_vectors


def clustered(rng: Any, centres: np.ndarray, topics: np.ndarray, m: int) -> np.ndarray:
    """``m`` vectors as bench/store/scale.py draws a user's: Zipf-weighted topics, noise 0.8."""
    w = 1.0 / np.arange(1, len(topics) + 1)
    t = topics[rng.choice(len(topics), size=m, p=w / w.sum())]
    noise = rng.standard_normal((m, centres.shape[1])) * (0.8 / math.sqrt(centres.shape[1]))
    return unit(centres[t] + noise)


def minilm_vectors() -> np.ndarray:
    """MiniLM (384 d) embeddings of LoCoMo's distinct turns (about 5,900), embedded here."""
    import gzip

    from bench._common.paths import DATA
    from pgmemory.embedders.minilm import MiniLMEmbedder

    with gzip.open(DATA / "locomo10.json.gz") as f:
        conversations = json.load(f)
    texts: list[str] = []
    for conversation in conversations:
        for turns in conversation["conversation"].values():
            if isinstance(turns, list):
                texts += [t["text"] for t in turns if isinstance(t, dict) and t.get("text")]
    texts = list(dict.fromkeys(texts))
    embedder = MiniLMEmbedder()
    return unit(
        np.concatenate([embedder.embed_sync(texts[i : i + 256]) for i in range(0, len(texts), 256)])
    )


def draw(kind: str, sizes: list[int], queries: int, dims: int, rng: Any, use: Any) -> dict:
    """{size: (rows, queries)} for one kind."""
    out = {}
    if kind in ("use", "minilm"):
        pool = use[rng.permutation(len(use))]
        need = max(sizes) + queries
        if len(pool) < need:
            raise SystemExit(f"{len(pool)} {kind} vectors; {need} needed for {max(sizes)} rows")
        q = pool[:queries]
        for n in sizes:  # nested scopes of the same pool: the queries are held out of all
            out[n] = (pool[queries : queries + n], q)
        return out
    for n in sizes:
        if kind == "random":
            out[n] = (
                unit(rng.standard_normal((n, dims))),
                unit(rng.standard_normal((queries, dims))),
            )
            continue
        centres = unit(rng.standard_normal((512, dims)))
        topics = rng.choice(512, size=min(512, 2 + int(math.log2(n))), replace=False)
        out[n] = (clustered(rng, centres, topics, n), clustered(rng, centres, topics, queries))
    return out


def scoped_records(data: dict, seed: int) -> list[Any]:
    """One user per scope size (``user<n>``, contents ``<n>:<i>``) and 2,000 filler rows of 200
    other users, in a random order: each scope's rows scattered over the heap."""
    from pgmemory import MemoryRecord, MemoryScope

    rng = np.random.default_rng(seed)
    dims = len(next(iter(data.values()))[0][0])
    filler = unit(rng.standard_normal((2000, dims)))
    records = [
        MemoryRecord(content=f"f{i}", scope=MemoryScope(user_id=f"filler{i % 200}"),
                     role="user", embedding=filler[i])
        for i in range(len(filler))
    ]  # fmt: skip
    for n, (rows, _) in data.items():
        scope = MemoryScope(user_id=f"user{n}")
        records += [
            MemoryRecord(content=f"{n}:{i}", scope=scope, role="user", embedding=rows[i])
            for i in range(n)
        ]
    return [records[i] for i in rng.permutation(len(records))]


async def measure(db_url: str, kind: str, data: dict, args: argparse.Namespace) -> dict:
    import sqlalchemy as sa

    from pgmemory import MemoryScope, MemoryStore, Settings
    from pgmemory.store import reads
    from pgmemory.store.shortlist import Shortlist

    results: dict[str, Any] = {}
    if True:  # one store per kind
        settings = Settings(_env_file=None)  # type: ignore[call-arg]
        store = await MemoryStore(db_url, settings=settings).open()
        dims = len(next(iter(data.values()))[0][0])
        await store.create_collection("c", dimensions=dims, embedding_model="synthetic")
        records = scoped_records(data, args.seed + 1)
        t0 = time.perf_counter()
        await store.import_records("c", records)
        import_s = time.perf_counter() - t0
        async with store._db.ddl() as conn:
            await conn.execute(sa.text("VACUUM ANALYZE pgmemory_memories"))
        for n, (rows, queries) in data.items():
            scope = MemoryScope(user_id=f"user{n}")
            truth = np.argsort(-(queries.astype(np.float64) @ rows.astype(np.float64).T), axis=1)
            truth = truth[:, : args.k]
            lat: dict[str, list[float]] = {"exact": []}
            found: dict[str, int] = {}
            passes = [
                *(Shortlist("codes", n) for n in args.shortlists),
                *(Shortlist("halves", n) for n in args.halves),
            ]
            for j, v in enumerate(queries):
                for s in [None, *passes]:
                    key = "exact" if s is None else f"{s.first_pass} {s.rows}"
                    t0 = time.perf_counter()
                    hits = await reads.probe_search(
                        store._db, store._catalogue, store._ann, "c", scope, v, args.k, None, s
                    )
                    lat.setdefault(key, []).append(time.perf_counter() - t0)
                    got = {int(h.memory.content.split(":")[1]) for h in hits}
                    found[key] = found.get(key, 0) + len(got & set(truth[j].tolist()))
            total = len(queries) * args.k
            results[str(n)] = {
                key: {
                    "recall": found[key] / total,
                    "p50_ms": float(np.median(lat[key][20:]) * 1000),
                    "p95_ms": float(np.percentile(lat[key][20:], 95) * 1000),
                }
                for key in lat
            }
            line = " ".join(
                f"{k:>10}: {v['recall']:.4f} {v['p50_ms']:6.2f}ms"
                for k, v in results[str(n)].items()
            )
            print(f"{kind:<9} rows {n:>6} q {len(queries)} k {args.k} | {line}", flush=True)
        results["import_rows_per_s"] = len(records) / import_s
        await store.close()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kinds", default="use,clustered,random")
    p.add_argument("--sizes", default="1000,2000,5000,10000")
    p.add_argument("--shortlists", default="60,120,160,240,480", help="rows the codes keep")
    p.add_argument("--halves", default="20,40,80", help="rows the half vectors keep")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--dims", type=int, default=512)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--embeddings", default=str(USE_CACHE),
        help="comma-separated SQLite caches of bench/retrieval (USE vectors)",
    )  # fmt: skip
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    args.shortlists = [int(s) for s in args.shortlists.split(",") if s]
    args.halves = [int(s) for s in args.halves.split(",") if s]
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(args.seed)
    server = Server()
    print(server.info(), flush=True)
    out = {}
    try:
        for kind in args.kinds.split(","):
            paths = [Path(s) for s in args.embeddings.split(",")]
            use = (
                use_vectors(paths, args.dims)
                if kind == "use"
                else minilm_vectors()
                if kind == "minilm"
                else None
            )
            data = draw(kind, sizes, args.queries, args.dims, rng, use)
            with server.scratch(f"twophase_{kind}") as url:
                out[kind] = asyncio.run(measure(url, kind, data, args))
    finally:
        server.close()
    if args.json:
        args.json.write_text(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "json"}, "results": out}, indent=2, default=str))  # fmt: skip


if __name__ == "__main__":
    main()
