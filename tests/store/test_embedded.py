"""The embedded server: two processes starting at once share one server, which stops cleanly."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

CHILD = """
import sys, time
import sqlalchemy as sa
from pgmemory.store.embedded import EmbeddedServer
server = EmbeddedServer(sys.argv[1])
url = server.start()
engine = sa.create_engine(url)
with engine.connect() as conn:
    started = conn.execute(sa.text("SELECT pg_postmaster_start_time()")).scalar_one()
    has_vector = conn.execute(sa.text("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")).scalar_one()
engine.dispose()
print(started.isoformat(), has_vector, flush=True)
time.sleep(1.0)  # both processes hold the server at the same time
server.stop()
"""


def _postgres_processes(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and any(str(data_dir) in part for part in cmdline):
            found.append(proc)
    return found


@pytest.mark.slow
def test_two_processes_share_one_server_and_it_stops(tmp_path: Path) -> None:
    data_dir = tmp_path / "pgdata"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(data_dir)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [child.communicate(timeout=120)[0].split() for child in children]
    assert all(child.returncode == 0 for child in children)
    assert outputs[0] == outputs[1], "both processes must talk to the same server"
    assert outputs[0][1] == "1", "the embedded server ships pgvector"
    deadline = time.monotonic() + 15
    while _postgres_processes(data_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _postgres_processes(data_dir) == []
    assert not (data_dir / "postmaster.pid").exists()
