"""Scratch databases for the benchmarks: one each, on the embedded server (or on the server
PGMEMORY_DATABASE_URL names), dropped afterwards, so a benchmark never touches real data."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from pgmemory import Settings
from pgmemory.store import migrate
from pgmemory.store.embedded import EmbeddedServer


class Server:
    """The server the benchmarks run on, and scratch databases on it."""

    def __init__(self) -> None:
        settings = Settings()
        self.embedded: EmbeddedServer | None = None
        if settings.database_url is not None:
            self.base = settings.database_url.get_secret_value()
        else:
            self.embedded = EmbeddedServer(settings.data_dir)
            self.base = self.embedded.start()
        self.admin = sa.create_engine(
            migrate.normalise_url(self.base), isolation_level="AUTOCOMMIT"
        )

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
