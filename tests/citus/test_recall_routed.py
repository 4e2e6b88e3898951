"""On Citus, a recall is one statement that reads and writes only its user's shard.

Without its audit row the statement is one router task. With it (an INSERT ... SELECT in a
CTE, as in every audited search), Citus plans each CTE that reads a table as a subplan of its
own: each is one task on the user's shard, and the statement is still one round trip for the
client. Runs under ``PGMEMORY_TEST_CITUS`` (``make test-citus``); skipped otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

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

    monkeypatch.setattr(store.database, "fetch", recorded)
    got = await store.recall(
        collection,
        scope,
        query="does Bob have allergies?" if mode else None,
        mode=mode or "hybrid",  # type: ignore[arg-type]
        audit=audit,
    )
    monkeypatch.undo()
    assert len(ran) == 1, "a recall is one statement"
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
        statement, params = ran[0]
        plan = "\n".join(
            r[0] for r in await conn.execute(text("EXPLAIN (COSTS OFF) " + statement), dict(params))
        )
        await conn.rollback()
    counts = [int(n) for n in re.findall(r"Task Count: (\d+)", plan)]
    assert counts and set(counts) == {1}, plan  # every task on one shard ...
    shards = set(re.findall(r"pgmemory_memories_(\d+)", plan))
    assert len(shards) == 1, plan  # ... the same one, the user's
    if not audit:
        assert counts == [1] and "Distributed Subplan" not in plan, plan  # a router plan
