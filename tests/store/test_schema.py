"""Migrations: upgrade, downgrade, agreement with the models, start-up checks."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from pgmemory.errors import DatabaseNotReadyError
from pgmemory.store import migrate
from pgmemory.store._engine.connector import VERSION_TABLE
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
    assert _tables(fresh_database) >= TABLES


def test_models_and_migrations_agree(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_object": include_object,
                    "version_table": VERSION_TABLE,
                },
            )
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_embeddings_are_stored_inline_while_the_row_fits(database_url: str) -> None:
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
    assert storage == "m"  # MAIN: inline unless the row cannot fit a page (migration 0008)


async def test_missing_extension_says_what_to_run(fresh_database: str) -> None:
    with pytest.raises(
        DatabaseNotReadyError, match=r"CREATE EXTENSION IF NOT EXISTS vector.*"
    ) as info:
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


def test_0003_keeps_the_oldest_copy_of_a_repeated_message(fresh_database: str) -> None:
    migrate.upgrade(fresh_database, "0002")
    engine = sa.create_engine(fresh_database)
    insert = text(
        "INSERT INTO pgmemory_memories (id, user_id, collection, role, message_id, content, content_sha256,"
        " embedding, embedding_model, created_at) VALUES (gen_random_uuid(), 'u', 'c', 'user', :mid, :content,"
        " repeat('0', 64), '[1,0]', 'm', :at)"
    )
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO pgmemory_collections VALUES ('c', 2, 'm')"))
        for content, mid, at in [
            ("old", "m1", "2025-01-01"),
            ("dup", "m1", "2025-02-01"),
            ("other", "m2", "2025-01-01"),
        ]:
            conn.execute(insert, {"mid": mid, "content": content, "at": at})
    migrate.upgrade(fresh_database)
    with engine.connect() as conn:
        contents = (
            conn.execute(text("SELECT content FROM pgmemory_memories ORDER BY content"))
            .scalars()
            .all()
        )
        audit = conn.execute(text("SELECT operation, actor FROM pgmemory_memory_audit")).all()
    engine.dispose()
    assert contents == ["old", "other"]
    assert audit == [("delete", "migration 0003: duplicate message")]
