"""The admin plane's readers against a real PostgreSQL: users, pages, recalls, audit, retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.admin import Admin, pages, statements
from pgmemory.errors import InvalidInputError
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import unique
from tests.ui.conftest import SCRIPT_MEMORY, Seeded, random_vectors


async def test_users_index_counts_and_walks_in_pages(store: MemoryStore, seeded: Seeded) -> None:
    page = await Admin(store).list_users(after=seeded.user[:-1], limit=200)
    mine = next(u for u in page.users if u.user_id == seeded.user)
    assert mine.memories == {seeded.collection: 3}
    assert mine.recalls == 2
    assert mine.last_activity is not None
    # Pages of one follow each other in id order, without repeats; a user known only from
    # the audit (all memories deleted) is listed too.
    other = seeded.user + "~later"
    [gone] = await store.add(
        seeded.collection, [MemoryRecord(content="x", scope=MemoryScope(user_id=other))]
    )
    await store.delete(seeded.collection, ids=[gone], scope=MemoryScope(user_id=other))
    first = await Admin(store).list_users(after=seeded.user[:-1], limit=1)
    second = await Admin(store).list_users(after=first.next_after or "", limit=1)
    assert [u.user_id for u in first.users] == [seeded.user] and first.next_after == seeded.user
    assert [(u.user_id, u.total_memories) for u in second.users] == [(other, 0)]


async def test_memories_page_newest_first_with_keyset_cursors(
    store: MemoryStore, collection: str
) -> None:
    user = unique("many")
    base = datetime(2024, 1, 1, tzinfo=UTC)
    vectors = random_vectors(120, seed=3)
    await store.add(
        collection,
        [
            MemoryRecord(
                content=f"note {i}",
                scope=MemoryScope(user_id=user),
                embedding=v,
                created_at=base + timedelta(minutes=i),
            )
            for i, v in enumerate(vectors)
        ],
    )
    seen: list[str] = []
    page = await Admin(store).user_memories(user, collection, limit=50)
    assert page.newer is None
    while True:
        seen += [m.content for m in page.items]
        if page.older is None:
            break
        page = await Admin(store).user_memories(user, collection, before=page.older, limit=50)
    assert seen == [f"note {i}" for i in range(119, -1, -1)]
    # Going back from the last page gives the middle page again.
    back = await Admin(store).user_memories(user, collection, after=page.newer, limit=50)
    assert [m.content for m in back.items] == [f"note {i}" for i in range(69, 19, -1)]
    assert back.older is not None and back.newer is not None
    # A page never exceeds MAX_PAGE, whatever is asked.
    huge = await Admin(store).user_memories(user, collection, limit=10**9)
    assert len(huge.items) == 120
    assert pages.clamp_limit(10**9) == pages.MAX_PAGE


async def test_recall_joins_memories_and_marks_deleted_ones(
    store: MemoryStore, seeded: Seeded
) -> None:
    page = await Admin(store).user_recalls(seeded.user)
    assert [r.mode for r in page.items] == ["vector", "hybrid"]
    first = page.items[1]
    assert first.query_text == seeded.recall_query
    assert first.requesting_session_id == seeded.session
    assert page.items[0].query_text is None and len(page.items[0].query_sha256) == 64
    recall = await Admin(store).get_recall(seeded.user, first.id)
    assert recall is not None and recall.returned == 3
    assert [m.rank for m in recall.memories] == [1, 2, 3]
    gone = [m for m in recall.memories if m.deleted]
    assert [m.memory_id for m in gone] == [seeded.deleted_id]
    assert gone[0].deleted_by == "delete" and gone[0].deleted_at is not None
    assert all(m.content for m in recall.memories if not m.deleted)
    # Another user cannot read it.
    assert await Admin(store).get_recall(unique("other"), first.id) is None
    used = await Admin(store).recalls_of_memory(seeded.user, recall.memories[0].memory_id)
    assert first.id in [u.recall.id for u in used]


async def test_audit_facts_scopes_and_history(store: MemoryStore, seeded: Seeded) -> None:
    audit = await Admin(store).user_memory_audit(seeded.user)
    assert [e.operation for e in audit.items] == ["delete"] + ["insert"] * 4
    trail = await Admin(store).memory_audit_trail(seeded.user, seeded.deleted_id)
    assert [e.operation for e in trail] == ["insert", "delete"]
    facts = await Admin(store).user_facts(seeded.user)
    assert facts[0].facts == {"name": "Ana", "age": 32}
    history = await Admin(store).user_fact_history(seeded.user)
    assert next((c.key, c.old_value, c.new_value) for c in history.items) == ("age", 31, 32)
    scopes = await Admin(store).user_scopes(seeded.user)
    assert [(s.collection, s.session_id, s.memories) for s in scopes] == [
        (seeded.collection, seeded.session, 3)
    ]
    sessions = await Admin(store).user_sessions(seeded.user)
    assert [(s.session_id, s.messages) for s in sessions] == [(seeded.session, 2)]
    chat = await Admin(store).session_history(seeded.user, seeded.session, limit=1)
    assert chat.total == 2 and chat.rows[0].message["text"] == "Can you order dinner?"
    later = await Admin(store).session_history(
        seeded.user, seeded.session, after_seq=chat.next_after_seq, limit=1
    )
    assert later.next_after_seq is None and later.prev_before_seq is not None
    earlier = await Admin(store).session_history(
        seeded.user, seeded.session, before_seq=later.prev_before_seq, limit=1
    )
    assert [r.seq for r in earlier.rows] == [r.seq for r in chat.rows]
    memories = await Admin(store).user_memories(seeded.user, seeded.collection)
    assert SCRIPT_MEMORY in [m.content for m in memories.items]


async def test_cursor_round_trip_and_garbage() -> None:
    cursor = pages.Cursor(datetime(2024, 5, 1, 12, tzinfo=UTC), 42)
    assert pages.Cursor.decode(cursor.encode()) == cursor
    with pytest.raises(InvalidInputError):
        pages.Cursor.decode("yesterday~1")
    with pytest.raises(InvalidInputError):
        pages.Cursor.decode("2024-05-01T12:00:00~1")  # no time zone


async def test_prune_audit_deletes_only_old_rows_and_records_itself(
    store: MemoryStore, seeded: Seeded, owner_engine: AsyncEngine
) -> None:
    old = datetime.now(UTC) - timedelta(days=4000)
    async with owner_engine.begin() as conn:
        # Age half of this user's audit rows past the cutoff; everyone else's rows are recent.
        # (Backdating changes audit rows: the owner's sanctioned bypass of the guard.)
        await conn.execute(text("SET LOCAL citus.propagate_set_commands = 'local'"))  # shards too
        await conn.execute(text("SET LOCAL pgmemory.audit_change = 'sanctioned'"))
        for table in ("pgmemory_recall_audit", "pgmemory_memory_audit", "pgmemory_fact_audit"):
            await conn.execute(
                text(
                    f"UPDATE {table} SET at = :old WHERE user_id = :u AND id IN "
                    f"(SELECT id FROM {table} WHERE user_id = :u ORDER BY id LIMIT 1)"
                ),
                {"old": old, "u": seeded.user},
            )
    counts = await Admin(store).prune_audit(timedelta(days=3650), actor="retention-job")
    assert counts == {"recall_audit": 1, "memory_audit": 1, "fact_audit": 1}
    assert len((await Admin(store).user_recalls(seeded.user)).items) == 1
    assert len((await Admin(store).user_memory_audit(seeded.user)).items) == 4
    assert len((await Admin(store).user_fact_history(seeded.user)).items) == 2  # 3 changes before
    prunes = await Admin(store).list_prunes()
    assert prunes[0].actor == "retention-job" and prunes[0].deleted == counts
    assert prunes[0].cutoff is not None and prunes[0].cutoff < datetime.now(UTC) - timedelta(
        days=3649
    )
    # A later prune never deletes the record of an earlier one; memories are untouched.
    again = await Admin(store).prune_audit(datetime.now(UTC) - timedelta(days=3650))
    assert again == {"recall_audit": 0, "memory_audit": 0, "fact_audit": 0}
    async with store.engine.connect() as conn:
        kept = await conn.execute(
            text("SELECT count(*) FROM pgmemory_fact_audit WHERE namespace = :n AND user_id = ''"),
            {"n": statements.RETENTION_NAMESPACE},
        )
        assert kept.scalar_one() >= 2
    assert len((await Admin(store).user_memories(seeded.user, seeded.collection)).items) == 3
    with pytest.raises(InvalidInputError):
        await Admin(store).prune_audit(datetime(2020, 1, 1))  # naive
    with pytest.raises(InvalidInputError):
        await Admin(store).prune_audit(timedelta(days=-1))
