"""Migrations: upgrade, downgrade, agreement with the models, start-up checks."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from pgmemory.errors import DatabaseNotReadyError
from pgmemory.store import migrate
from pgmemory.store.connector import VERSION_TABLE
from pgmemory.store.migrate import include_object
from pgmemory.store.models import Base
from pgmemory.store.store import MemoryStore

TABLES = {
    "pgmemory_facts",
    "pgmemory_fact_audit",
    "pgmemory_collections",
    "pgmemory_memories",
    "pgmemory_memory_audit",
    "pgmemory_recall_audit",
    "pgmemory_chat_messages",
}


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_then_downgrade_then_upgrade(fresh_database: str) -> None:
    # The host application's own table must survive pgmemory's migrations both ways.
    engine = sa.create_engine(fresh_database)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE host_orders (id int PRIMARY KEY)"))
    engine.dispose()
    assert migrate.current(fresh_database) is None
    migrate.upgrade(fresh_database)
    assert migrate.current(fresh_database) == migrate.head_revision()
    assert TABLES | {VERSION_TABLE, "host_orders"} <= _tables(fresh_database)
    assert "alembic_version" not in _tables(fresh_database)
    migrate.downgrade(fresh_database, "base")
    assert _tables(fresh_database) == {VERSION_TABLE, "host_orders"}
    assert migrate.current(fresh_database) is None
    migrate.upgrade(fresh_database)
    assert TABLES <= _tables(fresh_database)


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={"compare_type": True, "include_object": include_object, "version_table": VERSION_TABLE},
            )
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_embeddings_are_stored_inline(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            storage = conn.execute(
                text(
                    "SELECT attstorage FROM pg_attribute "
                    "WHERE attrelid = 'pgmemory_memories'::regclass AND attname = 'embedding'"
                )
            ).scalar_one()
    finally:
        engine.dispose()
    assert storage == "p"


async def test_missing_extension_says_what_to_run(fresh_database: str) -> None:
    with pytest.raises(DatabaseNotReadyError, match=r"CREATE EXTENSION IF NOT EXISTS vector.*") as info:
        async with MemoryStore(fresh_database):
            pass
    assert "superuser" in str(info.value) and "pgmemory db upgrade" in str(info.value)


async def test_unmigrated_database_says_to_upgrade(fresh_database: str) -> None:
    engine = sa.create_engine(fresh_database)
    with engine.begin() as conn:
        conn.execute(text("CREATE EXTENSION vector"))
    engine.dispose()
    with pytest.raises(DatabaseNotReadyError, match=r"revision None.*pgmemory db upgrade"):
        async with MemoryStore(fresh_database):
            pass
    async with MemoryStore(fresh_database, migrate=True) as store:
        assert await store.list_collections() == []
