"""The fast path: an exact search is one prepared statement on psycopg directly, audited in the
same statement, and answers exactly what the SQLAlchemy path answers."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg.adapt import PyFormat
from sqlalchemy import exc as sa_exc, text
from sqlalchemy.exc import DBAPIError

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.store import queries as q
from pgmemory.store._ranking.recall import recall_memories
from pgmemory.store._ranking.search import search_memories
from pgmemory.store.modes import SEARCH_MODES

DIM = 8


async def _audit(store: MemoryStore, user_id: str) -> list[list[uuid.UUID]]:
    async with store.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")  # no ROLLBACK after
        rows = await conn.execute(
            text("SELECT memory_ids FROM pgmemory_recall_audit WHERE user_id = :u ORDER BY id"),
            {"u": user_id},
        )
        return [list(r[0]) for r in rows.all()]


async def test_search_is_one_prepared_statement_that_writes_its_audit_row(
    database_url: str,
) -> None:
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    rng = np.random.default_rng(3)
    collection = f"f_{uuid.uuid4().hex[:10]}"
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    async with MemoryStore(database_url, settings=settings) as store:
        await store.create_collection(collection, dimensions=DIM, embedding_model="test")
        vectors = rng.standard_normal((30, DIM)).astype(np.float32)
        await store.add(
            collection,
            [
                MemoryRecord(content=f"m{i}", scope=scope, embedding=v)
                for i, v in enumerate(vectors)
            ],
        )
        query = rng.standard_normal(DIM).astype(np.float32)
        for _ in range(2):
            hits = await store.search(collection, scope, vector=query, limit=3)
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        expected = np.argsort(-(unit @ (query / np.linalg.norm(query))))[:3]
        assert [hit.memory.content for hit in hits] == [f"m{i}" for i in expected]
        assert await _audit(store, scope.user_id or "") == [[hit.memory.id for hit in hits]] * 2
        # One pooled connection: the searches ran on it, prepared on their first run.
        async with store.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            prepared = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_prepared_statements "
                        "WHERE statement LIKE '%INSERT INTO pgmemory_recall_audit%'"
                    )
                )
            ).scalar_one()
        assert prepared == 1


async def test_fast_and_transactional_paths_answer_alike(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    texts = ["I love green tea", "my dog is called Rex", "I work night shifts", "tea gives me calm"]
    await store.add(collection, [MemoryRecord(content=t, scope=scope) for t in texts])
    for mode in SEARCH_MODES:
        fast = await store.search(collection, scope, query="tea", mode=mode, limit=3)
        async with store.shared_transaction():  # joins the block's transaction: SQLAlchemy path
            joined = await store.search(collection, scope, query="tea", mode=mode, limit=3)
        assert [(h.memory.id, h.score) for h in fast] == [(h.memory.id, h.score) for h in joined]
    audited = await _audit(store, scope.user_id or "")
    assert len(audited) == 2 * len(SEARCH_MODES)


async def test_errors_hide_parameters_and_leave_the_connection_usable(
    store: MemoryStore, collection: str
) -> None:
    secret = "diagnosed with diabetes"
    with pytest.raises(DBAPIError) as raised:
        await store._db.fetch("SELECT CAST(:note AS text), 1 / 0", {"note": secret})
    assert "division by zero" in str(raised.value)
    assert not raised.value.connection_invalidated
    assert secret not in str(raised.value) and secret not in repr(raised.value)
    # The pooled connection is back out of autocommit: a failed write still rolls back whole.
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    await store.add(collection, [MemoryRecord(content="kept", scope=scope)])
    assert await store.count(collection, scope) == 1


async def test_a_connection_keeps_one_cursor_and_each_statement_reads_its_own_rows(
    store: MemoryStore,
) -> None:
    """The fast path runs every statement on its connection's own cursor: rows, no rows, a
    failed statement and a pipeline on it leave nothing of theirs to the next statement."""
    from pgmemory.store._engine import fastpath

    async with store.database.connections.driver_autocommit() as conn:
        first = fastpath.own_cursor(conn)
        assert fastpath.own_cursor(conn) is first
        assert await fastpath.run(conn, "SELECT CAST(:a AS int) AS a", {"a": 1}) == [{"a": 1}]
        assert await fastpath.run(conn, "SELECT 1 AS a WHERE false", {}) == []
        with pytest.raises(sa_exc.DataError) as failed:  # the driver's error, as SQLAlchemy's
            await fastpath.run(conn, "SELECT 1 / CAST(:z AS int) AS b", {"z": 0})
        assert isinstance(failed.value.orig, psycopg.errors.DivisionByZero)
        assert await fastpath.run(conn, "SELECT CAST(:a AS int) AS a", {"a": 2}) == [{"a": 2}]
        got = await fastpath.run(
            conn, "SELECT CAST(:b AS text) AS b", {"b": "x"}, lock_users=("someone",)
        )
        assert got == [{"b": "x"}]
        assert fastpath.own_cursor(conn) is first
        await first.close()
        assert fastpath.own_cursor(conn) is not first
        assert await fastpath.run(conn, "SELECT CAST(:a AS int) AS a", {"a": 3}) == [{"a": 3}]


def test_a_durable_audit_commits_as_the_server_is_configured() -> None:
    relaxed = search_memories(("user_id",), covering=True, audit=True, relax_commit=True)
    durable = search_memories(("user_id",), covering=True, audit=True)
    assert "set_config('synchronous_commit', 'off', true)" in relaxed
    assert "synchronous_commit" not in durable
    assert "set_config('synchronous_commit', 'off', true)" in q.record_recall(relax_commit=True)
    assert "synchronous_commit" not in q.record_recall(relax_commit=False)


async def test_a_recorded_recall_commits_alone_or_with_its_block(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    records = [MemoryRecord(content=text, scope=scope) for text in ("one", "two")]
    ids = await store.add(collection, records)
    await store.record_recall(collection, scope, memory_ids=ids, scores=[0.5, 0.25], query="q")
    with pytest.raises(RuntimeError):
        async with store.shared_transaction():
            await store.record_recall(collection, scope, memory_ids=ids[:1], scores=[1], query="q")
            raise RuntimeError("the block fails: its recall record rolls back")
    assert await _audit(store, scope.user_id or "") == [ids]


async def test_a_cancelled_statement_leaves_the_pool_usable(database_url: str) -> None:
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    async with MemoryStore(database_url, settings=settings) as store:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(store._db.fetch("SELECT pg_sleep(5)", {}), 0.2)
        # The one pooled connection (or its replacement) answers, in a transaction again.
        assert await store._db.fetch("SELECT 1 AS one", {}) == [{"one": 1}]
        async with store.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            assert raw is not None and not raw.autocommit


async def test_recalls_inside_a_shared_transaction_leave_the_turn_durable(
    store: MemoryStore, collection: str
) -> None:
    # The relaxed commit is for a recall's own audit row; inside a shared transaction the row
    # commits with the turn's writes, which must keep the server's synchronous_commit.
    scope = MemoryScope(user_id=f"u-{uuid.uuid4().hex[:8]}")
    await store.add(collection, [MemoryRecord(content="kept", scope=scope)])
    async with store.shared_transaction():
        await store.add(collection, [MemoryRecord(content="the turn", scope=scope)])
        await store.search(collection, scope, query="kept", mode="text", limit=1)
        await store.record_recall(collection, scope, memory_ids=[], scores=[], query="q")
        async with store._db.write() as conn:
            setting = (await conn.execute(text("SHOW synchronous_commit"))).scalar_one()
    assert setting == "on"
    assert await store.count(collection, scope) == 2


def _array_casts() -> set[tuple[str, str]]:
    """Every ``CAST(:name AS type[])`` of the store's statements (the module's constants and
    the statements its builders make for a user scope), as (parameter, type)."""
    import importlib
    import pkgutil
    import re

    from pgmemory.store import _ranking

    wing = [
        importlib.import_module(f"{_ranking.__name__}.{m.name}")
        for m in pkgutil.iter_modules(_ranking.__path__)
    ]
    modules = [q, *wing]
    texts = [v for m in modules for v in vars(m).values() if isinstance(v, str)]
    for mode in SEARCH_MODES:
        neighbours = mode == "hybrid"
        texts.append(
            search_memories(
                ("user_id",), covering=True, audit=True, mode=mode, neighbours=neighbours
            )
        )
        texts.append(recall_memories(("user_id",), covering=True, mode=mode, neighbours=neighbours))
    return {
        (name, kind)
        for statement in texts
        for name, kind in re.findall(r"CAST\(:(\w+) AS ([a-z0-9_ ]+)\[\]\)", statement)
    }


def test_array_parameters_are_sent_as_their_casts_type() -> None:
    from pgmemory.store._engine.binary import ARRAY_TYPES
    from pgmemory.store._engine.fastpath import driver_statement

    casts = _array_casts()
    assert ("users", "text") in casts and ("embeddings", "vector") in casts
    for statement in (q.LOCK_FOR_WRITE, q.INSERT_MEMORIES, q.APPEND_HISTORY):
        sent = driver_statement(statement)
        named = {name: kind for name, kind in casts if f"CAST(:{name} AS" in statement}
        assert named and sent.arrays == {n: ARRAY_TYPES[k] for n, k in named.items()}, statement
        values = sent.values({key: ["x"] for key in sent.names})
        assert [type(v) for v in values] == [
            ARRAY_TYPES[named[n]] if n in named else list for n in sent.names
        ]


def test_an_array_cast_without_a_class_is_refused() -> None:
    from pgmemory.store._engine.fastpath import driver_statement

    with pytest.raises(ValueError, match=r"no array parameter class for money\[\]"):
        driver_statement("SELECT CAST(:amounts AS money[])")


def test_a_statement_is_sent_with_numbered_placeholders() -> None:
    """Each parameter becomes one ``$n`` (a repeated one the same), ``::`` casts and ``%``
    stay as written, and the values follow the numbers."""
    from pgmemory.store._engine.fastpath import driver_statement

    sent = driver_statement(
        "SELECT CAST(:b AS text[]), CAST(:a AS text), 'y'::text, :b, '100%' WHERE :a <> 'a%'"
    )
    assert sent.sql == (
        "SELECT CAST($1 AS text[]), CAST($2 AS text), 'y'::text, $1, '100%' WHERE $2 <> 'a%'"
    )
    assert sent.names == ("b", "a") and set(sent.arrays) == {"b"}
    assert sent.values({"a": "x", "b": None, "c": 1}) == [None, "x"]


async def test_empty_and_null_arrays_of_every_sent_type_cast_in_binary(store: MemoryStore) -> None:
    """An empty list, or one of NULLs, has no element type of its own: sent in binary it must
    still cast to each array type a statement names (as the text form did)."""
    kinds = sorted({kind for _, kind in _array_casts()})
    from pgmemory.store._engine.binary import array

    async with store.database.connections.driver_autocommit() as conn:
        for kind in kinds:
            for value in ([], [None]):
                cursor = psycopg.AsyncRawCursor(conn)
                await cursor.execute(f"SELECT CAST($1 AS {kind}[])", [array(kind, value)])
                assert (await cursor.fetchone()) == (value,), kind


async def test_arrays_of_every_element_type_read_back_as_sent(store: MemoryStore) -> None:
    """Each element type's binary form, NULLs among the values, and a numpy vector alone: the
    server reads back what was sent (text beyond ASCII, a float only positional notation keeps,
    a time in another zone, a vector given as numpy or as pgvector's ``Vector``)."""
    from datetime import datetime, timedelta, timezone

    from pgvector import Vector

    from pgmemory.store._engine.binary import ARRAY_TYPES, array
    from pgmemory.store.jsonb import jsonb

    zone = timezone(timedelta(hours=-5, minutes=-30))
    vector = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    cases: dict[str, tuple[list[Any], list[Any]]] = {
        "text": (["Zoë 🍜", None, ""], ["Zoë 🍜", None, ""]),
        "uuid": ([uuid.UUID(int=7), None, str(uuid.UUID(int=9))], [uuid.UUID(int=7), None, uuid.UUID(int=9)]),
        "jsonb": ([jsonb({"a": [1, 1e300]}), None, jsonb("x")], [{"a": [1, 1e300]}, None, "x"]),
        "int4": ([-(2**31), None, 7], [-(2**31), None, 7]),
        "bigint": ([2**62, None], [2**62, None]),
        "real": ([0.5, None], [0.5, None]),
        "timestamptz": (
            [datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=zone), None],
            [datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=zone), None],
        ),
        "vector": ([vector, None, Vector([1.0, 2.5, -3.0])], [Vector(vector.tolist()), None, Vector([1.0, 2.5, -3.0])]),
    }  # fmt: skip
    assert set(cases) == set(ARRAY_TYPES)
    async with store.database.connections.driver_autocommit() as conn:
        dumper = conn.adapters.get_dumper(np.ndarray, PyFormat.AUTO)
        assert dumper.__module__ == "pgmemory.store._engine.binary", dumper
        cursor = psycopg.AsyncRawCursor(conn)
        await cursor.execute("SELECT CAST($1 AS vector)", [vector])
        assert (await cursor.fetchone()) == (Vector(vector.tolist()),)
        for kind, (sent, expected) in cases.items():
            cursor = psycopg.AsyncRawCursor(conn)
            await cursor.execute(f"SELECT CAST($1 AS {kind}[])", [array(kind, sent)])
            (got,) = await cursor.fetchone()  # type: ignore[misc]
            assert got == expected, kind


def test_one_users_lock_is_the_short_statement() -> None:
    """A search or recall locks one user: the one-lock statement. Several users, or any
    session, take LOCK_FOR_WRITE with each kind sorted."""
    from pgmemory.store._engine.fastpath import lock_statement

    assert lock_statement(["u"]) == (q.LOCK_USER_SHARED, {"user_id": "u"})
    assert lock_statement(["b", "a"]) == (
        q.LOCK_FOR_WRITE,
        {"users": ["a", "b"], "session_users": [], "sessions": []},
    )
    assert lock_statement(["u"], [("u", "s2"), ("u", "s1")]) == (
        q.LOCK_FOR_WRITE,
        {"users": ["u"], "session_users": ["u", "u"], "sessions": ["s1", "s2"]},
    )
