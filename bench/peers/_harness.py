"""Shared measurement loop for bench/store/scale.py: pgmemory and every peer run exactly this code.

Standard library + numpy only, so a peer's own venv can import it (the peer modules put this
directory on sys.path by being run as scripts from it; scale.py and _startup.py import it as
``bench.peers._harness``). An *adapter* is an object with async
methods:

    setup()                                  create the collection / table
    import_rows(data, progress)              bulk-load every row of ``data`` (the timed import)
    after_import()                           VACUUM ANALYZE etc. (timed separately)
    search(user, vector, k) -> [row index]   scoped top-k, best first
    add(user, vectors, texts)                store the turn's 2 records in ONE transaction
    close()

Row indices come back by parsing the content (``"row <i>: ..."``), which every peer stores.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

BUCKETS = ("small", "mid", "heavy", "huge")
#: Upper bound (inclusive) of each bucket's scope size in rows; ``huge`` is everything above.
BUCKET_MAX = {"small": 100, "mid": 1_000, "heavy": 10_000, "huge": None}
WARMUP = 60
T0 = datetime(2025, 1, 1, tzinfo=UTC)
_ROW = re.compile(r"^row (\d+):")


def bucket_of(n: int) -> str:
    if n <= 100:
        return "small"
    if n <= 1_000:
        return "mid"
    if n <= 10_000:
        return "heavy"
    return "huge"


def user_name(u: int) -> str:
    return f"u{int(u):05d}"


def row_text(i: int, user: int, topic: int) -> str:
    return f"row {i}: user {user_name(user)} wrote a note about topic {topic} (message {i})"


def row_index(content: str) -> int:
    m = _ROW.match(content)
    return int(m.group(1)) if m else -1


@dataclass
class Data:
    """The precomputed data set (see scale.py ``make_data`` for how it is drawn)."""

    path: Path
    vectors: np.ndarray  # (N, D) float32, unit
    user: np.ndarray  # (N,) int32, row -> user index
    topic: np.ndarray  # (N,) int32
    seconds: np.ndarray  # (N,) int64, created_at = T0 + seconds
    user_rows: np.ndarray  # (U,) rows per user
    q_user: np.ndarray  # (Q,) int32
    q_vec: np.ndarray  # (Q, D) float32
    q_bucket: np.ndarray  # (Q,) int8 index into BUCKETS
    gt: np.ndarray  # (Q, 3) int64 exact top-3 row indices (numpy brute force)
    t_user: np.ndarray  # (T,) turn users
    t_vec: np.ndarray  # (T, D) turn query vectors
    t_new: np.ndarray  # (T, 2, D) the 2 vectors each turn stores
    meta: dict[str, Any]

    @property
    def rows(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dims(self) -> int:
        return int(self.vectors.shape[1])

    def created_at(self, i: int) -> datetime:
        return T0 + timedelta(seconds=int(self.seconds[i]))

    def text(self, i: int) -> str:
        return row_text(i, int(self.user[i]), int(self.topic[i]))


def load(path: str | Path) -> Data:
    z = np.load(path, allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    return Data(
        path=Path(path),
        vectors=z["vectors"], user=z["user"], topic=z["topic"], seconds=z["seconds"],
        user_rows=z["user_rows"], q_user=z["q_user"], q_vec=z["q_vec"], q_bucket=z["q_bucket"],
        gt=z["gt"], t_user=z["t_user"], t_vec=z["t_vec"], t_new=z["t_new"], meta=meta,
    )  # fmt: skip


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def turn_rows(t: int) -> tuple[int, int]:
    """Row indices of turn t's two records (they never collide with imported rows)."""
    return 10_000_000 + 2 * t, 10_000_000 + 2 * t + 1


def turn_texts(t: int, user: int) -> list[str]:
    base = turn_rows(t)[0]
    return [
        f"row {base}: user {user_name(user)} said something new in turn {t}",
        f"row {base + 1}: assistant replied to {user_name(user)} in turn {t}",
    ]


