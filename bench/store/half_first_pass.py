"""A study: ``halfvec`` as the first pass of a large scope's vector search, beside the exact
scan and the binary codes' pass, recall against oversampling and latency against scope size.

    python bench/store/half_first_pass.py                       # USE, clustered, random
    python bench/store/half_first_pass.py --kinds random --sizes 150000 --queries 200
    python bench/store/half_first_pass.py --json bench/results/half-first-pass.json

Nothing of it is in the library: on a scratch database (pgmemory's schema, one user per scope
size beside 2,000 filler rows of 200 users, imported with ``import_records`` and vacuumed) it
adds what the path would need, a stored generated column ``embedding_half`` =
``CAST(l2_normalize(embedding) AS halfvec)`` and a covering index on ``(collection, user_id)
INCLUDE (id, expires_at, embedding_half)``. Then, for each query, on one psycopg connection
(prepared, ``plan_cache_mode = force_generic_plan`` as the store runs its statements), one
after the other so that the same machine noise hits all:

* ``exact``: the covering scan of the full vectors, top-k by cosine distance;
* ``codes M``: the binary codes' pass (Hamming distance to the query's code, which is worked
  out once) keeping M rows, re-ranked by exact cosine distance from the full vectors;
* ``half M``: the ``halfvec`` pass (inner product of the normalised halves, sent as a
  ``halfvec`` parameter) keeping M rows, re-ranked the same way.

Recall@k is against numpy brute force (float64) over the scope's rows. Kinds of vectors as in
``bench/store/two_phase.py`` (``use``, ``minilm``, ``clustered``, ``random``), whose
loaders this reuses; USE's cached embeddings give scopes of up to about 14,000 rows.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from bench._common.paths import CACHE
from bench._common.scratch import Server
from bench.store.two_phase import draw, minilm_vectors, scoped_records, use_vectors

#: What the path would add to the schema (scratch only).
HALF_DDL = (
    "ALTER TABLE pgmemory_memories ADD COLUMN embedding_half halfvec"
    " GENERATED ALWAYS AS (CAST(l2_normalize(embedding) AS halfvec)) STORED",
    "CREATE INDEX ix_study_half ON pgmemory_memories (collection, user_id)"
    " INCLUDE (id, expires_at, embedding_half)",
    "VACUUM ANALYZE pgmemory_memories",
)
_SCOPE = """m.collection = %(c)s AND m.user_id = %(u)s
      AND (m.expires_at IS NULL OR m.expires_at > now())"""
EXACT = f"""SELECT m.id FROM pgmemory_memories AS m
    WHERE {_SCOPE} AND vector_dims(m.embedding) <= 512
    ORDER BY (m.embedding <=> %(q)s) + 0, m.id LIMIT %(k)s"""
_RERANK = """{first},
ranked AS (
    SELECT r.id, r.distance FROM first AS f CROSS JOIN LATERAL (
        SELECT m.id, (m.embedding <=> %(q)s) + 0 AS distance FROM pgmemory_memories AS m
        WHERE m.id = f.id AND m.user_id = %(u)s AND m.collection = %(c)s OFFSET 0) AS r
)
SELECT id FROM ranked ORDER BY distance, id LIMIT %(k)s"""
CODES = _RERANK.format(
    first=f"""WITH first AS MATERIALIZED (
    SELECT m.id FROM pgmemory_memories AS m WHERE {_SCOPE}
    ORDER BY m.embedding_code <~> (SELECT binary_quantize(CAST(%(q)s AS vector))), m.id
    LIMIT %(m)s)"""
)
HALF = _RERANK.format(
    first=f"""WITH first AS MATERIALIZED (
    SELECT m.id FROM pgmemory_memories AS m WHERE {_SCOPE}
    ORDER BY m.embedding_half <#> %(h)s, m.id
    LIMIT %(m)s)"""
)


async def seed(url: str, data: dict, seed_: int) -> None:
    from pgmemory import MemoryStore, Settings

    dims = len(next(iter(data.values()))[0][0])
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(url, settings=settings) as store:
        await store.create_collection("c", dimensions=dims, embedding_model="synthetic")
        await store.import_records("c", scoped_records(data, seed_))


def measure(url: str, kind: str, data: dict, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg
    from pgvector import HalfVector
    from pgvector.psycopg import register_vector

    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    out: dict[str, Any] = {}
    with psycopg.connect(libpq, autocommit=True) as conn:
        register_vector(conn)
        t0 = time.perf_counter()
        for ddl in HALF_DDL:
            conn.execute(ddl)
        out["half_column_and_index_s"] = time.perf_counter() - t0
        conn.execute("SET plan_cache_mode = force_generic_plan")
        passes = [("exact", EXACT, 0)]
        passes += [(f"codes {m}", CODES, m) for m in args.codes]
        passes += [(f"half {m}", HALF, m) for m in args.half]
        for n, (rows, queries) in data.items():
            user = f"user{n}"
            ids = {
                row_id: int(content.split(":")[1])
                for row_id, content in conn.execute(
                    "SELECT id, content FROM pgmemory_memories WHERE user_id = %s", (user,)
                )
            }
            truth = np.argsort(-(queries.astype(np.float64) @ rows.astype(np.float64).T), axis=1)
            lat: dict[str, list[float]] = {name: [] for name, _, _ in passes}
            found = dict.fromkeys(lat, 0)
            for j, v in enumerate(queries):
                values = {"c": "c", "u": user, "q": v, "h": HalfVector(v), "k": args.k}
                want = set(truth[j, : args.k].tolist())
                for name, statement, m in passes:
                    t = time.perf_counter()
                    got = conn.execute(statement, {**values, "m": m}, prepare=True).fetchall()
                    lat[name].append(time.perf_counter() - t)
                    found[name] += len({ids[g[0]] for g in got} & want)
            total = len(queries) * args.k
            out[str(n)] = {
                name: {
                    "recall": found[name] / total,
                    "p50_ms": statistics.median(lat[name][10:]) * 1000,
                    "p95_ms": float(np.percentile(lat[name][10:], 95)) * 1000,
                }
                for name in lat
            }
            line = " ".join(
                f"{name}: {f['recall']:.4f} {f['p50_ms']:.2f}ms" for name, f in out[str(n)].items()
            )
            print(f"{kind:<9} rows {n:>6} q {len(queries)} | {line}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default="use,clustered,random")
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--codes", default="160", help="rows the codes' pass keeps (comma-separated)")
    p.add_argument("--half", default="20,40,80", help="rows the halfvec pass keeps")
    p.add_argument("--dims", type=int, default=512, help="for clustered and random vectors")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--embeddings", default=str(CACHE / "embeddings.sqlite"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    args.codes = [int(s) for s in args.codes.split(",") if s]
    args.half = [int(s) for s in args.half.split(",") if s]
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(args.seed)
    server = Server()
    print(server.info(), flush=True)
    results: dict[str, Any] = {"server": server.info(), "k": args.k, "kinds": {}}
    try:
        for kind in args.kinds.split(","):
            use = None
            if kind == "use":
                use = use_vectors([Path(s) for s in args.embeddings.split(",")], 512)
            elif kind == "minilm":
                use = minilm_vectors()
            data = draw(kind, sizes, args.queries, args.dims, rng, use)
            with server.scratch(f"half_{kind}") as url:
                asyncio.run(seed(url, data, args.seed + 1))
                results["kinds"][kind] = measure(url, kind, data, args)
    finally:
        server.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
