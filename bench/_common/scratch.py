"""Scratch databases for the benchmarks: one each, on the embedded server (or on the server
PGMEMORY_DATABASE_URL names), dropped afterwards, so a benchmark never touches real data."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from bench._common.paths import CACHE
from pgmemory import Settings
from pgmemory.store import migrate
from pgmemory.store.embedded import EmbeddedServer

#: Where a benchmark that sizes the embedded server's memory keeps that server: its own data
#: directory, so the setting never changes the embedded server the library and tests use.
SIZED_DATA_DIR = CACHE / "pgdata-sized"


class Server:
    """The server the benchmarks run on, and scratch databases on it.

    Args:
        shared_buffers: Run on an embedded server of the benchmark's own (under
            SIZED_DATA_DIR) with this much shared buffer memory (e.g. ``"6GB"``; the embedded
            default is 128MB, far below a million rows' indexes). Refused with
            PGMEMORY_DATABASE_URL: size that server yourself.
    """

    def __init__(self, *, shared_buffers: str | None = None) -> None:
        settings = Settings()
        self.embedded: EmbeddedServer | None = None
        if settings.database_url is not None:
            if shared_buffers is not None:
                raise SystemExit(
                    "--shared-buffers sizes the embedded server only; with "
                    "PGMEMORY_DATABASE_URL set shared_buffers on that server instead"
                )
            self.base = settings.database_url.get_secret_value()
        else:
            data_dir = settings.data_dir if shared_buffers is None else SIZED_DATA_DIR
            self.embedded = EmbeddedServer(data_dir)
            self.base = self.embedded.start()
            if shared_buffers is not None:
                self._size(data_dir, shared_buffers)
        self.admin = sa.create_engine(
            migrate.normalise_url(self.base), isolation_level="AUTOCOMMIT"
        )

    def _size(self, data_dir: Path, shared_buffers: str) -> None:
        """Give the benchmark's own embedded server ``shared_buffers`` (a restart, if needed).
        The server itself quotes the value into the ALTER SYSTEM statement."""
        assert self.embedded is not None
        engine = sa.create_engine(migrate.normalise_url(self.base), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            ddl = conn.execute(
                sa.text("SELECT format('ALTER SYSTEM SET shared_buffers = %L', CAST(:v AS text))"),
                {"v": shared_buffers},
            ).scalar_one()
            # Run as it is, no parameters (a % in it is text); the server refuses a non-size.
            conn.connection.driver_connection.execute(ddl)  # type: ignore[union-attr]
            pending = conn.execute(
                sa.text(
                    "SELECT pg_size_bytes(current_setting('shared_buffers')) "
                    "<> pg_size_bytes(CAST(:v AS text))"
                ),
                {"v": shared_buffers},
            ).scalar()
        engine.dispose()
        if pending:
            self.embedded.stop()
            self.embedded = EmbeddedServer(data_dir)
            self.base = self.embedded.start()

    def info(self) -> str:
        """One line naming the server, its pgvector and its shared buffers."""
        with self.admin.connect() as conn:
            version = conn.execute(sa.text("SHOW server_version")).scalar()
            vector = conn.execute(
                sa.text("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
            ).scalar()
            buffers = conn.execute(sa.text("SHOW shared_buffers")).scalar()
        where = "embedded server" if self.embedded else "PGMEMORY_DATABASE_URL"
        return f"PostgreSQL {version}, pgvector {vector}, shared_buffers {buffers} ({where})"

    @contextmanager
    def scratch(self, label: str, *, pgmemory_schema: bool = True) -> Iterator[str]:
        """A new database (pgmemory's schema, or just the vector extension); dropped after."""
        name = f"pgmemory_bench_{label}_{uuid.uuid4().hex[:8]}".replace("-", "_")
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = (
            make_url(migrate.normalise_url(self.base))
            .set(database=name)
            .render_as_string(hide_password=False)
        )
        try:
            if pgmemory_schema:
                migrate.upgrade(url)
            else:
                engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
                with engine.connect() as conn:
                    conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
                engine.dispose()
            yield url
        finally:
            with self.admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        """Release the admin connection and the embedded server."""
        self.admin.dispose()
        if self.embedded is not None:
            self.embedded.stop()
