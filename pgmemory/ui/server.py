"""Run the audit page with uvicorn: :func:`serve` (blocking) and :func:`serve_store` (async)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING

from pgmemory.extras import require

if TYPE_CHECKING:
    from pgmemory.settings import Settings
    from pgmemory.store.store import MemoryStore

logger = logging.getLogger(__name__)

#: The retired setting that held one plain-text token for the page.
TOKEN_ENV = "PGMEMORY_UI_TOKEN"
RETIRED_TOKEN_ENV = (
    f"{TOKEN_ENV} is retired: a plain-text token in the environment or a settings file can be "
    "neither revoked nor expired. Unset it; `pgmemory ui` prints a sign-in address for its run, "
    "and `pgmemory token create NAME` issues tokens kept hashed in the database (revocable, "
    "with an expiry)"
)
#: How long the token ``pgmemory ui`` issues for its own run lives (revoked when it stops).
RUN_TOKEN_LIFETIME = timedelta(hours=12)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds to this machine only (``localhost``, 127.0.0.0/8, ``::1``).

    Args:
        host: the address or name to bind.

    Returns:
        True for a loopback address.
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_access(host: str, *, allow_writes: bool, insecure_no_token: bool) -> None:
    """Refuse serving without tokens where that is not allowed.

    Args:
        host: the address to bind.
        allow_writes: whether erasure is offered.
        insecure_no_token: the operator's explicit choice to serve the page without tokens
            (loopback and read-only only).

    Raises:
        ValueError: the opt-out beyond loopback or with writes, or the retired
            ``PGMEMORY_UI_TOKEN`` is set.
    """
    if os.environ.get(TOKEN_ENV):
        raise ValueError(RETIRED_TOKEN_ENV)
    if not insecure_no_token:
        return
    if allow_writes or not is_loopback(host):
        why = "allows writes" if allow_writes else f"listens beyond this machine ({host})"
        raise ValueError(
            f"--insecure-no-token, but the audit page {why}: it needs tokens (drop "
            "--insecure-no-token; `pgmemory ui` prints a sign-in address, and "
            "`pgmemory token create NAME` issues more)"
        )


def served_hosts(host: str, allowed_hosts: Iterable[str] = ()) -> list[str]:
    """The Host names the page answers to beyond loopback's: the bound address (unless it is
    a wildcard, which names no host) and ``allowed_hosts``.

    Args:
        host: the address to bind.
        allowed_hosts: names allowed besides (a reverse proxy's).

    Returns:
        The extra names, for :func:`~pgmemory.ui.app.create_app`'s ``allowed_hosts``.
    """
    bound = host.strip()
    extra = list(allowed_hosts)
    try:
        address = ipaddress.ip_address(bound.strip("[]"))
    except ValueError:
        return [bound, *extra] if bound else extra
    if address.is_unspecified:
        return extra
    return [f"[{address}]" if address.version == 6 else str(address), *extra]


def preflight(
    host: str,
    *,
    allow_writes: bool,
    insecure_no_token: bool,
    allowed_hosts: Iterable[str],
) -> None:
    """Check what :func:`serve` would serve with, before any server starts.

    Args:
        host: the address to bind.
        allow_writes: whether erasure is offered.
        insecure_no_token: the opt-out of tokens.
        allowed_hosts: the extra Host names.

    Raises:
        ValueError: the opt-out where it is not allowed, or an allowed host is no host name.
    """
    from pgmemory.ui.guard import HostCheck

    check_access(host, allow_writes=allow_writes, insecure_no_token=insecure_no_token)
    HostCheck(tuple(served_hosts(host, allowed_hosts)))


async def serve_store(
    store: MemoryStore,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    allow_writes: bool = False,
    insecure_no_token: bool = False,
    allowed_hosts: Iterable[str] = (),
    run_token: bool = True,
) -> None:
    """Serve the page on an open store until interrupted (run it on the store's event loop).

    Uvicorn's access log is off: request lines carry user ids (personal data).

    Args:
        store: an open store.
        host: address to bind (loopback by default).
        port: TCP port.
        allow_writes: offer erasure (needs tokens).
        insecure_no_token: serve without tokens (loopback, read-only; logs a warning).
        allowed_hosts: Host names answered besides loopback's and the bound address.
        run_token: issue a token for this run (living :data:`RUN_TOKEN_LIFETIME` at most,
            revoked when the page stops) and print its sign-in address to stderr, once; off,
            only tokens issued with ``pgmemory token create`` open the page.

    Raises:
        ValueError: the token opt-out where it is not allowed.
    """
    uvicorn = require("uvicorn", extra="ui", purpose="serving the audit web page")
    from pgmemory.admin.admin import Admin
    from pgmemory.ui.app import create_app

    check_access(host, allow_writes=allow_writes, insecure_no_token=insecure_no_token)
    app = create_app(
        store,
        allow_writes=allow_writes,
        insecure_no_token=insecure_no_token,
        allowed_hosts=served_hosts(host, allowed_hosts),
    )
    config = uvicorn.Config(
        app, host=host, port=port, access_log=False, lifespan="off", log_level="info"
    )
    if insecure_no_token:
        logger.warning(
            "the audit page runs WITHOUT A TOKEN (insecure_no_token): any user or process on "
            "this machine can read every memory through it"
        )
    logger.info(
        "audit page on http://%s:%d/ (%s, %s)",
        host,
        port,
        "writes allowed" if allow_writes else "read-only",
        "no token" if insecure_no_token else "tokens required",
    )
    admin = Admin(store)
    issued = None
    if run_token and not insecure_no_token:
        issued = await admin.issue_token(
            f"pgmemory ui {host}:{port} {secrets.token_hex(4)}", lifetime=RUN_TOKEN_LIFETIME
        )
        shown = f"[{host}]" if ":" in host else host
        # The secret goes to the terminal that started the page, never to the logs.
        print(
            f"pgmemory ui: sign in at http://{shown}:{port}/?token={issued.token}\n"
            f"  (valid for this run, {RUN_TOKEN_LIFETIME.total_seconds() / 3600:g} h at most; "
            "`pgmemory token create NAME` issues lasting ones)",
            file=sys.stderr,
            flush=True,
        )
    try:
        await uvicorn.Server(config).serve()
    finally:
        if issued is not None:
            with contextlib.suppress(Exception):  # the store may be going away with us
                await asyncio.shield(admin.revoke_token(issued.info.id))


def serve(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    allow_writes: bool = False,
    insecure_no_token: bool = False,
    allowed_hosts: Iterable[str] = (),
    url: str | None = None,
    settings: Settings | None = None,
    run_token: bool = True,
) -> None:
    """Open a store and serve the page until interrupted (blocking).

    SIGTERM (how systemd, docker and supervisors stop a process) is handled as Ctrl-C: the
    page shuts down, then the store closes, stopping the embedded server it started; the
    caller sees KeyboardInterrupt (``pgmemory ui`` then exits 0).

    Args:
        host: address to bind (loopback by default).
        port: TCP port.
        allow_writes: offer erasure (needs tokens).
        insecure_no_token: serve without tokens (loopback, read-only; logs a warning).
        allowed_hosts: Host names answered besides loopback's and the bound address (default:
            the settings' ``PGMEMORY_UI_ALLOWED_HOSTS``).
        url: database URL (default: the settings', else the embedded server).
        settings: pgmemory settings (default: from the environment).
        run_token: as for :func:`serve_store`.

    Raises:
        ValueError: the token opt-out where it is not allowed, the retired
            ``PGMEMORY_UI_TOKEN`` is set, or an allowed host is not a host name (checked
            before anything starts).
    """
    from pgmemory.settings import Settings
    from pgmemory.store.store import MemoryStore

    settings = settings or Settings()
    hosts = [*settings.ui_allowed_host_list(), *allowed_hosts]
    preflight(
        host,
        allow_writes=allow_writes,
        insecure_no_token=insecure_no_token,
        allowed_hosts=hosts,
    )

    async def run() -> None:
        async with MemoryStore(url, settings=settings) as store:
            await serve_store(
                store,
                host,
                port,
                allow_writes=allow_writes,
                insecure_no_token=insecure_no_token,
                allowed_hosts=hosts,
                run_token=run_token,
            )

    with _stops_as_interrupts():
        asyncio.run(run())


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def _stops_as_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT raise KeyboardInterrupt where the main thread is.

    Uvicorn takes both signals while it serves, shuts down gracefully, then raises the signal
    again for the handler it found: this one, so the exception unwinds through the store's
    ``async with`` (which closes it, stopping the embedded server) instead of the default
    SIGTERM action killing the process with the server still running. SIGINT is handled the
    same way rather than by asyncio.run's own handler, which cancels the main task and so
    interrupts the store's close.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
