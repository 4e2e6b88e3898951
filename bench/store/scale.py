"""Scale benchmark: bulk import, scoped top-3 recall per scope size, memory turns, concurrency.

    python bench/store/scale.py --rows 100000                       # ~1-2 min on 2 cores
    python bench/store/scale.py --rows 1000000                      # the 1M run (see bench/README.md)
    python bench/store/scale.py --rows 100000 --peers langchain-pgvector,langgraph --peer-rows 20000
    python bench/store/scale.py --rows 100000 --hnsw                # + before/after store.enable_ann()
    python bench/store/scale.py --rows 1000000 --ann ivfflat        # the same with an IVFFlat index
    python bench/store/scale.py --rows 1000000 --ann ivfflat --half-vectors   # + the opt-in halves
    python bench/store/scale.py --rows 100000 --json bench/results/scale-100k.json
    python bench/store/scale.py --rows 20000 --vectors use --peers langgraph,mem0   # real embeddings
    python bench/store/scale.py --rows 100000 --partitions 16   # + the same, memories hash-partitioned
    python bench/store/scale.py --rows 100000 --partitions 16 --partitioned-first   # the other order

Data (precomputed with numpy from ``--seed``, cached under bench/.cache/, so embedding time is
excluded and every system reads the very same vectors):

* ``--users`` (10,000) users; every user gets 1 row, and the other rows - U are shared
  Zipf-wise: the user of rank r gets a share proportional to r**-s (``--zipf-s``, default
  1.1), rounding remainder to rank 1. Why s = 1.1 and not 1.0: the top user's share is
  1/H(U, s). With s = 1.0 and 10,000 users that is 1/9.79 = 10.2 %, ~9,200 of the 90,000
  shared rows at 100k: no user above 10k, so no ``huge`` bucket. With s = 1.1 it is 15.1 %
  (~13,600 of the shared rows at 100k), plus the flooring remainder (~5,600 rows at 100k,
  since most tail users' shares round down to 0): the top user has 19,195 rows at 100k, so
  the ``huge`` bucket (> 10k rows) is never empty from ~60k rows up. At 100k the split is
  small 9,913 / mid 77 / heavy 9 / huge 1 users (37k / 21k / 23k / 19k rows); the
  "users per bucket" line printed first gives the actual split of any run.
* Realistic clustered vectors: 512 global topic centres; each user talks about a handful of
  them (more topics for heavier users, Zipf-weighted); a row is
  normalise(centre + noise) with noise of norm ~0.8, so neighbours are near but not trivial.
* ``--vectors use`` instead: real sentence embeddings (USE, 512 d) of the LongMemEval and LoCoMo
  texts that ``bench/retrieval`` cached (about 21,000), each row a different text, drawn at
  random (a user's rows are not one conversation); queries and turns use the held-out rest.
  Binary codes keep such vectors' neighbours (docs/performance.md), so large scopes take the
  two-phase path by default; the synthetic vectors, nearly random within a topic, defeat them.
* Rows are interleaved in time: the multiset of user ids is shuffled, row i is created at
  T0 + 6 s * i, and imported in that order (a user's rows are scattered over the heap).
* Queries: ``--queries`` per bucket, each a fresh vector on one of the user's topics; the
  ground truth is exact top-3 by numpy brute force (float64) over that user's rows.
* Turns: users drawn proportional to their row count (busy users talk more); a turn is a
  scoped top-3 search, then ``store.add`` of 2 records (the user message and the reply) in one
  transaction. ``--turns`` run one after another, then 8 sessions (asyncio tasks over one
  store whose pool holds >= 8 connections) run ``--session-turns`` each: turns/s is their
  total over the wall time.

``--half-vectors`` adds the opt-in half vectors (``Admin.add_half_vectors``, what ``pgmemory db
half-vectors`` runs) to the empty schema before the import, as an operator whose probe log
says the codes fail on the data (as on these vectors) would: the import then pays for them,
and large scopes take that first pass from the collection's first probe (its 100th search).

pgmemory is measured through its public API only (``import_records`` with binary COPY,
``search`` with its defaults - audit on -, ``add``). Runs on a scratch database (created and
dropped) of the embedded server, or of the server PGMEMORY_DATABASE_URL points at. Its recall
queries run three times before the turns add rows (so the ground truth holds for all three):
audit on (the main columns), audit off, audit on again (how far the two audited passes differ
is the machine's noise). ``--ann``'s (``--hnsw``'s) exact and approximate passes run after the turns,
against the truth recomputed over the imported rows plus the turns' rows; then the same turns
run once more on the path (``--ann-build-memory`` sizes the build), and one recall probe of the
path is timed (the searches make one due at most once a minute and run it beside them). Start-up: medians
over 5 fresh processes of ``import pgmemory``, then of importing ``MemoryStore``, opening a
store on the loaded database, and its first and second recall (bench/store/_startup.py). With peers,
pgmemory is measured before and again after them, and each ratio is printed against both.

Peers (``--peers``, default none): each runs in its OWN venv under bench/.peers/<name>/
(created and filled by this script with pip on first use), as a subprocess that reads the same
cached .npz, on its own scratch database of the same server, through the same measurement loop
(bench/peers/_harness.py). ``--peer-rows N`` gives peers a smaller data set (drawn the same
way); pgmemory is then measured again on that same data so each ratio compares like with like.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from bench._common.paths import BENCH, CACHE, PEER_ENVS
from bench._common.vectors import USE_CACHE, use_vectors
from bench.peers import _harness as h

N_TOPICS = 512
NOISE_NORM = 0.8

#: name -> (module under bench/peers/, pip requirements of its own venv, label)
PEERS: dict[str, tuple[str, list[str], str]] = {
    "langchain-pgvector": (
        "langchain_pgvector.py",
        ["langchain-postgres==0.0.19", "numpy", "psycopg[binary]", "tqdm"],
        "langchain-postgres PGVector",
    ),
    "langchain-pgvectorstore": (
        "langchain_pgvectorstore.py",
        ["langchain-postgres==0.0.19", "numpy", "psycopg[binary]", "tqdm"],
        "langchain-postgres PGVectorStore",
    ),
    "langgraph": (
        "langgraph_store.py",
        ["langgraph-checkpoint-postgres==3.2.0", "langgraph", "numpy", "psycopg[binary]",
         "psycopg-pool", "tqdm"],
        "LangGraph PostgresStore",
    ),
    "agent-framework": (
        "agent_framework_pg.py",
        ["agent-framework-postgres==1.0.0a261015", "numpy", "psycopg[binary]", "tqdm"],
        "agent-framework-postgres PostgresCollection",
    ),
    "mem0": (
        "mem0_pg.py",
        ["mem0ai==2.2.1", "langchain>=0.3.30,<1.0.0", "numpy", "psycopg[binary]", "psycopg-pool",
         "tqdm"],
        "mem0 (pgvector, infer=False)",
    ),
}  # fmt: skip
#: Peers registered but without a module yet, and why (printed instead of figures).
NOT_RUN: dict[str, str] = {}
#: Venv directory per peer (the two langchain-postgres vector stores share one).
PEER_ENV = {"langchain-pgvector": "langchain", "langchain-pgvectorstore": "langchain"}


# --- data --------------------------------------------------------------------------------------


def zipf_counts(rows: int, users: int, s: float) -> np.ndarray:
    """Rows per user (user 0 is the heaviest): share ~ rank**-s, >= 1 each, sums to ``rows``."""
    if rows < users:
        raise SystemExit(f"--rows ({rows}) must be >= --users ({users}): every user has a row")
    w = np.arange(1, users + 1, dtype=np.float64) ** -s
    counts = 1 + np.floor((rows - users) * w / w.sum()).astype(np.int64)
    counts[0] += rows - counts.sum()  # rounding remainder on the top user
    assert counts.sum() == rows and counts.min() >= 1
    return counts


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_data(args: argparse.Namespace, rows: int) -> Path:
    """Draw (or reuse from the cache) the data set of ``rows`` rows; returns the .npz path."""
    sessions = 8
    n_turns = args.turns + sessions * args.session_turns
    key = dict(rows=rows, dims=args.dims, users=args.users, s=args.zipf_s, seed=args.seed,
               queries=args.queries, turns=n_turns, v=2)  # fmt: skip
    if args.vectors != "clustered":  # (the synthetic draws keep their cached files' names)
        key["vectors"] = args.vectors
    tag = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    path = CACHE / f"scale-{rows}x{args.dims}-{tag}.npz"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm

    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    d = args.dims
    counts = zipf_counts(rows, args.users, args.zipf_s)
    centres = unit(rng.standard_normal((N_TOPICS, d), dtype=np.float32))
    # each user's topics: 2 + log2(rows) of them, weighted ~ 1/rank
    user_topics = [
        rng.choice(N_TOPICS, size=min(N_TOPICS, 2 + int(math.log2(c))), replace=False)
        for c in counts
    ]

    def draw_topic(u: int, n: int) -> np.ndarray:
        tp = user_topics[u]
        w = 1.0 / np.arange(1, len(tp) + 1)
        return tp[rng.choice(len(tp), size=n, p=w / w.sum())]

    if args.vectors == "use":
        # Real sentence embeddings: the stored rows are a random draw of the cached vectors, and
        # every query or turn vector is one of the others (held out), drawn with replacement.
        pool = rng.permutation(use_vectors([USE_CACHE], d))
        if len(pool) < rows + 1_000:
            raise SystemExit(
                f"--vectors use: {len(pool)} cached USE vectors hold at most "
                f"{len(pool) - 1_000} rows (1,000 kept for queries); pass --rows at most that"
            )
        held_out = pool[rows:]

        def draw_vectors(topics: np.ndarray) -> np.ndarray:
            return held_out[rng.integers(0, len(held_out), size=len(topics))]

    else:

        def draw_vectors(topics: np.ndarray) -> np.ndarray:
            noise = rng.standard_normal((len(topics), d), dtype=np.float32)
            noise *= NOISE_NORM / math.sqrt(d)
            return unit(centres[topics] + noise)

    user = rng.permutation(np.repeat(np.arange(args.users, dtype=np.int32), counts))
    topic = np.empty(rows, dtype=np.int32)
    order = np.argsort(user, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    for u in range(args.users):
        topic[order[starts[u] : starts[u + 1]]] = draw_topic(u, int(counts[u]))
    if args.vectors == "use":
        vectors = pool[:rows]
    else:
        vectors = np.empty((rows, d), dtype=np.float32)
        step = 50_000
        for a in tqdm(range(0, rows, step), desc="draw vectors", unit="chunk", leave=False):
            vectors[a : a + step] = draw_vectors(topic[a : a + step])
    seconds = np.arange(rows, dtype=np.int64) * 6

    # recall queries: --queries per bucket, users without replacement while there are enough
    buckets = np.array([h.BUCKETS.index(h.bucket_of(int(c))) for c in counts], dtype=np.int8)
    q_user, q_bucket = [], []
    for b in range(len(h.BUCKETS)):
        members = np.flatnonzero(buckets == b)
        if len(members) == 0:
            continue
        pick = rng.choice(members, size=args.queries, replace=len(members) < args.queries)
        q_user += list(pick)
        q_bucket += [b] * args.queries
    q_user_a = np.array(q_user, dtype=np.int32)
    q_vec = draw_vectors(np.array([draw_topic(u, 1)[0] for u in q_user_a]))
    gt = np.empty((len(q_user_a), 3), dtype=np.int64)
    for j, u in enumerate(q_user_a):
        mine = order[starts[u] : starts[u + 1]]
        scores = vectors[mine].astype(np.float64) @ q_vec[j].astype(np.float64)
        top = np.argsort(-scores, kind="stable")[:3]
        gt[j, : len(top)] = mine[top]
        gt[j, len(top) :] = -1

    # turns: users proportional to their rows
    t_user = user[rng.integers(0, rows, size=n_turns)]
    t_vec = draw_vectors(np.array([draw_topic(int(u), 1)[0] for u in t_user]))
    t_new = draw_vectors(np.concatenate([draw_topic(int(u), 2) for u in t_user])).reshape(
        n_turns, 2, d
    )
    meta = dict(key, vectors=args.vectors, n_topics=N_TOPICS, noise_norm=NOISE_NORM,
                top_user_rows=int(counts[0]),
                users_per_bucket={b: int((buckets == i).sum()) for i, b in enumerate(h.BUCKETS)},
                rows_per_bucket={b: int(counts[buckets == i].sum()) for i, b in enumerate(h.BUCKETS)},
                draw_s=round(time.perf_counter() - t0, 1))  # fmt: skip
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, vectors=vectors, user=user, topic=topic, seconds=seconds, user_rows=counts,
             q_user=q_user_a, q_vec=q_vec, q_bucket=np.array(q_bucket, dtype=np.int8), gt=gt,
             t_user=t_user.astype(np.int32), t_vec=t_vec, t_new=t_new,
             meta=np.array(json.dumps(meta)))  # fmt: skip
    tmp.rename(path)
    return path


# --- servers and scratch databases -------------------------------------------------------------


# Server (the embedded server or PGMEMORY_DATABASE_URL's, and scratch databases on it) is
# bench/_common/scratch.py's, shared by every benchmark.
from bench._common.scratch import Server  # noqa: E402
from pgmemory.store.ann import ANN_EF_SEARCH, ANN_METHODS, ANN_MIN_SCOPE_ROWS  # noqa: E402

# --- pgmemory adapter --------------------------------------------------------------------------


class PgmemoryAdapter:
    collection = "scale"
    import_how = "store.import_records, binary COPY, one transaction"

    def __init__(self, url: str, data: h.Data) -> None:
        self.url = url
        self.data = data
        self.audit = True  # the library default

    async def setup(self) -> None:
        from pgmemory import MemoryStore, Settings

        settings = Settings(_env_file=None, pool_size=8, max_overflow=2)  # type: ignore[call-arg]
        self.store = await MemoryStore(self.url, settings=settings).open()
        await self.store.create_collection(
            self.collection, dimensions=self.data.dims, embedding_model="synthetic"
        )

    async def import_rows(self, data: h.Data, progress: bool) -> None:
        from pgmemory import MemoryRecord, MemoryScope

        scopes = {}

        def records() -> Any:
            for i in range(data.rows):
                u = int(data.user[i])
                scope = scopes.get(u) or scopes.setdefault(u, MemoryScope(user_id=h.user_name(u)))
                yield MemoryRecord(
                    content=data.text(i), scope=scope, role="user",
                    embedding=data.vectors[i], created_at=data.created_at(i),
                )  # fmt: skip

        await self.store.import_records(self.collection, records(), progress=progress)

    async def after_import(self) -> None:
        await h.vacuum_analyze(self.url)

    async def search(self, user: str, vector: np.ndarray, k: int) -> list[int]:
        from pgmemory import MemoryScope

        hits = await self.store.search(
            self.collection, MemoryScope(user_id=user), vector=vector, limit=k, audit=self.audit
        )
        return [h.row_index(hit.memory.content) for hit in hits]

    async def add(self, user: str, vectors: np.ndarray, texts: list[str]) -> None:
        from pgmemory import MemoryRecord, MemoryScope

        scope = MemoryScope(user_id=user)
        await self.store.add(
            self.collection,
            [
                MemoryRecord(content=texts[0], scope=scope, role="user", embedding=vectors[0]),
                MemoryRecord(content=texts[1], scope=scope, role="assistant", embedding=vectors[1]),
            ],
        )

    async def close(self) -> None:
        await self.store.close()


# --- peers -------------------------------------------------------------------------------------


def ensure_peer_env(name: str) -> Path:
    """Create bench/.peers/<env>/ and pip-install the peer's requirements (once)."""
    env = PEER_ENVS / PEER_ENV.get(name, name)
    python = env / "bin" / "python"
    reqs = PEERS[name][1]
    stamp = env / ".installed"
    want = "\n".join(sorted(reqs))
    if python.exists() and stamp.exists() and stamp.read_text() == want:
        return python
    PEER_ENVS.mkdir(parents=True, exist_ok=True)
    print(f"  creating venv {env.relative_to(BENCH.parent)} and installing {' '.join(reqs)} ...",
          flush=True)  # fmt: skip
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs],
        check=True,
    )
    stamp.write_text(want)
    return python


