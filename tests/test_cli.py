"""The console script drives migrations, recall and erasure on a real database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings


def run(*args: str, ok: bool = True) -> str:
    env = {**os.environ}
    env.pop("PGMEMORY_DATABASE_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "pgmemory", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert (out.returncode == 0) == ok, out.stderr
    return out.stdout.strip() if ok else out.stderr


def test_db_commands_round_trip(fresh_database: str) -> None:
    head = run("db", "heads")
    assert run("--url", fresh_database, "db", "current") == "none"
    assert run("--url", fresh_database, "db", "upgrade") == f"pgmemory schema at {head}"
    assert run("--url", fresh_database, "db", "current") == head
    assert run("--url", fresh_database, "collections") == ""
    assert run("--url", fresh_database, "db", "downgrade", "base") == "pgmemory schema at None"


def test_recall_and_forget(fresh_database: str) -> None:
    run("--url", fresh_database, "db", "upgrade")

    async def seed() -> None:
        async with MemoryStore(fresh_database, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
            await store.create_collection("chat")
            await store.add("chat", [MemoryRecord(content="我不能吃辣", scope=MemoryScope(user_id="alice")),
                                     MemoryRecord(content="I love chilli", scope=MemoryScope(user_id="bob"))])

    asyncio.run(seed())
    lines = run("--url", fresh_database, "recall", "chat", "辣", "--user", "alice").splitlines()
    assert len(lines) == 1 and lines[0].endswith("user\t我不能吃辣")
    error = run("--url", fresh_database, "recall", "chat", "x", ok=False)
    assert error.startswith("pgmemory: error: the search scope sets no dimension") and "Traceback" not in error
    forgotten = dict(line.split("\t") for line in run("--url", fresh_database, "forget", "alice").splitlines())
    assert forgotten["memories"] == "1"
    assert run("--url", fresh_database, "recall", "chat", "辣", "--user", "alice") == ""
    assert run("--url", fresh_database, "recall", "chat", "chilli", "--user", "bob").endswith("I love chilli")
