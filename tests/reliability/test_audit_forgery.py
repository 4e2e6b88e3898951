"""An audit row needs the change it records (migration 0023): as the schema's owner and as the
least-privilege role, in SQL as an attacker holding the role's credentials would write it, a
row that no change of its own transaction justifies is refused, on each of the three audit
tables, and ``audit verify`` still passes after every attempt. The same rows, written beside
the change they record, are accepted: the guard checks, it does not forbid.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from pgmemory.admin import Admin
from tests.conftest import unique

DIMENSIONS = 3

_MEMORY_AUDIT = (
    "INSERT INTO pgmemory_memory_audit (user_id, operation, memory_id, collection, "
    "application_id, agent_id, session_id, content_sha256, actor) "
    "VALUES (:user, :operation, :memory, :collection, '', '', '', repeat('0', 64), 'attacker')"
)
_FACT_AUDIT = (
    "INSERT INTO pgmemory_fact_audit (user_id, application_id, agent_id, session_id, namespace, "
    "key, old_value, new_value, actor) "
    "VALUES (:user, '', '', '', 'profile', 'city', NULL, CAST(:value AS jsonb), 'attacker')"
)
_RECALL_AUDIT = (
    "INSERT INTO pgmemory_recall_audit (user_id, collection, application_id, agent_id, "
    "session_id, query_sha256, memory_ids, scores) "
    "VALUES (:user, :collection, '', '', '', repeat('0', 64), CAST(:ids AS uuid[]), :scores)"
)


async def _victim(database_url: str) -> dict[str, Any]:
    """A user with one memory (never deleted) and one fact (never changed since)."""
    user, collection = unique("victim"), f"c_{uuid.uuid4().hex[:10]}"
    scope = MemoryScope(user_id=user)
    async with MemoryStore(database_url) as store:
        await store.create_collection(collection, dimensions=DIMENSIONS, embedding_model="t:3")
        [memory] = await store.add(
            collection, [MemoryRecord(content="x", scope=scope, embedding=[1, 0, 0])]
        )
        await store.merge_facts("profile", scope, {"city": "Lyon"})
    return {"user": user, "collection": collection, "memory": memory}


def _audit_count(database_url: str) -> int:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            return sum(
                conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
                for table in (
                    "pgmemory_memory_audit",
                    "pgmemory_recall_audit",
                    "pgmemory_fact_audit",
                )
            )
    finally:
        engine.dispose()


def _refused(engine: sa.Engine, *statements: tuple[str, dict[str, Any]]) -> str:
    """Run ``statements`` in one transaction, which must fail; the refusal's message."""
    with pytest.raises(sa.exc.DBAPIError) as refused, engine.begin() as conn:
        for statement, params in statements:
            conn.execute(sa.text(statement), params)
    return str(refused.value.orig)


