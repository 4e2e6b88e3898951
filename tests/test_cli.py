"""The console script drives migrations on a real database."""

from __future__ import annotations

import os
import subprocess
import sys


def run(*args: str) -> str:
    env = {**os.environ}
    env.pop("PGMEMORY_DATABASE_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "pgmemory", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_db_commands_round_trip(fresh_database: str) -> None:
    head = run("db", "heads")
    assert run("--url", fresh_database, "db", "current") == "none"
    assert run("--url", fresh_database, "db", "upgrade") == f"pgmemory schema at {head}"
    assert run("--url", fresh_database, "db", "current") == head
    assert run("--url", fresh_database, "collections") == ""
    assert run("--url", fresh_database, "db", "downgrade", "base") == "pgmemory schema at None"
