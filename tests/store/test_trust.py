"""Erasure that erases, and an audit only pgmemory's own functions may change (migration 0006)."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from pgmemory.embedders import CachedEmbedder
from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.records import MemoryRecord, MemoryScope, RecallTrace
from pgmemory.store.store import MemoryStore
from tests.conftest import unique

AUDITS = ("pgmemory_memory_audit", "pgmemory_recall_audit", "pgmemory_fact_audit")
GUESS = "diagnosed with diabetes"


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


async def _secret(store: MemoryStore, user: str) -> bytes | None:
    async with store.engine.connect() as conn:
        found = await conn.execute(
            text("SELECT secret FROM pgmemory_user_secrets WHERE user_id = :u"), {"u": user}
        )
        return found.scalar_one_or_none()


async def _seed(store: MemoryStore, collection: str, user: str) -> None:
    scope = MemoryScope(user_id=user, session_id="s1")
    await store.add(collection, [MemoryRecord(content=GUESS, scope=scope)], actor=user)
    await store.search(collection, scope, query=GUESS, trace=RecallTrace(include_query_text=True))
    await store.merge_facts("health", scope, {"condition": GUESS}, actor=user)


async def test_erase_user_leaves_no_user_id_and_no_confirmable_hash(
    store: MemoryStore, collection: str
) -> None:
    user = unique("alice@example.com")
    await _seed(store, collection, user)
    async with store.engine.connect() as conn:
        # Before erasure the audits hold keyed hashes only: the plain sha256 is nowhere.
        for table, column in (
            ("pgmemory_memory_audit", "content_sha256"),
            ("pgmemory_recall_audit", "query_sha256"),
        ):
            plain = await conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE {column} = :h"), {"h": _sha(GUESS)}
            )
            assert plain.scalar_one() == 0
    assert await _secret(store, user) is not None

    counts = await store.erase_user(user, actor="dpo")
    assert counts["memories"] == 1 and counts["facts"] == 1
    assert counts["memory_audit_rows_pseudonymised"] == 2  # the insert and the erasure's delete
    assert counts["recall_audit_rows_pseudonymised"] == 1
    assert counts["fact_audit_rows_pseudonymised"] == 1

    async with store.engine.connect() as conn:
        for table in AUDITS:
            # Not in user_id, and not anywhere else in any row (actor, values, texts).
            found = await conn.execute(
                text(f"SELECT count(*) FROM {table} AS t WHERE strpos(to_jsonb(t)::text, :u) > 0"),
                {"u": user},
            )
            assert found.scalar_one() == 0, table
            found = await conn.execute(
                text(f"SELECT count(*) FROM {table} AS t WHERE strpos(to_jsonb(t)::text, :g) > 0"),
                {"g": GUESS},
            )
            assert found.scalar_one() == 0, table
        record = (
            await conn.execute(
                text(
                    "SELECT new_value, actor FROM pgmemory_fact_audit WHERE user_id = '' "
                    "AND namespace = 'pgmemory:erasure' ORDER BY id DESC LIMIT 1"
                )
            )
        ).one()
        pseudonym = record.new_value["pseudonym"]
        assert pseudonym.startswith("erased:") and len(pseudonym) == 7 + 64
        assert record.actor == "dpo"
        rows = await conn.execute(
            text(
                "SELECT content_sha256 AS h FROM pgmemory_memory_audit WHERE user_id = :p "
                "UNION ALL SELECT query_sha256 FROM pgmemory_recall_audit WHERE user_id = :p"
            ),
            {"p": pseudonym},
        )
        hashes = {r.h for r in rows}
    assert len(hashes) == 1  # the content and the query are the same text, keyed alike
    # A guess of the erased text, hashed plainly or with the user id as key, confirms nothing.
    for candidate in (GUESS, user + GUESS, GUESS + user):
        assert _sha(candidate) not in hashes
    assert await _secret(store, user) is None
    assert pseudonym != "erased:" + _sha(user)


async def test_a_write_after_erasure_gets_a_fresh_secret(
    store: MemoryStore, collection: str
) -> None:
    user = unique("bob@example.com")
    await _seed(store, collection, user)
    before = await _secret(store, user)
    await store.erase_user(user)
    await store.add(collection, [MemoryRecord(content=GUESS, scope=MemoryScope(user_id=user))])
    after = await _secret(store, user)
    assert before is not None and after is not None and len(after) == 32 and after != before
    async with store.engine.connect() as conn:
        # The new audit row is keyed with the new secret, so it cannot be matched to the old.
        new = (
            await conn.execute(
                text("SELECT content_sha256 FROM pgmemory_memory_audit WHERE user_id = :u"),
                {"u": user},
            )
        ).scalar_one()
    assert new == hashlib.sha256(after + hashlib.sha256(GUESS.encode()).digest()).hexdigest()


async def test_audit_rows_refuse_update_delete_and_truncate(
    store: MemoryStore, collection: str
) -> None:
    await _seed(store, collection, unique("carol"))
    for statement in (
        "UPDATE {t} SET user_id = user_id",
        "DELETE FROM {t}",
        "TRUNCATE {t}",
    ):
        for table in AUDITS:
            with pytest.raises(DBAPIError, match="audit rows are append-only"):
                async with store.engine.begin() as conn:
                    await conn.execute(text(statement.format(t=table)))


async def test_verify_passes_on_a_store_after_erasure_and_after_prune(
    store: MemoryStore, collection: str
) -> None:
    report = await store.verify_audit()
    assert report.ok, report.problems
    user = unique("dave")
    await _seed(store, collection, user)
    await store.erase_user(user, actor="dpo")
    report = await store.verify_audit()
    assert report.ok, report.problems
    await store.prune_audit(timedelta(days=3650), actor="retention")
    report = await store.verify_audit()
    assert report.ok, report.problems
    assert {c.name for c in report.checks} >= {"guard triggers", "row hashes", "grants"}
    assert report.tables["pgmemory_memory_audit"]["rows"]


async def test_verify_names_a_disabled_trigger_and_a_row_the_owner_changed(
    fresh_database: str, embedder: CachedEmbedder, settings: Settings
) -> None:
    migrate.upgrade(fresh_database)
    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        assert (await store.verify_audit()).ok  # an empty audit
        name = unique("c")
        await store.create_collection(name, dimensions=3, embedding_model="test")
        await store.add(
            name,
            [MemoryRecord(content="x", embedding=[1.0, 0, 0], scope=MemoryScope(user_id="u"))],
        )
        assert (await store.verify_audit()).ok
        async with store.engine.begin() as conn:
            await conn.execute(
                text("ALTER TABLE pgmemory_memory_audit DISABLE TRIGGER pgmemory_audit_guard")
            )
        report = await store.verify_audit()
        assert not report.ok
        assert [c.name for c in report.problems] == ["guard triggers", "guard probe"]
        assert "pgmemory_memory_audit: trigger pgmemory_audit_guard is disabled" in (
            report.problems[0].detail
        )
        async with store.engine.begin() as conn:
            # With the guard off, the owner rewrites history, then hides the switch.
            await conn.execute(text("UPDATE pgmemory_memory_audit SET actor = 'nobody'"))
            await conn.execute(
                text("ALTER TABLE pgmemory_memory_audit ENABLE TRIGGER pgmemory_audit_guard")
            )
        report = await store.verify_audit()
        assert [c.name for c in report.problems] == ["row hashes"]
        assert "pgmemory_memory_audit: 1 row(s)" in report.problems[0].detail
