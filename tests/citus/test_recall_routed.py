"""On Citus, a recall reads and writes only its user's shard, each statement one router task.

The recall is one statement; with its audit row, that row is a second statement of the same
transaction (an ``INSERT ... VALUES`` Citus routes to the user's shard), because Citus would
run a recall-and-insert statement in steps: the CTEs as subplans whose results it copies to
every worker, the insert through the coordinator, then two-phase commit. Runs under
``PGMEMORY_TEST_CITUS`` (``make test-citus``); skipped otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from tests.citus import cluster
from tests.conftest import unique

pytestmark = pytest.mark.skipif(not cluster.enabled(), reason="needs PGMEMORY_TEST_CITUS")

T0 = datetime(2026, 11, 1, tzinfo=UTC)


async def _seed(store: MemoryStore, collection: str, scope: MemoryScope) -> None:
    texts = [
        ("Bob has a severe peanut allergy", "user"),
        ("Noted, no peanuts for Bob.", "assistant"),
        ("I ordered the green curry last time", "user"),
        ("The curry came from Thai Palace.", "assistant"),
        ("Order something for Bob and me", "user"),
        ("Which dish would you like?", "assistant"),
    ]
    await store.add(
        collection,
        [
            MemoryRecord(content=c, scope=scope, role=r, created_at=T0 + timedelta(minutes=i))
            for i, (c, r) in enumerate(texts)
        ],
    )


@pytest.mark.parametrize("audit", [True, False])
@pytest.mark.parametrize("mode", ["hybrid", "vector", "text", None])
async def test_a_recall_is_one_statement_on_its_users_shard(
    store: MemoryStore,
    collection: str,
    mode: str | None,
    audit: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scope = MemoryScope(user_id=unique("u"))
    other = MemoryScope(user_id=unique("u"))
    await _seed(store, collection, scope)
    await _seed(store, collection, other)
    ran: list[tuple[str, Mapping[str, Any]]] = []
    fetch = store.database.fetch

    async def recorded(
        statement: str, params: Mapping[str, Any], **options: Any
    ) -> list[dict[str, Any]]:
        ran.append((statement, params))
        return await fetch(statement, params, **options)

    executed: list[tuple[str, Mapping[str, Any]]] = []

    def on_execute(*args: Any) -> None:  # (conn, cursor, statement, parameters, ...)
        if "pgmemory_" in args[2] and "pg_advisory" not in args[2]:
            executed.append((args[2], args[3]))

    monkeypatch.setattr(store.database, "fetch", recorded)
    event.listen(store.engine.sync_engine, "before_cursor_execute", on_execute)
    try:
        got = await store.recall(
            collection,
            scope,
            query="does Bob have allergies?" if mode else None,
            mode=mode or "hybrid",  # type: ignore[arg-type]
            audit=audit,
        )
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", on_execute)
        monkeypatch.undo()
    statements = [(s, p, False) for s, p in ran] + [(s, p, True) for s, p in executed]
    assert len(statements) == (2 if audit else 1), [s[:60] for s, _, _ in statements]
    assert "INSERT" not in statements[0][0]  # the recall itself writes nothing ...
    if audit:  # ... its audit row is the second statement
        assert statements[1][0].lstrip().startswith("INSERT INTO pgmemory_recall_audit")
    assert got.items and {i.memory.scope.user_id for i in got.items} == {scope.user_id}
    if mode:
        assert got.items[0].memory.content == "Bob has a severe peanut allergy"
    async with store.engine.connect() as conn:
        audited = (
            await conn.execute(
                text("SELECT memory_ids, reasons FROM pgmemory_recall_audit WHERE user_id = :u"),
                {"u": scope.user_id},
            )
        ).all()
        if audit:
            [row] = audited
            assert list(row.memory_ids) == got.memory_ids
            assert list(row.reasons) == [i.reason for i in got.items]
        else:
            assert audited == []
        plans = []
        for statement, params, raw in statements:
            explain = "EXPLAIN (COSTS OFF) " + statement
            result = (
                await conn.exec_driver_sql(explain, dict(params))
                if raw
                else await conn.execute(text(explain), dict(params))
            )
            plans.append("\n".join(r[0] for r in result))
        await conn.rollback()
    for plan, table in zip(plans, ["pgmemory_memories", "pgmemory_recall_audit"], strict=False):
        # one router task, on one shard of its table (the user's)
        assert re.findall(r"Task Count: (\d+)", plan) == ["1"], plan
        assert "Distributed Subplan" not in plan, plan
        assert len(set(re.findall(rf"{table}_(\d+)", plan))) == 1, plan
