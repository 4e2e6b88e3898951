"""The store's database: where it is, its life cycle, and how statements get a connection.

:class:`Database` resolves the URL (starting or reusing the embedded server when none is
given), optionally migrates, checks the schema, and holds the pooled engine. Every other store
module takes a connection from it in one of two ways:

* :meth:`Database.transaction` for writes and audited reads: one transaction, committed on
  success, rolled back on error;
* :meth:`Database.autocommit` for plain reads and for DDL that must run outside a transaction
  (``CREATE INDEX CONCURRENTLY``): no BEGIN/COMMIT round trips, and no ROLLBACK, after which
  psycopg would drop its prepared statements.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from pgmemory.settings import Settings
from pgmemory.store import migrate as migrations
from pgmemory.store.connector import check_database, make_engine
from pgmemory.store.embedded import EmbeddedServer


class Database:
    """A PostgreSQL database holding pgmemory's schema, reached through a pooled async engine.

    Args:
        url: A libpq or SQLAlchemy URL; None to use the embedded server under
            ``settings.data_dir``.
        settings: Pool sizes, timeouts, the data directory.
        migrate: Upgrade the schema to head when opening.
    """

    def __init__(self, url: str | None, *, settings: Settings, migrate: bool) -> None:
        self.settings = settings
        self._url = url
        #: The URL in use once open (the embedded server's when no URL was given).
        self._resolved_url: str | None = url
        self._migrate = migrate
        self._server: EmbeddedServer | None = None
        self._engine: AsyncEngine | None = None

    async def open(self) -> None:
        """Connect (starting the embedded server if needed), optionally migrate, then check.

        Raises:
            DatabaseNotReadyError: pgvector or pgmemory's schema (at this version's head) is
                missing.
            MissingExtraError: No URL is set and the embedded server is not installed.
        """
        if self._engine is not None:
            return
        url = self._url
        if url is None:
            self._server = EmbeddedServer(self.settings.data_dir)
            url = await asyncio.to_thread(self._server.start)
        self._resolved_url = url
        try:
            if self._migrate:
                await asyncio.to_thread(migrations.upgrade, url)
            self._engine = make_engine(url, self.settings)
            await check_database(self._engine, expected_revision=migrations.head_revision())
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the pool; release the embedded server (stopped when no process uses it)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.dispose()
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.stop)

    async def migrate(self) -> None:
        """Upgrade the schema to this version's head.

        Raises:
            RuntimeError: The URL is not known yet (the embedded server's is known once open).
        """
        if self._resolved_url is None:
            raise RuntimeError("open the store first (the embedded server's URL is known then)")
        await asyncio.to_thread(migrations.upgrade, self._resolved_url)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL in use (password included: don't log it)."""
        if self._resolved_url is None:
            raise RuntimeError("the store is not open yet: its embedded server has no URL")
        return self._resolved_url

    @property
    def engine(self) -> AsyncEngine:
        """The pooled async engine."""
        if self._engine is None:
            raise RuntimeError("the store is not open: use `async with MemoryStore(...)`")
        return self._engine

    def transaction(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """A connection in one transaction: committed when the block ends, rolled back on error."""
        return self.engine.begin()

    @contextlib.asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A connection in autocommit: each statement commits on its own (see the module doc)."""
        async with self.engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")
