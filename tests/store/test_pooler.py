"""Behind PgBouncer in transaction mode (Debian's pgbouncer, started here in front of the test
server): with ``prepared_statements=False`` every kind of call works under concurrency; with
prepared statements on, what breaks is explained, naming the setting.

In transaction mode the pooler gives each transaction (and each autocommit statement) any of
its server connections, so a statement prepared on one is missing on the next, or its name is
taken there by another client's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.errors import DatabaseNotReadyError
from tests.conftest import unique

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"

pytestmark = pytest.mark.skipif(
    not os.path.exists(PGBOUNCER),
    reason="needs Debian's pgbouncer package (make test installs it when run as root)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pooled_url(database_url: str) -> Iterator[str]:
    """A URL of the session database through PgBouncer, transaction mode, 2 server connections."""
    with _pgbouncer(database_url, ignore_options=True) as url:
        yield url


@contextlib.contextmanager
def _pgbouncer(database_url: str, *, ignore_options: bool) -> Iterator[str]:
    """PgBouncer in front of the server of ``database_url``, passing pgmemory's ``options``
    startup parameter (its statement timeout) through or not."""
    url = make_url(database_url)
    host = str(url.query.get("host") or url.host or "127.0.0.1")
    user = url.username or "postgres"
    # Not under pytest's own temporary directory, which no other user may enter.
    work = Path(tempfile.mkdtemp(prefix="pgmemory-pgbouncer-"))
    port = _free_port()
    auth = f"password={url.password}" if url.password else ""
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={host} port={url.port or 5432} user={user} {auth}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\ndefault_pool_size = 2\n"
        # pgmemory sends its statement timeout as a startup option, which PgBouncer refuses
        + ("ignore_startup_parameters = options\n" if ignore_options else "")
        + f"logfile = {work}/pgbouncer.log\npidfile = {work}/pgbouncer.pid\n"
    )
    command = [PGBOUNCER, "-q", str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses root: run it as whoever may reach the server
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "nobody"
        os.chmod(work, 0o777)
        command = ["runuser", "-u", owner, "--", *command]
    process = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    log = Path(work / "pgbouncer.log")
                    raise RuntimeError(
                        "pgbouncer did not start: " + (log.read_text() if log.exists() else "")
                    ) from None
                time.sleep(0.05)
        yield url.set(host="127.0.0.1", port=port, query={}).render_as_string(hide_password=False)
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def _settings(*, prepared: bool) -> Settings:
    return Settings(_env_file=None, prepared_statements=prepared)  # type: ignore[call-arg]


async def _work(store: MemoryStore, collection: str, user: str, rounds: int) -> None:
    """What a user's turns do: add, search, recall, history, facts."""
    scope = MemoryScope(user_id=user)
    for i in range(rounds):
        await store.add(
            collection,
            [MemoryRecord(content=f"{user} likes tea {i}", scope=scope, embedding=[1, 0, i])],
        )
        hits = await store.search(collection, scope, vector=[1, 0, 0], limit=2)
        assert hits and all(h.memory.scope.user_id == user for h in hits)
        shown = await store.recall(collection, scope, query=None, recent_turns=2)
        assert shown.items
        await store.append_history(
            "s1", [{"message_id": f"m{i}", "role": "user", "text": "hi"}], user_id=user
        )
        await store.merge_facts("facts", scope, {"turn": i}, actor="test")


async def test_without_prepared_statements_every_call_works_through_the_pooler(
    pooled_url: str,
) -> None:
    async with MemoryStore(pooled_url, settings=_settings(prepared=False)) as store:
        collection = unique("pooled")
        await store.create_collection(collection, dimensions=3, embedding_model="test")
        users = [unique("p") for _ in range(8)]
        await asyncio.gather(*(_work(store, collection, user, 12) for user in users))
        for user in users:
            assert await store.count(collection, MemoryScope(user_id=user)) == 12
            assert len(await store.read_history("s1", user_id=user)) == 12
            assert await store.get_facts("facts", MemoryScope(user_id=user)) == {"turn": 11}
        erased = await store.erase_user(users[0], actor="test")
        assert erased["memories"] == 12
        await store.drop_collection(collection)


async def test_with_prepared_statements_the_pooler_is_named_with_the_fix(
    pooled_url: str,
) -> None:
    async with MemoryStore(pooled_url, settings=_settings(prepared=True)) as store:
        collection = unique("pooled")
        await store.create_collection(collection, dimensions=3, embedding_model="test")
        errors: list[BaseException] = []

        async def user_turns(user: str) -> None:
            for _ in range(6):
                try:
                    await _work(store, collection, user, 2)
                except Exception as exc:  # what the application would see
                    errors.append(exc)

        await asyncio.gather(*(user_turns(unique("q")) for _ in range(8)))
        assert errors, "no statement ran on a server connection that lacked it"
        assert {type(e) for e in errors} == {DatabaseNotReadyError}, errors[:3]
        assert all("PGMEMORY_PREPARED_STATEMENTS=false" in str(e) for e in errors)
        await store.drop_collection(collection)


async def test_a_pooler_refusing_the_timeout_option_is_named_with_the_fix(
    database_url: str,
) -> None:
    with (
        _pgbouncer(database_url, ignore_options=False) as url,
        pytest.raises(DatabaseNotReadyError, match="ignore_startup_parameters = options"),
    ):
        async with MemoryStore(url, settings=_settings(prepared=False)):
            pass