def run_peer(name: str, server: Server, data_path: Path, args: argparse.Namespace) -> dict:
    module, _, _label = PEERS[name]
    if not (BENCH / "peers" / module).exists():
        return {
            "status": "not run",
            "error": NOT_RUN.get(name, f"bench/peers/{module} not written"),
        }
    try:
        python = ensure_peer_env(name)
    except subprocess.CalledProcessError as exc:
        return {"status": "failed", "error": f"pip install failed: {exc}"}
    out = CACHE / f"peer-{name}-{uuid.uuid4().hex[:6]}.json"
    with server.scratch(name, pgmemory_schema=False) as url:
        cmd = [str(python), str(BENCH / "peers" / module), str(data_path), url, str(out),
               str(args.turns)] + ([] if args.progress else ["--quiet"])  # fmt: skip
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, timeout=args.peer_timeout)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "error": f"timed out after {args.peer_timeout} s"}
        wall = time.perf_counter() - t
    if not out.exists():
        return {"status": "failed", "error": f"exit code {proc.returncode}, no figures written"}
    figures = json.loads(out.read_text())
    out.unlink()
    figures["wall_s"] = wall
    return figures


# --- output ------------------------------------------------------------------------------------


def fmt(x: Any, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def print_main(label: str, r: dict, meta: dict) -> None:
    print(f"\n{label}: {r['rows']:,} rows x {r['dims']} d, {meta['users']:,} users "
          f"(Zipf s={meta['s']}, top user {meta['top_user_rows']:,} rows)")  # fmt: skip
    if "import_rows_per_s" in r:
        print(f"bulk import ({r.get('import_how', '?')}): "
              f"{r['import_rows_per_s']:,.0f} rows/s ({r['import_s']:.1f} s), "
              f"then VACUUM ANALYZE {r['analyze_s']:.1f} s")  # fmt: skip
    off, again = r.get("audit_off", {}), r.get("audit_on_again", {})
    print(f"{'bucket':<7} {'users':>6} {'scope rows med/max':>19} {'queries':>7} "
          f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'recall@3':>8} {'µs/row p50':>10}"
          + (f" | audit off: {'p50':>6} {'p95':>6} {'r@3':>5} | audit on again: {'p50':>6} "
             f"{'p95':>6}" if off else ""))  # fmt: skip
    for b in h.BUCKETS:
        if b not in r:
            print(f"{b:<7} (no user of this size in the data)")
            continue
        x = r[b]
        per_row = x["recall_p50_ms"] * 1000 / max(1, x["scope_rows_median"])
        print(f"{b:<7} {meta['users_per_bucket'][b]:>6,} "
              f"{str(x['scope_rows_median']) + ' / ' + str(x['scope_rows_max']):>19} "
              f"{x['queries']:>7} {x['recall_p50_ms']:>8.2f} {x['recall_p95_ms']:>8.2f} "
              f"{x['recall_p99_ms']:>8.2f} {x['recall_at_3']:>8.3f} {per_row:>10.2f}"
              + (f" | {'':>10} {off[b]['recall_p50_ms']:>6.2f} {off[b]['recall_p95_ms']:>6.2f} "
                 f"{off[b]['recall_at_3']:>5.3f} | {'':>15} {again[b]['recall_p50_ms']:>6.2f} "
                 f"{again[b]['recall_p95_ms']:>6.2f}" if b in off else ""))  # fmt: skip
    print(f"memory turn (search top-3, then add 2 records in one transaction), {r['turns']} "
          f"sequential: p50 {r['turn_p50_ms']:.2f} ms, p95 {r['turn_p95_ms']:.2f} ms")  # fmt: skip
    print(f"8 concurrent sessions, {r['concurrent_turns']} turns: {r['turns_per_s_8']:,.0f} "
          f"turns/s (turn p50 {r['turn_p50_ms_8']:.2f} ms, p95 {r['turn_p95_ms_8']:.2f} ms)")  # fmt: skip
    if "startup" in r:
        s = r["startup"]
        print(f"start-up, median of 5 fresh processes: import pgmemory {s['import_import_s'] * 1000:.0f} ms; "
              f"then MemoryStore imported {s['recall_store_import_s'] * 1000:.0f} ms, "
              f"opened {s['recall_open_s'] * 1000:.0f} ms, first recall "
              f"{s['recall_first_recall_s'] * 1000:.1f} ms, second {s['recall_second_recall_s'] * 1000:.2f} ms")  # fmt: skip