async def test_a_row_no_change_justifies_is_refused_on_every_audit_table(
    database_url: str, role_engine: sa.Engine
) -> None:
    victim = await _victim(database_url)
    other = await _victim(database_url)
    before = _audit_count(database_url)
    memory = victim  # the parameters of its memory's audit rows
    attempts = {
        # the finding: a delete record of a memory that was never deleted
        "a delete of a live memory": [(_MEMORY_AUDIT, {**memory, "operation": "delete"})],
        "an expiry of a live memory": [(_MEMORY_AUDIT, {**memory, "operation": "expire"})],
        "a second insert of a stored memory": [(_MEMORY_AUDIT, {**memory, "operation": "insert"})],
        "an insert of a memory never stored": [
            (_MEMORY_AUDIT, {**memory, "memory": uuid.uuid4(), "operation": "insert"})
        ],
        "a delete of a memory never stored": [
            (_MEMORY_AUDIT, {**memory, "memory": uuid.uuid4(), "operation": "delete"})
        ],
        "a fact change that was not made": [
            (_FACT_AUDIT, {"user": victim["user"], "value": '"Paris"'})
        ],
        "a fact change claimed beside another change": [
            (
                'UPDATE pgmemory_facts SET facts = facts || \'{"pet": "cat"}\' '
                "WHERE user_id = :user AND namespace = 'profile'",
                {"user": victim["user"]},
            ),
            (_FACT_AUDIT, {"user": victim["user"], "value": '"Paris"'}),
        ],
        "a recall of another user's memory": [
            (
                _RECALL_AUDIT,
                {
                    "user": victim["user"],
                    "collection": victim["collection"],
                    "ids": [other["memory"]],
                    "scores": [0.9],
                },
            )
        ],
        "a recall of a memory never stored": [
            (
                _RECALL_AUDIT,
                {
                    "user": victim["user"],
                    "collection": victim["collection"],
                    "ids": [uuid.uuid4()],
                    "scores": [0.9],
                },
            )
        ],
    }
    for what, statements in attempts.items():
        message = _refused(role_engine, *statements)
        assert message.startswith("pgmemory: "), (what, message)
        assert "row refused" in message, (what, message)
        assert victim["user"] not in message, what  # no user id in the refusal
    assert _audit_count(database_url) == before
    async with MemoryStore(database_url) as owner:
        report = await Admin(owner).verify_audit()
    assert report.ok, report.problems


async def test_a_deletion_in_an_earlier_transaction_justifies_no_row_now(
    database_url: str, role_engine: sa.Engine
) -> None:
    """The evidence of a deletion is its own transaction's: deleting a memory without its
    audit row, then writing the row later, is refused (and the unaudited deletion stays
    visible to ``audit verify``)."""
    memory = await _victim(database_url)
    with role_engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM pgmemory_memories WHERE user_id = :user AND id = :memory"), memory
        )
    try:
        _refused(role_engine, (_MEMORY_AUDIT, {**memory, "operation": "delete"}))
        async with MemoryStore(database_url) as owner:
            report = await Admin(owner).verify_audit()
        assert not report.ok
        [problem] = report.problems
        assert problem.name == "deletions"
        assert problem.detail.startswith("1 memory(ies) deleted with no audit row"), problem
    finally:  # the shared database's audit verifies again for the tests after this one
        owner_engine = sa.create_engine(database_url)
        with owner_engine.begin() as conn:
            conn.execute(
                sa.text("DELETE FROM pgmemory_deleted_memories WHERE user_id = :user"), memory
            )
        owner_engine.dispose()


async def test_the_same_rows_beside_their_change_are_accepted(
    database_url: str, role_engine: sa.Engine
) -> None:
    """What the guard asks is the change itself: a deletion, a fact change and a recall written
    by hand beside their rows (as the library writes them) are accepted, once."""
    memory = await _victim(database_url)
    with role_engine.begin() as conn:
        conn.execute(
            sa.text(_RECALL_AUDIT),
            {**memory, "ids": [memory["memory"]], "scores": [1.0]},
        )
        conn.execute(
            sa.text(
                'UPDATE pgmemory_facts SET facts = facts || \'{"city": "Paris"}\' '
                "WHERE user_id = :user AND namespace = 'profile'"
            ),
            memory,
        )
        conn.execute(sa.text(_FACT_AUDIT), {"user": memory["user"], "value": '"Paris"'})
        conn.execute(
            sa.text("DELETE FROM pgmemory_memories WHERE user_id = :user AND id = :memory"), memory
        )
        conn.execute(sa.text(_MEMORY_AUDIT), {**memory, "operation": "delete"})
    # one deletion justifies one row
    _refused(role_engine, (_MEMORY_AUDIT, {**memory, "operation": "delete"}))
    # a recall that showed the memory before its deletion committed is still recorded
    with role_engine.begin() as conn:
        conn.execute(
            sa.text(_RECALL_AUDIT),
            {**memory, "ids": [memory["memory"]], "scores": [1.0]},
        )
    async with MemoryStore(database_url) as owner:
        report = await Admin(owner).verify_audit()
    assert report.ok, report.problems
