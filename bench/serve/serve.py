"""Agent turns through a real web server under concurrent clients, embedding batching on vs off.

The product's path under load: a FastAPI application (``bench/serve/_serve_app.py``: one store per
process, ``Agent`` with ``PostgresHistoryProvider`` and ``ChatHistoryMemoryProvider``, the
default local embedder warmed up in the lifespan) served by uvicorn on 127.0.0.1, talking to a
scripted OpenAI-compatible chat server (``bench/serve/_chat_server.py``, its own process), driven by
N concurrent clients (``httpx.AsyncClient``, loopback only) for a bounded number of turns.
Each turn recalls (history, recent turns, hybrid search, the recall audit), calls the model,
and stores the user's message and the reply (embedding both texts).

Two application processes run side by side, one with ``PGMEMORY_EMBED_BATCHING=true`` and
one with ``false``, and every client count is measured on both, alternating which goes first
(ABBA over repeats), so machine noise hits both and the gain is a ratio from one run.

Reported per run: turns/s, client-side p50/p95/p99 latency, and the mean time of a turn split
into ``embed`` (inside the embedder, batching wait included), ``sql`` (store calls minus the
embedding inside them: SQL round trips, pool waits, the store's own Python), ``model`` (the
chat client call: openai SDK + HTTP + the scripted server), ``ours`` (the rest of the turn
inside the handler: agent, providers, rendering) and ``http`` (client latency minus the
handler: uvicorn, FastAPI, the load generator, queueing for the event loop). Also the mean
batch size, the application's CPU ms per turn, and start-up figures: ``import pgmemory``
(fresh interpreter, best of 3) and the first recall after opening a store, with and without
warming the embedder up first.

Usage::

    .venv/bin/python bench/serve/serve.py                      # ~5 min on 2 cores
    .venv/bin/python bench/serve/serve.py --quick              # ~1 min smoke
    .venv/bin/python bench/serve/serve.py --json bench/results/serve.json

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

from bench._common.paths import ROOT
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


def start(name: str, args: list[str], env: dict[str, str], timeout_s: float = 120.0) -> Proc:
    """Start ``python args...`` and read its port from the first line of stdout."""
    popen = subprocess.Popen(
        [sys.executable, *args],
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
    batching: bool
    repeat: int
    turns: int
    latencies_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    errors: int = 0
    timed_out: bool = False
    stats: dict[str, Any] = field(default_factory=dict)
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    loadgen_cpu_s: float = 0.0
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
            "clients": self.clients,
            "batching": self.batching,
            "embedder": "free" if self.free_embedder else "use",
            "repeat": self.repeat,
            "turns": done,
            "errors": self.errors,
            "timed_out": self.timed_out,
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
            "loadgen_cpu_ms_per_turn": 1000 * self.loadgen_cpu_s / max(done, 1),
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
    batching: bool,
    repeat: int,
    timeout_s: float,
    session_turns: int,
    first_user: int = 0,
    free_embedder: bool = False,
    scenario: str = "agent",
) -> Run:
    """``clients`` concurrent users, ``turns`` turns in all; a new session every
    ``session_turns`` turns of a client (the model is sent the session's whole history).

    Each simulated user has its own ``httpx.AsyncClient`` and connection, as separate users
    would: one client shared by all of them spends more CPU per request the more connections
    its pool holds (~4x at 64 here), which the load generator then takes from the server.
    """
    run = Run(
        clients=clients, batching=batching, repeat=repeat, turns=turns, free_embedder=free_embedder
    )
    rng = random.Random(f"{clients}-{batching}-{repeat}")
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
        cpu = time.process_time()
        start = time.perf_counter()
        tasks = [asyncio.create_task(client_loop(c)) for c in range(clients)]
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        run.wall_s = time.perf_counter() - start
        run.loadgen_cpu_s = time.process_time() - cpu
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


def row(f: dict[str, Any]) -> str:
    """One table row."""
    s = f["split_ms"]
    batch = f"{f['mean_batch']:.1f}" if f["mean_batch"] else "-"
    flags = " TIMEOUT" if f["timed_out"] else ""
    flags += f" {f['errors']} errors" if f["errors"] else ""
    label = "free" if f.get("embedder") == "free" else ("on" if f["batching"] else "off")
    return (
        f"| {f['clients']:>3} | {label:<4} | {f['turns_per_s']:7.1f} "
        f"| {f['p50_ms']:7.1f} | {f['p95_ms']:7.1f} | {f['p99_ms']:7.1f} "
        f"| {s['embed']:6.1f} | {s['sql']:6.1f} | {s['model']:6.1f} | {s['ours']:6.1f} "
        f"| {s['http']:6.1f} | {batch:>5} | {f['app_cpu_ms_per_turn']:5.1f} "
        f"| {f['model_cpu_ms_per_turn']:5.1f} |{flags}"
    )


HEADER = (
    "| clients | batching | turns/s | p50 ms | p95 ms | p99 ms | embed | sql | model | ours "
    "| http | batch | app CPU ms/turn | model CPU ms/turn |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def summarise(runs: list[dict[str, Any]], raw: list[Run]) -> list[dict[str, Any]]:
    """Per (clients, batching): median turns/s over repeats, percentiles over pooled turns."""
    out = []
    keys = sorted({(r["clients"], r["batching"]) for r in runs}, key=lambda k: (k[0], not k[1]))
    for clients, batching in keys:
        mine = [r for r in runs if (r["clients"], r["batching"]) == (clients, batching)]
        lat = np.concatenate(
            [r.latencies_ms for r in raw if (r.clients, r.batching) == (clients, batching)]
        )
        split = {k: statistics.fmean(r["split_ms"][k] for r in mine) for k in mine[0]["split_ms"]}
        batches = [r["mean_batch"] for r in mine if r["mean_batch"]]
        out.append(
            {
                "clients": clients,
                "batching": batching,
                "repeats": len(mine),
                "turns": sum(r["turns"] for r in mine),
                "errors": sum(r["errors"] for r in mine),
                "timed_out": any(r["timed_out"] for r in mine),
                "turns_per_s": statistics.median(r["turns_per_s"] for r in mine),
                "turns_per_s_each": [round(r["turns_per_s"], 1) for r in mine],
                "p50_ms": float(np.percentile(lat, 50)),
                "p95_ms": float(np.percentile(lat, 95)),
                "p99_ms": float(np.percentile(lat, 99)),
                "split_ms": split,
                "mean_batch": statistics.fmean(batches) if batches else None,
                "app_cpu_ms_per_turn": statistics.fmean(r["app_cpu_ms_per_turn"] for r in mine),
                "model_cpu_ms_per_turn": statistics.fmean(r["model_cpu_ms_per_turn"] for r in mine),
            }
        )
    return out


# --- main ---------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, url: str, env: dict[str, str]) -> dict[str, Any]:
    """Start the model server and both applications, run every point, stop them."""
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
        apps: dict[bool, Proc] = {}
        for batching in (True, False):
            flag = {"PGMEMORY_EMBED_BATCHING": "true" if batching else "false"}
            apps[batching] = start(
                f"app (batching {'on' if batching else 'off'})",
                [str(HERE / "_serve_app.py")],
                {**app_env, **flag},
            )
            procs.append(apps[batching])
        free: Proc | None = None
        if args.ceiling:
            free = start(
                "app (free embedder)",
                [str(HERE / "_serve_app.py")],
                {**app_env, "BENCH_FREE_EMBEDDER": "1"},
            )
            procs.append(free)
        await asyncio.gather(*(wait_ready(p.port) for p in procs[1:]))
        startup_apps = {}
        async with httpx.AsyncClient(timeout=30) as http:
            for batching, proc in apps.items():
                stats = (await http.get(f"http://127.0.0.1:{proc.port}/stats")).json()
                startup_apps["on" if batching else "off"] = stats["startup"]
                assert stats["startup"]["batching"] is batching, stats["startup"]

        raw: list[Run] = []
        ceiling: list[Run] = []
        print(HEADER, flush=True)
        for index, clients in enumerate(args.clients):
            turns = args.turns_single if clients == 1 else max(args.turns, 2 * clients)
            for repeat in range(args.repeats):
                order = (True, False) if (index + repeat) % 2 == 0 else (False, True)
                for batching in order:
                    run = await run_point(
                        apps[batching].port,
                        clients=clients,
                        turns=turns,
                        batching=batching,
                        repeat=repeat,
                        timeout_s=args.point_timeout,
                        session_turns=args.session_turns,
                        scenario=args.scenario,
                    )
                    raw.append(run)
                    print(row(run.figures()), flush=True)
            if free is not None:
                run = await run_point(
                    free.port,
                    clients=clients,
                    turns=turns,
                    batching=False,
                    repeat=0,
                    timeout_s=args.point_timeout,
                    session_turns=args.session_turns,
                    free_embedder=True,
                    scenario=args.scenario,
                )
                ceiling.append(run)
                print(row(run.figures()), flush=True)
        return {"raw": raw, "ceiling": ceiling, "startup_apps": startup_apps}
    finally:
        for proc in reversed(procs):
            proc.stop()


def main() -> None:
    """Parse arguments, prepare the database, measure, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients", default="1,8,64,200", help="comma-separated concurrent client counts"
    )
    parser.add_argument(
        "--turns", type=int, default=200, help="turns per point (at least 2 per client)"
    )
    parser.add_argument("--turns-single", type=int, default=60, help="turns with 1 client")
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs per (clients, batching), alternating which goes first",
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
        help="memories per user before the run (random vectors)",
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
        "store add or search per request, no model (the embedder's share "
        "is largest there)",
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
        help="a ~1 minute smoke: clients 1,8,64, fewer turns, one repeat",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
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
    print(server_info, flush=True)
    try:
        with server.scratch("serve") as url:
            asyncio.run(seed(url, max(args.clients), args.seed_rows))
            startup.update(measure_first_recall(url, env))
            print(
                f"from pgmemory import MemoryStore: {startup['import_memorystore_s']:.2f} s; "
                f"first recall after open: {startup['first_recall_after_open_ms']:.1f} ms "
                f"(warmed up, warm-up {startup['warm_up_s']:.2f} s); without warm-up "
                f"{startup['first_recall_cold_ms']:.1f} ms; open {startup['open_store_s']:.2f} s",
                flush=True,
            )
            measured = asyncio.run(measure(args, url, env))
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
    for clients in args.clients:
        on = next(s for s in summary if (s["clients"], s["batching"]) == (clients, True))
        off = next(s for s in summary if (s["clients"], s["batching"]) == (clients, False))
        ratios[str(clients)] = (
            on["turns_per_s"] / off["turns_per_s"] if off["turns_per_s"] else None
        )
    print(
        "batching on/off turns/s: "
        + ", ".join(f"{c} clients {r:.2f}x" for c, r in ratios.items() if r is not None)
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
                    "ratio_on_off": ratios,
                    "ceiling": [r.figures() for r in measured["ceiling"]],
                    "startup": startup,
                    "conditions": {
                        "cpus": os.cpu_count(),
                        "python": platform.python_version(),
                        "server": server_info,
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