def print_partitioned(plain: dict, parted: dict, partitions: int) -> None:
    """One table: the plain memories table beside the hash-partitioned one (same run, data)."""
    print(f"\nplain table vs {partitions} hash partitions by user_id (same data, same run):")
    rows = [
        ("import rows/s", plain["import_rows_per_s"], parted["import_rows_per_s"], ",.0f"),
        ("VACUUM ANALYZE s", plain["analyze_s"], parted["analyze_s"], ".2f"),
        *[
            (
                f"{b} recall p{q} ms",
                plain[b][f"recall_p{q}_ms"],
                parted[b][f"recall_p{q}_ms"],
                ".2f",
            )
            for b in h.BUCKETS
            if b in plain and b in parted
            for q in (50, 95)
        ],
        ("turn p50 ms", plain["turn_p50_ms"], parted["turn_p50_ms"], ".2f"),
        ("turns/s, 8 sessions", plain["turns_per_s_8"], parted["turns_per_s_8"], ",.0f"),
    ]
    print(f"{'figure':<22} {'plain':>10} {'partitioned':>12} {'ratio':>7}")
    for name, a, b, spec in rows:
        print(f"{name:<22} {fmt(a, spec):>10} {fmt(b, spec):>12} {fmt(b / a if a else None):>7}")


