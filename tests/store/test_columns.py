"""The memory row's columns are defined once (pgmemory.store.columns); everything derived from
that list must agree with the SQLAlchemy model, the migrated table, and each other."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import text
from sqlalchemy.dialects import postgresql

from pgmemory.store import queries
from pgmemory.store.columns import (
    BATCH_KEYS,
    GENERATED_COLUMNS,
    MEMORY_COLUMNS,
    READ_COLUMNS,
    STAGED_COLUMNS,
    STAGING_COLUMNS,
    STAGING_TYPES,
    copy_fields,
    memory_from_row,
    to_batch,
)
from pgmemory.store.models import MemoryRow
from pgmemory.store.records import CollectionInfo, Memory, MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from pgmemory.store.writes import prepare

#: How the model's types compile for PostgreSQL -> information_schema's udt_name.
_UDT = {
    "UUID": "uuid",
    "TEXT": "text",
    "TSVECTOR": "tsvector",
    "VECTOR": "vector",
    "TIMESTAMP WITH TIME ZONE": "timestamptz",
    "JSONB": "jsonb",
    "INTEGER": "int4",
    "BIT VARYING": "varbit",
}


def test_the_columns_are_the_models_in_order_and_type() -> None:
    dialect = postgresql.dialect()
    columns = MemoryRow.__table__.columns
    staged = dict(STAGED_COLUMNS)
    model = [
        (c.name, _UDT[c.type.compile(dialect=dialect)])
        for c in columns
        if c.computed is None and c.name not in staged
    ]
    assert [(c.name, c.sql_type) for c in MEMORY_COLUMNS] == model
    assert {c.name: _UDT[c.type.compile(dialect=dialect)] for c in columns if c.name in staged} == (
        staged
    )
    generated = [(c.name, _UDT[c.type.compile(dialect=dialect)]) for c in columns if c.computed]
    assert list(GENERATED_COLUMNS) == generated


async def test_the_columns_are_the_migrated_tables(store: MemoryStore) -> None:
    # Names and types; not the order, which migrations that add a column change, and which no
    # statement relies on (every statement names its columns).
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT column_name, udt_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = 'pgmemory_memories'"
                )
            )
        ).all()
    every = {c.name: c.sql_type for c in MEMORY_COLUMNS} | dict(GENERATED_COLUMNS)
    assert every | dict(STAGED_COLUMNS) == dict(rows)
    assert len(rows) == len(MEMORY_COLUMNS) + len(GENERATED_COLUMNS) + len(STAGED_COLUMNS)


async def test_the_staging_table_is_what_copy_sends(store: MemoryStore) -> None:
    async with store.engine.connect() as conn, conn.begin():
        await conn.execute(text(queries.CREATE_STAGING))
        rows = (
            await conn.execute(
                text(
                    "SELECT attname, format_type(atttypid, NULL) FROM pg_attribute "
                    "WHERE attrelid = 'pgmemory_import'::regclass AND attnum > 0 "
                    "ORDER BY attnum"
                )
            )
        ).all()
        await conn.rollback()
    spelled = {"timestamp with time zone": "timestamptz", "integer": "int4"}
    assert [(name, spelled.get(t, t)) for name, t in rows] == list(
        zip(STAGING_COLUMNS, STAGING_TYPES, strict=True)
    )
    assert f"pgmemory_import ({', '.join(STAGING_COLUMNS)})" in queries.COPY_STAGING


def test_every_sent_column_is_a_parameter_of_the_batched_insert() -> None:
    parameters = set(re.findall(r"(?<!:):(\w+)", queries.INSERT_MEMORIES))
    assert set(BATCH_KEYS) | {"collection", "embedding_model", "actor"} == parameters
    # Every table column is written by both inserts.
    for statement in (queries.INSERT_MEMORIES, queries.INSERT_FROM_STAGING):
        listed = re.search(r"INSERT INTO pgmemory_memories \(([^)]*)\)", statement)
        assert listed is not None
        assert listed.group(1).split(", ") == [c.name for c in MEMORY_COLUMNS]


def test_read_columns_make_a_memory() -> None:
    fields = {f.name for f in dataclasses.fields(Memory)}
    assert {c.name for c in READ_COLUMNS if c.memory == "field"} | {"scope"} == fields
    assert {c.name for c in READ_COLUMNS if c.memory == "scope"} == set(MemoryScope.DIMENSIONS)
    row = {c.name: f"v-{c.name}" for c in READ_COLUMNS} | {"agent_id": ""}
    memory = memory_from_row(row)
    assert memory.scope == MemoryScope(
        user_id="v-user_id", application_id="v-application_id", session_id="v-session_id"
    )
    assert memory.content == "v-content" and memory.metadata == "v-metadata"


async def test_prepared_rows_carry_exactly_the_sent_columns() -> None:
    info = CollectionInfo(name="c", dimensions=3, embedding_model="m", created_at=datetime.now(UTC))
    records = [
        MemoryRecord(content=f"hello {i}", scope=MemoryScope(user_id="u"), embedding=np.ones(3))
        for i in range(2)
    ]
    rows = await prepare(None, info, records, max_chars=100, actor=None, allow_unscoped=False)  # type: ignore[arg-type]
    assert [set(row) for row in rows] == [set(STAGING_COLUMNS)] * 2
    assert len(copy_fields(rows[0])) == len(STAGING_TYPES)
    batch = to_batch(rows)
    assert list(batch) == list(BATCH_KEYS)
    assert batch["contents"] == ["hello 0", "hello 1"] and batch["terms"] == ["hello 0", "hello 1"]
