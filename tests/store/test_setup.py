"""How a store finds its database: a URL, the application's own engine, or (explicitly) the
embedded server."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.embedders import CachedEmbedder
from pgmemory.errors import DatabaseNotReadyError, InvalidInputError
from pgmemory.store._engine.connector import normalise_url


async def test_an_applications_own_engine(database_url: str, embedder: CachedEmbedder) -> None:
    engine = create_async_engine(normalise_url(database_url))
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    name = f"engine_{uuid.uuid4().hex[:8]}"
    scope = MemoryScope(user_id="u")
    async with MemoryStore(engine=engine, settings=settings, embedder=embedder) as store:
        assert store.engine is engine
        await store.create_collection(name)
        await store.add(name, [MemoryRecord(content="I can't eat spicy food", scope=scope)])
        hits = await store.search(name, scope, query="spicy")
        assert [h.memory.content for h in hits] == ["I can't eat spicy food"]
    # The engine is still the application's, and still works; opening again is fine.
    async with engine.connect() as conn:
        assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
    async with MemoryStore(engine=engine, settings=settings, embedder=embedder) as store:
        assert await store.count(name, scope) == 1
    await engine.dispose()


def test_a_url_and_an_engine_together_are_refused(database_url: str) -> None:
    with pytest.raises(InvalidInputError, match="both"):
        MemoryStore(database_url, engine=create_async_engine("postgresql+psycopg://x@127.0.0.1/x"))


async def test_embedded_off_makes_a_missing_url_an_error(tmp_path: Path) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path / "pgdata")  # type: ignore[call-arg]
    store = MemoryStore(settings=settings, embedded=False)
    with pytest.raises(DatabaseNotReadyError, match="PGMEMORY_DATABASE_URL"):
        await store.open()
    assert not (tmp_path / "pgdata").exists()  # nothing was started or written


async def test_the_embedded_default_says_where_it_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, embedder: CachedEmbedder
) -> None:
    settings = Settings(_env_file=None, data_dir=tmp_path / "pgdata")  # type: ignore[call-arg]
    with caplog.at_level(logging.WARNING, logger="pgmemory.store._engine.connections"):
        async with MemoryStore(settings=settings, embedder=embedder, migrate=True):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(tmp_path / "pgdata") in w and "PGMEMORY_EMBEDDED" in w for w in warnings)