def print_ann(r: dict) -> None:
    """Before/after table of store.enable_ann (the approximate path for large scopes)."""
    ann = r["ann"]
    print(f"\nlarge scopes: store.enable_ann() built and probed the {ann['status']['method']} index in "
          f"{ann['build_and_probe_s']:.1f} s -> {ann['status']}")  # fmt: skip
    print(
        "(both passes audit off, on the rows after the turns, against the truth recomputed over them)"
    )
    print(f"{'bucket':<7} {'exact p50':>10} {'p95':>8} {'recall@3':>8} | {'after p50':>10} {'p95':>8} "
          f"{'recall@3':>8}")  # fmt: skip
    for b in h.BUCKETS:
        if b in ann["exact"] and b in ann["recall"]:
            x, y = ann["exact"][b], ann["recall"][b]
            print(f"{b:<7} {x['recall_p50_ms']:>10.2f} {x['recall_p95_ms']:>8.2f} {x['recall_at_3']:>8.3f} | "
                  f"{y['recall_p50_ms']:>10.2f} {y['recall_p95_ms']:>8.2f} {y['recall_at_3']:>8.3f}")  # fmt: skip
    if "turns" in ann:
        t, x = ann["turns"], r
        print("memory turns (audit on) exact, before enable_ann | on the path, after it (the same "
              "turns once more)")  # fmt: skip
        for k in ("turn_p50_ms", "turn_p95_ms", "turns_per_s_8", "turn_p50_ms_8", "turn_p95_ms_8"):
            print(f"  {k:<16} {x[k]:>10.2f} | {t[k]:>10.2f}")
    if "probe_s" in ann:
        print(f"one recall probe of the path: {ann['probe_s']:.1f} s (searches make one due at "
              "most once a minute, run beside them)")  # fmt: skip


