"""A recall audit row names the search's mode when the caller did not describe its own."""

from __future__ import annotations

from sqlalchemy import text

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, RecallTrace
from tests.conftest import unique


async def test_the_audit_row_names_the_mode(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id=unique("u"))
    await store.add(collection, [MemoryRecord(content="I can't eat spicy food", scope=scope)])
    await store.search(collection, scope, query="spicy", mode="text")
    await store.search(collection, scope, query="spicy", mode="hybrid")
    await store.search(
        collection, scope, query="spicy", trace=RecallTrace(provider="app", mode="before_run")
    )
    async with store.engine.connect() as conn:
        modes = (
            (
                await conn.execute(
                    text("SELECT mode FROM pgmemory_recall_audit WHERE user_id = :u ORDER BY id"),
                    {"u": scope.user_id},
                )
            )
            .scalars()
            .all()
        )
    assert modes == ["text", "hybrid", "before_run"]