def _bar(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # a peer venv without tqdm
        return None
    return tqdm(total=total, desc=desc, unit="q", leave=False, file=sys.stderr)


async def import_batches(
    data: Data, batch: int, desc: str, progress: bool, put: Callable[[range], Awaitable[None]]
) -> None:
    """Await ``put(rows)`` for consecutive row ranges of ``batch`` rows, with a progress bar."""
    bar = _bar(data.rows, desc, progress)
    for a in range(0, data.rows, batch):
        rows = range(a, min(a + batch, data.rows))
        await put(rows)
        if bar is not None:
            bar.update(len(rows))
    if bar is not None:
        bar.close()


async def measure(
    adapter: Any,
    data: Data,
    *,
    sequential_turns: int,
    sessions: int = 8,
    progress: bool = True,
    skip_import: bool = False,
    before_turns: Any = None,
    extra: Any = None,
) -> dict[str, Any]:
    """Run the whole protocol against one adapter; returns the figures (ms, rows/s, turns/s).

    ``before_turns(adapter)`` runs more passes right after the recall pass, on the imported rows
    only (``data.gt`` holds); ``extra(adapter, gt)`` runs after the turns, with the ground truth
    recomputed over the imported rows plus the ones the turns added.
    """
    out: dict[str, Any] = {
        "rows": data.rows,
        "dims": data.dims,
        "import_how": getattr(adapter, "import_how", "?"),
    }
    await adapter.setup()
    if not skip_import:
        t = time.perf_counter()
        await adapter.import_rows(data, progress)
        el = time.perf_counter() - t
        out["import_s"] = el
        out["import_rows_per_s"] = data.rows / el
        t = time.perf_counter()
        await adapter.after_import()
        out["analyze_s"] = time.perf_counter() - t

    # 1. scoped top-3 per bucket, with recall@3 against the numpy brute force
    out.update(await recall_pass(adapter, data, progress))
    if before_turns is not None:  # more passes while data.gt still holds (pgmemory: audit off)
        out.update(await before_turns(adapter))

    # 2. and 3. memory turns, one at a time and then in concurrent sessions
    turns = await turn_passes(adapter, data, sequential_turns=sequential_turns, sessions=sessions,
                              progress=progress)  # fmt: skip
    ran = turns.pop("ran")
    out.update(turns)
    if extra is not None:  # more passes on the store the turns grew (pgmemory: HNSW probe)
        out.update(await extra(adapter, truth_after_turns(data, ran)))
    await adapter.close()
    return out


async def turn_passes(
    adapter: Any, data: Data, *, sequential_turns: int, sessions: int = 8, progress: bool = True
) -> dict[str, Any]:
    """The memory turns (recall, then store the 2 new messages in one transaction): the first
    ``sequential_turns`` one at a time, the rest in ``sessions`` concurrent sessions (asyncio
    tasks sharing one client). Returns the figures, and under ``ran`` the turns that ran."""
    out: dict[str, Any] = {}

    async def turn(t: int) -> float:
        user = int(data.t_user[t])
        start = time.perf_counter()
        await adapter.search(user_name(user), data.t_vec[t], 3)
        await adapter.add(user_name(user), data.t_new[t], turn_texts(t, user))
        return (time.perf_counter() - start) * 1000

    n_turns = len(data.t_user)
    seq = min(sequential_turns, n_turns)
    turn_lat = []
    bar = _bar(seq, "sequential turns", progress)
    for t in range(seq):
        turn_lat.append(await turn(t))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    out["turns"] = seq
    out["turn_p50_ms"] = pct(turn_lat, 50)
    out["turn_p95_ms"] = pct(turn_lat, 95)

    rest = list(range(seq, n_turns))
    per = len(rest) // sessions
    conc_lat: list[float] = []

    async def session(k: int) -> None:
        for t in rest[k * per : (k + 1) * per]:
            conc_lat.append(await turn(t))

    start = time.perf_counter()
    await asyncio.gather(*(session(k) for k in range(sessions)))
    wall = time.perf_counter() - start
    out["ran"] = list(range(seq)) + [
        t for k in range(sessions) for t in rest[k * per : (k + 1) * per]
    ]
    out["concurrent_turns"] = per * sessions
    out[f"turns_per_s_{sessions}"] = per * sessions / wall
    out[f"turn_p50_ms_{sessions}"] = pct(conc_lat, 50)
    out[f"turn_p95_ms_{sessions}"] = pct(conc_lat, 95)
    return out


def truth_after_turns(data: Data, turns: list[int]) -> np.ndarray:
    """Exact top-3 of every recall query over its user's imported rows plus the rows ``turns``
    added (turn t's two rows are ``turn_texts``' indices), as ``data.gt`` is over the import."""
    added: dict[int, list[int]] = {}
    for t in turns:
        added.setdefault(int(data.t_user[t]), []).append(t)
    order = np.argsort(data.user, kind="stable")
    starts = np.concatenate([[0], np.cumsum(data.user_rows)])
    gt = np.full((len(data.q_user), 3), -1, dtype=np.int64)
    for j, u in enumerate(data.q_user):
        mine = order[starts[u] : starts[u + 1]]
        ids = list(mine)
        vecs = [data.vectors[mine]]
        for t in added.get(int(u), []):
            ids += turn_rows(t)
            vecs.append(data.t_new[t])
        scores = np.concatenate(vecs).astype(np.float64) @ data.q_vec[j].astype(np.float64)
        top = np.argsort(-scores, kind="stable")[:3]
        gt[j, : len(top)] = np.asarray(ids)[top]
    return gt


async def recall_pass(
    adapter: Any, data: Data, progress: bool, gt: np.ndarray | None = None
) -> dict[str, Any]:
    """Every bucket's queries once: latency percentiles and mean recall@3, per bucket (against
    ``gt``, by default ``data.gt``: the imported rows' truth)."""
    gt = data.gt if gt is None else gt
    out: dict[str, Any] = {}
    # warm-up (untimed): caches, and prepared statements on every pooled connection (psycopg
    # prepares a statement on its 5th execution per connection; the pool hands out ~10)
    for j in np.linspace(0, len(data.q_user) - 1, num=min(WARMUP, len(data.q_user))).astype(int):
        await adapter.search(user_name(data.q_user[j]), data.q_vec[j], 3)
    lat: dict[str, list[float]] = {b: [] for b in BUCKETS}
    rec: dict[str, list[float]] = {b: [] for b in BUCKETS}
    bar = _bar(len(data.q_user), "recall queries", progress)
    for j in range(len(data.q_user)):
        b = BUCKETS[int(data.q_bucket[j])]
        t = time.perf_counter()
        got = await adapter.search(user_name(data.q_user[j]), data.q_vec[j], 3)
        lat[b].append((time.perf_counter() - t) * 1000)
        truth = {int(x) for x in gt[j] if x >= 0}  # a scope of < 3 rows has < 3 answers
        rec[b].append(len(set(got[:3]) & truth) / len(truth))
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    for b in BUCKETS:
        if not lat[b]:
            continue
        scope = data.user_rows[data.q_user[data.q_bucket == BUCKETS.index(b)]]
        out[b] = {
            "queries": len(lat[b]),
            "scope_rows_median": int(np.median(scope)),
            "scope_rows_max": int(scope.max()),
            "recall_p50_ms": pct(lat[b], 50),
            "recall_p95_ms": pct(lat[b], 95),
            "recall_p99_ms": pct(lat[b], 99),
            "recall_at_3": float(np.mean(rec[b])),
        }
    return out


def libpq_url(url: str) -> str:
    """``postgresql+psycopg://...`` -> ``postgresql://...`` (what libpq, psycopg take)."""
    return re.sub(r"^postgresql\+\w+://", "postgresql://", url)


def sqlalchemy_url(url: str, driver: str = "psycopg") -> str:
    return re.sub(r"^postgresql(\+\w+)?://", f"postgresql+{driver}://", url)


async def vacuum_analyze(url: str) -> None:
    """VACUUM (ANALYZE) the whole scratch database, as scale.py does for pgmemory."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True) as conn:
        await conn.execute("VACUUM (ANALYZE)")


def peer_main(make_adapter: Any) -> None:
    """Entry point of a peer module: ``python peer.py DATA_NPZ URL OUT_JSON TURNS [--quiet]``."""
    data_path, url, out_path, turns = sys.argv[1:5]
    progress = "--quiet" not in sys.argv
    data = load(data_path)
    try:
        figures = asyncio.run(
            measure(make_adapter(url, data), data, sequential_turns=int(turns), progress=progress)
        )
        figures["status"] = "ok"
    except Exception as exc:  # report, never fake
        import traceback

        traceback.print_exc()
        figures = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500]}
    Path(out_path).write_text(json.dumps(figures, indent=2))
