"""A turn's provider work, before and after a change: recall (before_run) and store (after_run).

    python bench/turn_ab.py --before 026b354 --json F     # (bench/serve/turn_ab.py is the same)
    python bench/turn_ab.py --before 026b354 --quick      # ~1-2 min smoke

The default providers (``PostgresHistoryProvider`` + ``ChatHistoryMemoryProvider``: storage
scope user + session, search scope the user) through each side's default runtime, on
identical seeded scopes of 100, 1,000 and 10,000 messages of one user:

* ``before``: the checkout at ``--before`` (extracted with ``git archive`` into
  ``--ref-dir``, no worktree registered), imported in a worker process of its own with its own
  ``PYTHONPATH`` and its own migrations, on a database of its own;
* ``after``: this checkout, whatever it is (or ``--after REF``, extracted the same way):
  agent-framework's ``Agent`` with ``bench/_common/pgmemory_af.py``'s providers (the
  ``user_id=`` constructors of issue 22 when the checkout has them, else the integration
  before them), on another database of the same server.

Each side is a long-lived worker (``bench/serve/_turn_worker.py``); every turn runs on both,
in ABBA order, so noise hits both alike. A turn: a new session of the scope's user, recall for
a fresh user message (timed: every provider's before_run), then store it and a reply (timed:
the after_run phase, the providers' transaction included). The scope's user changes between
turns so that no scope grows by more than ~5 % over the run. Embedding is a deterministic
hash embedder on both sides (no model time in either). Both databases are vacuumed and
analysed after each seeding, so that neither side's import maintenance (since cc3c9cc an
import vacuums; before it, it only analysed) is what the turns measure.

Statements: a few extra turns per side go through a wire-protocol proxy in the worker that
counts every Query / Execute message the client sends (what reaches the server, whatever
sent it), per provider and phase; those turns are not timed. ``(runtime)`` is what the
runtime sent outside the provider hooks (pgmemory's own agent commits the providers' units
of work there). Where pgmemory's providers write a turn together (one transaction, run by the
hook the framework calls last), every statement of it counts under that provider's hook (the
others show 0); ``statements_per_phase`` sums every provider and the runtime.

JSON (``--json F``): ``{"sizes": {"1000": {"recall": {"before_p50_ms", "after_p50_ms", ...},
"store": {...}, "statements": {"<provider>": {"before_run": {"before": n, "after": n},
"after_run": {...}}}, "round_trips": {...}, "statement_kinds": {...}}, ...}, "conditions": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from bench._common.paths import ROOT
from bench._common.scratch import Server
from bench.peers._harness import vacuum_analyze

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_turn_worker.py"
SIDES = ("before", "after")
_PROSE = (
    "what did I say about dinner the budget meeting my sister's birthday the train to Lyon "
    "the dentist the flat near the park and the new project at work last week"
)
WORDS = _PROSE.split()


def progress(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def extract(ref: str, folder: Path) -> tuple[Path, str]:
    """The tree of git ``ref`` under ``folder/<sha>`` (``git archive``; kept for reuse)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    target = folder / sha[:12]
    if not (target / ".extracted").exists():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.Popen(["git", "archive", sha], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise SystemExit(f"git archive {sha} failed")
        (target / ".extracted").write_text(sha + "\n")
    return target, sha


class Worker:
    """One side's worker process (JSON lines over its stdin/stdout)."""

    def __init__(self, name: str, code_root: Path) -> None:
        self.name = name
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGMEMORY_")}
        env["PYTHONPATH"] = str(code_root)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.popen = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),  # not a checkout: nothing shadows PYTHONPATH's pgmemory
        )

    def call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (see its traceback above)")
        answer = json.loads(line)
        if not answer.pop("ok"):
            raise RuntimeError(f"{self.name} worker, {op}: {answer['error']}")
        return answer

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(Exception):  # it may have died: then just wait for it
                self.call("close")
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()