def print_peer(label: str, mine: dict, peer: dict, note: str) -> None:
    print(f"\n{label} vs pgmemory {note}")
    if peer.get("status") != "ok":
        print(f"  NOT MEASURED: {peer.get('error')}")
        return
    print(f"  {'figure':<34} {'pgmemory':>16} {'peer':>16} {'pgmemory/peer':>13}")

    def line(name: str, a: Any, b: Any, better: str, ra: Any = None, rb: Any = None) -> None:
        if a is None or b is None:
            return
        sa = f"{a:,.2f}" if ra is None else f"{a:,.2f} (r {ra:.3f})"
        sb = f"{b:,.2f}" if rb is None else f"{b:,.2f} (r {rb:.3f})"
        ratio = a / b if b else float("nan")
        print(f"  {name:<34} {sa:>16} {sb:>16} {ratio:>13.3f}  {better}")

    line("import rows/s", mine.get("import_rows_per_s"), peer.get("import_rows_per_s"),
         "higher is better")  # fmt: skip
    for b in h.BUCKETS:
        x, y = mine.get(b), peer.get(b)
        if not x or not y:
            continue
        for p in ("p50", "p95"):
            line(f"{b} recall {p} ms (recall@3)", x[f"recall_{p}_ms"], y[f"recall_{p}_ms"],
                 "lower is better", x["recall_at_3"], y["recall_at_3"])  # fmt: skip
    line("turn p50 ms", mine["turn_p50_ms"], peer.get("turn_p50_ms"), "lower is better")
    line("turn p95 ms", mine["turn_p95_ms"], peer.get("turn_p95_ms"), "lower is better")
    line("turns/s, 8 sessions", mine["turns_per_s_8"], peer.get("turns_per_s_8"),
         "higher is better")  # fmt: skip


