"""Migrations of one database run one at a time: processes migrating at once all succeed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest
import sqlalchemy as sa

from pgmemory.store import migrate

#: Opens a store with migrate=True on the URL in argv[1] once its stdin says go.
MIGRATOR = """
import asyncio, sys
from alembic import command  # imported before the start line, so that all start together
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore

print("ready", flush=True)
sys.stdin.readline()

async def main() -> None:
    settings = Settings(_env_file=None)
    async with MemoryStore(sys.argv[1], settings=settings, migrate=True) as store:
        print(len(await store.list_collections()), flush=True)

asyncio.run(main())
"""


@pytest.fixture
def heavy(request: pytest.FixtureRequest) -> None:
    """Skip a heavy test unless the run selects the ``reliability`` marker."""
    if "reliability" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("heavy: run with `pytest -m reliability`")


def _migrate_at_once(url: str, processes: int) -> None:
    children = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATOR, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outcomes = [child.communicate(timeout=300) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    failures = [
        err for child, (_out, err) in zip(children, outcomes, strict=True) if child.returncode != 0
    ]
    assert not failures, f"{len(failures)} of {processes} failed; first:\n{failures[0]}"
    assert [out.strip() for out, _err in outcomes] == ["0"] * processes
    assert migrate.current(url) == migrate.head_revision()


@pytest.mark.slow
def test_three_processes_migrate_one_fresh_database_at_once(fresh_database: str) -> None:
    _migrate_at_once(fresh_database, 3)


def test_a_migration_waits_for_the_migration_lock(fresh_database: str) -> None:
    admin = sa.create_engine(fresh_database)
    failures: list[BaseException] = []

    def upgrade() -> None:
        try:
            migrate.upgrade(fresh_database)
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=upgrade)
    try:
        with admin.connect() as holder:
            holder.execute(
                sa.text("SELECT pg_advisory_lock(:key)"), {"key": migrate.MIGRATION_LOCK_KEY}
            )
            holder.commit()
            worker.start()
            deadline = time.monotonic() + 60
            while not _waiting_for_advisory_lock(holder):
                assert worker.is_alive(), f"the migration did not wait for the lock: {failures}"
                assert time.monotonic() < deadline, "the migration never asked for the lock"
                time.sleep(0.05)
            assert migrate.current(fresh_database) is None, (
                "nothing migrated while the lock is held"
            )
            holder.execute(
                sa.text("SELECT pg_advisory_unlock(:key)"), {"key": migrate.MIGRATION_LOCK_KEY}
            )
            holder.commit()
        worker.join(timeout=300)
        assert not worker.is_alive() and not failures, failures
        assert migrate.current(fresh_database) == migrate.head_revision()
    finally:
        admin.dispose()


def _waiting_for_advisory_lock(conn: sa.Connection) -> bool:
    waiting = conn.execute(
        sa.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    ).scalar_one()
    conn.commit()
    return bool(waiting)


@pytest.mark.reliability
def test_eight_processes_migrate_one_fresh_database_at_once(
    heavy: None, fresh_database: str
) -> None:
    _migrate_at_once(fresh_database, 8)


#: The functions statements call to take their own locks (migration 0022).
FUNCTIONS_0022 = (
    "pgmemory_erasure_stamp(text)",
    "pgmemory_erasure_guard(text, text)",
    "pgmemory_history_tail(text, text)",
)


def test_an_app_role_set_up_before_the_erasure_guard_may_call_it(fresh_database: str) -> None:
    """Migration 0022's functions (the statements' own locks) reach a role that could
    already audit (granted ``pgmemory_keyed_sha256`` by ``pgmemory db roles`` before it), and
    no other."""
    migrate.upgrade(fresh_database, "0021")
    engine = sa.create_engine(fresh_database, isolation_level="AUTOCOMMIT")
    suffix = uuid.uuid4().hex[:8]
    app, other = f"app_{suffix}", f"other_{suffix}"
    try:
        with engine.connect() as conn:
            for role in (app, other):
                conn.execute(sa.text(f"CREATE ROLE {role}"))
            conn.execute(
                sa.text(f"GRANT EXECUTE ON FUNCTION pgmemory_keyed_sha256(text, text) TO {app}")
            )
        migrate.upgrade(fresh_database)
        with engine.connect() as conn:
            granted = {
                (role, function): conn.execute(
                    sa.text("SELECT has_function_privilege(:role, :function, 'EXECUTE')"),
                    {"role": role, "function": function},
                ).scalar_one()
                for role in (app, other)
                for function in FUNCTIONS_0022
            }
            for role in (app, other):  # dropped with the database, but roles are the server's
                conn.execute(sa.text(f"DROP OWNED BY {role}"))
                conn.execute(sa.text(f"DROP ROLE {role}"))
    finally:
        engine.dispose()
    assert granted == {
        (role, function): role == app for role in (app, other) for function in FUNCTIONS_0022
    }