def users_for(size: int, turns: int) -> list[str]:
    """Enough users of ``size`` rows that none grows by more than ~5 % (2 rows a turn)."""
    n = min(turns, max(1, -(-2 * turns // max(1, size // 20))))
    return [f"s{size}-u{i}" for i in range(n)]


def message(rng: random.Random, n: int) -> str:
    return f"{' '.join(rng.choices(WORDS, k=rng.randint(6, 14)))}? (turn {n})"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def statements_table(counted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``{"<provider>": {"before_run": {"before": n, "after": n}, ...}}`` and the round trips."""
    out: dict[str, Any] = {}
    trips: dict[str, Any] = {}
    kinds: dict[str, Any] = {}
    for side in SIDES:
        turn = counted[side]
        for bucket, n in turn["statements"].items():
            provider, phase = bucket.split("/")
            out.setdefault(provider, {}).setdefault(phase, {"before": 0, "after": 0})[side] = n
        for bucket, n in turn["round_trips"].items():
            provider, phase = bucket.split("/")
            trips.setdefault(provider, {}).setdefault(phase, {"before": 0, "after": 0})[side] = n
        for bucket, k in turn["kinds"].items():
            kinds.setdefault(bucket, {})[side] = k
    for table in (out, trips):
        for phases in table.values():
            for phase in ("before_run", "after_run"):
                phases.setdefault(phase, {"before": 0, "after": 0})
    totals = {
        phase: {side: sum(p[phase][side] for p in out.values()) for side in SIDES}
        for phase in ("before_run", "after_run")
    }
    return {
        "statements": out,
        "statements_per_phase": totals,
        "round_trips": trips,
        "statement_kinds": kinds,
    }


def goals(sizes: dict[str, Any]) -> dict[str, Any]:
    """Issue 22's goals, reported (not asserted): at 1,000 messages recall >= 5x and store
    >= 2x faster at p50; after: one statement per provider per phase (in every size).

    A provider that sent nothing in a phase counts as meeting it; pgmemory's own agent's
    commit and anything else outside the hooks is ``(runtime)``."""
    out: dict[str, Any] = {}
    mid = sizes.get("1000")
    if mid is not None:
        out["recall_speedup_p50_1000"] = mid["recall"]["speedup_p50"]
        out["recall_goal_5x"] = bool(
            mid["recall"]["speedup_p50"] and mid["recall"]["speedup_p50"] >= 5
        )
        out["store_speedup_p50_1000"] = mid["store"]["speedup_p50"]
        out["store_goal_2x"] = bool(
            mid["store"]["speedup_p50"] and mid["store"]["speedup_p50"] >= 2
        )
    worst = {
        size: max(
            (phases[phase]["after"] for phases in e["statements"].values() for phase in phases),
            default=0,
        )
        for size, e in sizes.items()
    }
    out["most_statements_of_one_provider_phase_after"] = worst
    out["one_statement_per_provider_phase_after"] = all(n <= 1 for n in worst.values())
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    before_root, before_sha = extract(args.before, args.ref_dir)
    progress(f"before: {args.before} = {before_sha[:12]} at {before_root}")
    if args.after:
        after_root, after_sha = extract(args.after, args.ref_dir)
        dirty = False
        progress(f"after: {args.after} = {after_sha[:12]} at {after_root}")
    else:
        after_root = ROOT
        after_sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        progress(f"after: this checkout {ROOT} ({after_sha[:12]}{', modified' if dirty else ''})")
    server = Server()
    info = server.info()
    progress(info)
    workers: dict[str, Worker] = {}
    results: dict[str, Any] = {}
    setup: dict[str, Any] = {}
    try:
        with (
            server.scratch("turn_before", pgmemory_schema=False) as url_before,
            server.scratch("turn_after", pgmemory_schema=False) as url_after,
        ):
            urls = {"before": url_before, "after": url_after}
            roots = {"before": before_root, "after": after_root}
            flavours = {"before": args.before_flavour, "after": args.after_flavour}
            owner_urls = dict(urls)  # vacuum and analyse as the tables' owner
            for side in SIDES:
                workers[side] = Worker(side, roots[side])
                migrated = workers[side].call("migrate", url=urls[side])
                if args.app_role:  # each side's own `pgmemory db roles`, and the turns as it
                    made = workers[side].call("app_role", url=urls[side], name=f"bench_app_{side}")
                    urls[side] = made["url"]
                    migrated["role"] = made["role"]
                setup[side] = {
                    **migrated,
                    **workers[side].call("setup", url=urls[side], flavour=flavours[side]),
                }
                progress(f"{side}: {setup[side]}")
            for size in args.sizes:
                total = args.warmup + args.counted + args.turns
                users = users_for(size, total)
                for side in SIDES:
                    seeded = workers[side].call("seed", users=users, size=size)
                    progress(
                        f"size {size}: {side} seeded {seeded['rows']:,} rows "
                        f"({len(users)} users) in {seeded['seconds']:.1f} s"
                    )
                    # Both sides vacuumed alike after seeding: an import of one checkout may
                    # vacuum (cc3c9cc on) and another's only analyse, and the turns must not
                    # measure that difference (all-visible pages are read index-only).
                    asyncio.run(vacuum_analyze(owner_urls[side]))
                rng = random.Random(f"turns-{size}")
                times: dict[str, dict[str, list[float]]] = {
                    s: {"recall": [], "store": []} for s in SIDES
                }
                counted: dict[str, dict[str, Any]] = {}
                for n in range(total):
                    user = users[n % len(users)]
                    text, reply = message(rng, n), f"Noted: {message(rng, n)}"
                    session = f"turn-{size}-{n}"
                    is_counted = args.warmup <= n < args.warmup + args.counted
                    order = SIDES if n % 4 in (0, 3) else SIDES[::-1]  # ABBA
                    for side in order:
                        got = workers[side].call(
                            "turn",
                            user=user,
                            session_id=session,
                            text=text,
                            reply=reply,
                            counted=is_counted,
                        )
                        if is_counted:
                            counted[side] = got  # the last counted turn is reported
                        elif n >= args.warmup + args.counted:
                            times[side]["recall"].append(got["recall_ms"])
                            times[side]["store"].append(got["store_ms"])
                entry: dict[str, Any] = {"users": len(users), "turns": args.turns}
                for phase in ("recall", "store"):
                    entry[phase] = {}
                    for side in SIDES:
                        values = times[side][phase]
                        entry[phase][f"{side}_p50_ms"] = percentile(values, 50)
                        entry[phase][f"{side}_p95_ms"] = percentile(values, 95)
                    b, a = entry[phase]["before_p50_ms"], entry[phase]["after_p50_ms"]
                    entry[phase]["speedup_p50"] = b / a if a else None
                entry.update(statements_table(counted))
                entry["injected_messages"] = {s: counted[s].get("injected") for s in SIDES}
                results[str(size)] = entry
                print_size(size, entry)
    finally:
        for worker in workers.values():
            worker.stop()
        server.close()
    return {
        "sizes": results,
        "goals": goals(results),
        "conditions": {
            "before": {"ref": args.before, "commit": before_sha, **setup.get("before", {})},
            "after": {
                "ref": args.after or "this checkout",
                "commit": after_sha,
                "modified": dirty,
                **setup.get("after", {}),
            },
            "server": info,
            "cpus": os.cpu_count(),
            "loadavg_1m": os.getloadavg()[0],
            "python": platform.python_version(),
            "turns": args.turns,
            "warmup": args.warmup,
            "counted_turns": args.counted,
            "quick": args.quick,
            "note": args.note,
            "embedder": "deterministic hash embedder, 512-d, both sides (no model time)",
            "statements": "counted by a wire-protocol proxy (Query + Execute messages sent "
            "to the server), on the last untimed counted turn; round trips = Sync + Query; "
            "a turn the providers write together counts under the hook that runs it",
        },
    }


def print_size(size: int, e: dict[str, Any]) -> None:
    print(f"\n{size:,} messages in the scope ({e['users']} users, {e['turns']} turns a side)")
    print("| phase | before p50 ms | after p50 ms | before p95 | after p95 | before/after p50 |")
    print("|---|---|---|---|---|---|")
    for phase in ("recall", "store"):
        p = e[phase]
        ratio = f"{p['speedup_p50']:.2f}x" if p["speedup_p50"] else "-"
        print(
            f"| {phase} | {p['before_p50_ms']:.2f} | {p['after_p50_ms']:.2f} "
            f"| {p['before_p95_ms']:.2f} | {p['after_p95_ms']:.2f} | {ratio} |"
        )
    print("| provider | phase | statements before | after | round trips before | after |")
    print("|---|---|---|---|---|---|")
    for provider, phases in sorted(e["statements"].items()):
        for phase in ("before_run", "after_run"):
            s = phases[phase]
            t = e["round_trips"].get(provider, {}).get(phase, {"before": 0, "after": 0})
            print(
                f"| {provider} | {phase} | {s['before']} | {s['after']} "
                f"| {t['before']} | {t['after']} |"
            )
    for phase, n in e["statements_per_phase"].items():
        print(f"| all providers | {phase} | {n['before']} | {n['after']} | | |")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="git ref of the 'before' side (e.g. 026b354)")
    p.add_argument(
        "--after", default=None, help="git ref of the 'after' side (default: this checkout)"
    )
    p.add_argument("--sizes", default="100,1000,10000", help="messages in the user's scope")
    p.add_argument("--turns", type=int, default=100, help="timed turns per size and side")
    p.add_argument("--warmup", type=int, default=5, help="untimed turns first")
    p.add_argument("--counted", type=int, default=2, help="untimed turns through the counter")
    p.add_argument(
        "--before-flavour",
        choices=("auto", "own", "af"),
        default="own",
        help="runtime of the before side: own (pgmemory.Agent, the default before issue 22), "
        "af (agent_framework.Agent), auto (af when importable)",
    )
    p.add_argument("--after-flavour", choices=("auto", "own", "af"), default="af")
    p.add_argument(
        "--ref-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "pgmemory-turn-ab",
        help="where --before's tree is extracted (kept for the next run)",
    )
    p.add_argument("--quick", action="store_true", help="a ~1-2 minute smoke (20 timed turns)")
    p.add_argument(
        "--app-role",
        action="store_true",
        help="run both sides' turns as a least-privilege application role (pgmemory db roles)",
    )
    p.add_argument("--note", default="", help="a note kept in the JSON's conditions")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args()
    if args.quick:
        args.turns, args.warmup = min(args.turns, 20), min(args.warmup, 3)
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    began = time.perf_counter()
    out = run(args)
    g = out["goals"]
    if "recall_speedup_p50_1000" in g:
        print(
            f"\ngoals (reported, not asserted): at 1,000 messages recall "
            f"{g['recall_speedup_p50_1000']:.2f}x faster at p50 (goal >= 5x), store "
            f"{g['store_speedup_p50_1000']:.2f}x (goal >= 2x)"
        )
    print(
        "most statements one provider sent in one phase, after: "
        + ", ".join(
            f"{k} messages: {v}"
            for k, v in g["most_statements_of_one_provider_phase_after"].items()
        )
        + " (goal: 1)"
    )
    out["conditions"]["elapsed_s"] = time.perf_counter() - began
    progress(f"total {out['conditions']['elapsed_s']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        progress(f"wrote {args.json}")


if __name__ == "__main__":
    main()