def json_figures(r: dict) -> dict:
    keep = {k: r[k] for k in ("import_rows_per_s", "turn_p50_ms", "turn_p95_ms", "turns_per_s_8",
                              "startup") if k in r}  # fmt: skip
    for b in h.BUCKETS:
        if b in r:
            keep[b] = {k: r[b][k] for k in ("recall_p50_ms", "recall_p95_ms", "recall_p99_ms",
                                            "recall_at_3", "queries", "scope_rows_median")}  # fmt: skip
    return keep


# --- main --------------------------------------------------------------------------------------


def as_operator(url: str, step: Callable[[Any], Awaitable[object]]) -> None:
    """Run one admin step on the scratch database's schema, as an operator would: ``step``
    gets an ``Admin`` over a store on ``url`` (what the ``pgmemory db ...`` commands run)."""

    from pgmemory import Admin, MemoryStore, Settings

    async def run() -> None:
        async with MemoryStore(url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
            await step(Admin(store))

    asyncio.run(run())


async def _partition(admin: Any, partitions: int) -> None:
    """``pgmemory db partition --partitions N``: the empty memories table hash-partitioned."""
    report = await admin.partition_memories(partitions=partitions)
    assert report.partitions == partitions, report


async def _add_half_vectors(admin: Any) -> None:
    """``pgmemory db half-vectors``: the opt-in half vectors added to the schema."""
    assert (await admin.add_half_vectors()).added


def measure_pgmemory(
    server: Server,
    data_path: Path,
    args: argparse.Namespace,
    ann: str | None,
    partitions: int = 0,
) -> dict:
    data = h.load(data_path)
    with server.scratch("pgm", pgmemory_schema=True) as url:
        if partitions:
            as_operator(url, lambda admin: _partition(admin, partitions))
        if args.half_vectors:
            as_operator(url, _add_half_vectors)
        adapter = PgmemoryAdapter(url, data)

        async def before_turns(a: PgmemoryAdapter) -> dict[str, Any]:
            # Before the turns add rows (the truth holds): the same recall queries with
            # audit=False, then with the audit on once more, so machine noise shows as the
            # difference between the two audited passes.
            a.audit = False
            off = await h.recall_pass(a, data, args.progress)
            a.audit = True
            return {"audit_off": off, "audit_on_again": await h.recall_pass(a, data, args.progress)}

        async def extra(a: PgmemoryAdapter, truth: np.ndarray) -> dict[str, Any]:
            more: dict[str, Any] = {}
            if ann:
                # The library's approximate path for large scopes (store.enable_ann): the same
                # queries exactly, then on the path (audit off both times), on the rows the
                # turns left, against the truth recomputed over those rows.
                a.audit = False
                exact = await h.recall_pass(a, data, args.progress, truth)
                t = time.perf_counter()
                status = await a.store.enable_ann(
                    a.collection,
                    maintenance_work_mem=args.ann_build_memory,
                    ef_search=args.ann_ef_search,
                    method=ann,
                    min_scope_rows=args.ann_min_scope_rows,
                )
                more["ann"] = {
                    "build_and_probe_s": time.perf_counter() - t,
                    "status": {
                        k: getattr(status, k)
                        for k in (
                            "enabled",
                            "recall",
                            "probed_scopes",
                            "min_scope_rows",
                            "ef_search",
                            "method",
                            "probes",
                        )
                    },
                    "exact": exact,
                    "recall": await h.recall_pass(a, data, args.progress, truth),
                }
                a.audit = True
                # the memory turns again (audit on, as in use), now with the large scopes on
                # the path and every insert maintaining the index
                turns = await h.turn_passes(
                    a, data, sequential_turns=args.turns, progress=args.progress
                )
                turns.pop("ran")
                more["ann"]["turns"] = turns
                # what one recall probe costs (searches make one due at most once a minute,
                # run beside them: none may have fallen within the turns above)
                t = time.perf_counter()
                await a.store.probe_ann(a.collection)
                more["ann"]["probe_s"] = time.perf_counter() - t
            return more

        figures = asyncio.run(h.measure(adapter, data, sequential_turns=args.turns,
                                        progress=args.progress, before_turns=before_turns,
                                        extra=extra))  # fmt: skip
        figures["startup"] = startup(url, data_path)
        return figures


def startup(url: str, data_path: Path, runs: int = 5) -> dict[str, float]:
    """Medians over ``runs`` fresh processes: ``import pgmemory``, then (on the loaded
    database) opening a store, its first scoped top-3 recall and its second."""
    probe = [sys.executable, str(Path(__file__).resolve().parent / "_startup.py")]
    small = int(np.flatnonzero(h.load(data_path).q_bucket == h.BUCKETS.index("small"))[0])
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        for cmd in ([*probe, "import"], [*probe, "recall", url, str(data_path), str(small)]):
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            for key, value in json.loads(out.splitlines()[-1]).items():
                samples.setdefault(f"{cmd[2]}_{key}", []).append(value)
    return {key: float(np.median(values)) for key, values in samples.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument(
        "--vectors", choices=("clustered", "use"), default="clustered",
        help="clustered: synthetic topics (default); use: real USE sentence embeddings of the "
        "retrieval benchmarks' texts (512 d, up to ~20,000 rows; bench/retrieval caches them)",
    )  # fmt: skip
    p.add_argument("--dims", type=int, default=None, help="384 (clustered) or 512 (use)")
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument("--zipf-s", type=float, default=1.1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--queries", type=int, default=100, help="recall queries per bucket")
    p.add_argument("--turns", type=int, default=200, help="sequential memory turns")
    p.add_argument("--session-turns", type=int, default=50, help="turns per concurrent session")
    p.add_argument("--peers", default="", help=f"comma-separated: {','.join(PEERS)}, or all")
    p.add_argument(
        "--peer-rows", type=int, default=None, help="rows of the peers' data set (default --rows)"
    )
    p.add_argument("--peer-timeout", type=int, default=1800, help="seconds per peer")
    p.add_argument(
        "--ann",
        choices=ANN_METHODS,
        default=None,
        help="then store.enable_ann(method=...) (the approximate path for large scopes) and "
        "measure again",
    )
    p.add_argument("--hnsw", action="store_true", help="the same as --ann hnsw")
    p.add_argument(
        "--ann-min-scope-rows",
        type=int,
        default=ANN_MIN_SCOPE_ROWS,
        help=f"with --ann: scopes larger than this take the path (default {ANN_MIN_SCOPE_ROWS}, "
        "the library's)",
    )
    p.add_argument(
        "--ann-build-memory",
        default="1GB",
        help="with --ann: maintenance_work_mem of the index build (a build whose graph fits "
        "is several times faster; 1M rows x 384 d need about 3GB)",
    )
    p.add_argument(
        "--ann-ef-search",
        type=int,
        default=ANN_EF_SEARCH,
        help=f"with --ann hnsw: the path's search breadth (default {ANN_EF_SEARCH}, the library's)",
    )
    p.add_argument(
        "--half-vectors",
        action="store_true",
        help="add the opt-in half vectors (pgmemory db half-vectors) before the import",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="then measure again with the memories table hash-partitioned by user_id into N",
    )
    p.add_argument(
        "--partitioned-first",
        action="store_true",
        help="with --partitions: measure the partitioned table first (run both orders)",
    )
    p.add_argument(
        "--shared-buffers",
        default=None,
        help="run on an embedded server of the benchmark's own with this shared_buffers "
        "(e.g. 6GB; the embedded default 128MB holds a fraction of 1M rows' indexes)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args()
    native = 512 if args.vectors == "use" else 384
    if args.dims is None:
        args.dims = native
    elif args.vectors == "use" and args.dims != native:
        raise SystemExit(f"--vectors use: the USE vectors have {native} dimensions; drop --dims")
    if args.hnsw:
        args.ann = args.ann or "hnsw"
    peers = list(PEERS) if args.peers == "all" else [x for x in args.peers.split(",") if x]
    for name in peers:
        if name not in PEERS:
            raise SystemExit(f"unknown peer {name!r}; known: {', '.join(PEERS)}")

    started = time.perf_counter()
    data_path = make_data(args, args.rows)
    meta = h.load(data_path).meta
    print(f"data: {data_path.relative_to(BENCH.parent)} (users per bucket "
          f"{meta['users_per_bucket']}, rows per bucket {meta['rows_per_bucket']})")  # fmt: skip
    server = Server(shared_buffers=args.shared_buffers)
    results: dict[str, Any] = {}
    try:
        print(server.info(), f"| {os.cpu_count()} CPUs")
        parted: dict | None = None
        if args.partitions and args.partitioned_first:  # the other order, against drift
            parted = measure_pgmemory(server, data_path, args, None, args.partitions)
        mine = measure_pgmemory(server, data_path, args, args.ann)
        results.update(json_figures(mine))
        results["detail"] = mine
        print_main("pgmemory", mine, meta)
        if "ann" in mine:
            print_ann(mine)
        if args.partitions:
            if parted is None:
                parted = measure_pgmemory(server, data_path, args, None, args.partitions)
            print_main(f"pgmemory, memories hash-partitioned into {args.partitions}", parted, meta)
            print_partitioned(mine, parted, args.partitions)
            results["partitioned"] = {**json_figures(parted), "partitions": args.partitions,
                                      "analyze_s": parted["analyze_s"]}  # fmt: skip
            results["analyze_s"] = mine["analyze_s"]
        if peers:
            peer_rows = args.peer_rows or args.rows
            peer_path, peer_meta, base = data_path, meta, mine
            note = f"(same {args.rows:,} rows)"
            if peer_rows != args.rows:
                peer_path = make_data(args, peer_rows)
                peer_meta = h.load(peer_path).meta
                print(f"\npeers run on a SMALLER data set of {peer_rows:,} rows "
                      f"(--peer-rows); pgmemory is re-measured on that same data for the ratios")  # fmt: skip
                base = measure_pgmemory(server, peer_path, args, None)
                print_main(f"pgmemory on the peers' {peer_rows:,}-row data", base, peer_meta)
                note = f"(both on the same {peer_rows:,} rows)"
            results["peers"] = {}
            for name in peers:
                print(f"\n== peer {name} ({PEERS[name][2]}) ==", flush=True)
                fig = run_peer(name, server, peer_path, args)
                results["peers"][name] = fig
                if fig.get("status") == "ok":
                    print_main(PEERS[name][2], fig, peer_meta)
                print_peer(PEERS[name][2], base, fig, note)
            results["peers_baseline"] = json_figures(base)
            # Load on a shared machine moves figures 2x within minutes: pgmemory is measured
            # once more after the peers, and every ratio printed again against that.
            print("\n== pgmemory again, after the peers ==", flush=True)
            again = measure_pgmemory(server, peer_path, args, None)
            print_main("pgmemory, measured after the peers", again, peer_meta)
            for name in peers:
                print_peer(PEERS[name][2], again, results["peers"][name],
                           f"{note}, pgmemory measured after the peers")  # fmt: skip
            results["peers_baseline_after"] = json_figures(again)
    finally:
        server.close()
    total = time.perf_counter() - started
    print(f"\ntotal wall time {total / 60:.1f} min")
    if args.json:
        results["meta"] = {**meta, "total_s": total, "server": "see stdout",
                           "half_vectors": args.half_vectors}  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, default=float))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
