"""MemoryStore against a real PostgreSQL: writes, exact scoped recall, lists, deletes, audit."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.errors import CollectionError, ScopeError
from pgmemory.store.records import MemoryRecord, MemoryScope, RecallTrace
from pgmemory.store.store import MemoryStore
from tests.citus import cluster as citus_cluster
from tests.conftest import unique

DIM = 512


def rand_vectors(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, DIM)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a @ b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b))


async def test_alice_and_bob_never_see_each_other(store: MemoryStore, collection: str) -> None:
    alice, bob = unique("alice"), unique("bob")
    await store.add(
        collection,
        [
            MemoryRecord(content="我不能吃辣，请不要点辣的菜", scope=MemoryScope(user_id=alice)),
            MemoryRecord(content="I love very spicy Sichuan food", scope=MemoryScope(user_id=bob)),
        ],
    )
    alice_hits = await store.search(
        collection, MemoryScope(user_id=alice), query="spicy food", limit=10
    )
    bob_hits = await store.search(collection, MemoryScope(user_id=bob), query="辣", limit=10)
    assert [h.memory.content for h in alice_hits] == ["我不能吃辣，请不要点辣的菜"]
    assert [h.memory.content for h in bob_hits] == ["I love very spicy Sichuan food"]
    assert alice_hits[0].memory.scope.user_id == alice


async def test_search_is_exact_against_brute_force(store: MemoryStore, collection: str) -> None:
    users = [unique("u") for _ in range(3)]
    vectors = rand_vectors(600, seed=1)
    records = [
        MemoryRecord(content=f"memory {i}", scope=MemoryScope(user_id=users[i % 3]), embedding=v)
        for i, v in enumerate(vectors)
    ]
    ids = await store.add(collection, records)
    queries = rand_vectors(20, seed=2)
    for query in queries:
        mine = np.array([i for i in range(600) if i % 3 == 1])
        scores = cosine(vectors[mine], query)
        expected = [ids[mine[j]] for j in np.argsort(-scores)[:10]]
        hits = await store.search(collection, MemoryScope(user_id=users[1]), vector=query, limit=10)
        assert [h.memory.id for h in hits] == expected
        np.testing.assert_allclose([h.score for h in hits], np.sort(scores)[::-1][:10], rtol=1e-4)


async def test_unset_dimensions_are_not_filtered(store: MemoryStore, collection: str) -> None:
    user = unique("u")
    await store.add(
        collection,
        [
            MemoryRecord(content="first session", scope=MemoryScope(user_id=user, session_id="s1")),
            MemoryRecord(
                content="second session", scope=MemoryScope(user_id=user, session_id="s2")
            ),
        ],
    )
    assert await store.count(collection, MemoryScope(user_id=user)) == 2
    assert await store.count(collection, MemoryScope(user_id=user, session_id="s1")) == 1
    assert (
        await store.count(collection, MemoryScope(session_id="s2", user_id=user, agent_id="x")) == 0
    )


async def test_empty_search_scope_is_refused_unless_allowed(
    store: MemoryStore, collection: str
) -> None:
    with pytest.raises(ScopeError, match="allow_unscoped=True"):
        await store.search(collection, MemoryScope(), query="anything")
    with pytest.raises(ScopeError, match="empty scope"):
        await store.add(collection, [MemoryRecord(content="x", scope=MemoryScope())])
    await store.add(collection, [MemoryRecord(content="y", scope=MemoryScope(user_id=unique("u")))])
    hits = await store.search(collection, MemoryScope(), query="y", allow_unscoped=True)
    assert len(hits) == 1


async def test_scope_values_with_sql_metacharacters_match_literally(
    store: MemoryStore, collection: str
) -> None:
    tricky = ["o'brien", 'say "hi"', "100%", "a_b", "back\\slash", "x' OR '1'='1"]
    vec = rand_vectors(1, seed=3)[0]
    for value in tricky:
        await store.add(
            collection,
            [
                MemoryRecord(
                    content=f"note of {value}", scope=MemoryScope(user_id=value), embedding=vec
                )
            ],
        )
    for value in tricky:
        hits = await store.search(collection, MemoryScope(user_id=value), vector=vec, limit=10)
        assert [h.memory.scope.user_id for h in hits] == [value]
    # '%' and '_' are not wildcards: "a_b" does not match "axb", "100%" does not match "1000"
    await store.add(
        collection, [MemoryRecord(content="n", scope=MemoryScope(user_id="axb"), embedding=vec)]
    )
    assert await store.count(collection, MemoryScope(user_id="a_b")) == 1


async def test_min_score_and_time_bounds(store: MemoryStore, collection: str) -> None:
    user = unique("u")
    base = rand_vectors(1, seed=4)[0]
    old = datetime(2024, 1, 1, tzinfo=UTC)
    await store.add(
        collection,
        [
            MemoryRecord(
                content="same", scope=MemoryScope(user_id=user), embedding=base, created_at=old
            ),
            MemoryRecord(content="opposite", scope=MemoryScope(user_id=user), embedding=-base),
        ],
    )
    hits = await store.search(
        collection, MemoryScope(user_id=user), vector=base, limit=5, min_score=0.5
    )
    assert [h.memory.content for h in hits] == ["same"]
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    recent = await store.search(
        collection, MemoryScope(user_id=user), vector=base, limit=5, since=old + timedelta(days=1)
    )
    assert [h.memory.content for h in recent] == ["opposite"]
    before = await store.search(
        collection, MemoryScope(user_id=user), vector=base, until=old + timedelta(seconds=1)
    )
    assert [h.memory.content for h in before] == ["same"]


async def test_expired_memories_are_invisible_then_reclaimed(
    store: MemoryStore, collection: str
) -> None:
    user = unique("u")
    past = datetime.now(UTC) - timedelta(minutes=1)
    await store.add(
        collection,
        [
            MemoryRecord(content="stale", scope=MemoryScope(user_id=user), expires_at=past),
            MemoryRecord(content="fresh", scope=MemoryScope(user_id=user)),
        ],
    )
    assert [m.content for m in await store.list(collection, MemoryScope(user_id=user))] == ["fresh"]
    hits = await store.search(collection, MemoryScope(user_id=user), query="stale", limit=5)
    assert [h.memory.content for h in hits] == ["fresh"]
    assert await store.expire(collection, actor="janitor") == 1
    async with store.engine.connect() as conn:
        ops = (
            await conn.execute(
                text(
                    "SELECT operation, actor FROM pgmemory_memory_audit WHERE user_id = :u ORDER BY id"
                ),
                {"u": user},
            )
        ).all()
    assert ops == [("insert", ""), ("insert", ""), ("expire", "janitor")]


async def test_list_pages_newest_first(store: MemoryStore, collection: str) -> None:
    user = unique("u")
    await store.add(
        collection,
        [MemoryRecord(content=f"m{i}", scope=MemoryScope(user_id=user)) for i in range(5)],
    )
    scope = MemoryScope(user_id=user)
    first = await store.list(collection, scope, limit=2)
    second = await store.list(collection, scope, limit=2, offset=2)
    oldest = await store.list(collection, scope, limit=5, newest_first=False)
    assert [m.content for m in first + second] == ["m4", "m3", "m2", "m1"]
    assert [m.content for m in oldest] == ["m0", "m1", "m2", "m3", "m4"]


async def test_delete_by_ids_and_by_scope_is_audited(store: MemoryStore, collection: str) -> None:
    alice, bob = unique("alice"), unique("bob")
    ids = await store.add(
        collection,
        [
            MemoryRecord(content=f"a{i}", scope=MemoryScope(user_id=alice, session_id=f"s{i}"))
            for i in range(3)
        ]
        + [MemoryRecord(content="b", scope=MemoryScope(user_id=bob))],
    )
    assert (
        await store.delete(
            collection,
            ids=[ids[0], ids[3]],
            scope=MemoryScope(user_id=alice),
            actor="alice-request",
        )
        == 1
    )  # bob's id is out of alice's scope
    assert await store.delete(collection, scope=MemoryScope(user_id=alice), actor="gdpr") == 2
    assert await store.count(collection, MemoryScope(user_id=alice)) == 0
    assert await store.count(collection, MemoryScope(user_id=bob)) == 1
    with pytest.raises(ScopeError):
        await store.delete(collection, scope=MemoryScope())
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT operation, memory_id, session_id, actor FROM pgmemory_memory_audit "
                    "WHERE user_id = :u AND operation = 'delete' ORDER BY id"
                ),
                {"u": alice},
            )
        ).all()
    assert [(r.operation, r.actor) for r in rows] == [
        ("delete", "alice-request"),
        ("delete", "gdpr"),
        ("delete", "gdpr"),
    ]
    assert rows[0].memory_id == ids[0]


async def test_every_write_is_audited_in_the_same_transaction(
    store: MemoryStore, collection: str, owner_engine: AsyncEngine
) -> None:
    user = unique("u")
    ids = await store.add(
        collection,
        [
            MemoryRecord(content="hello", scope=MemoryScope(user_id=user, session_id="s")),
            MemoryRecord(content="again", scope=MemoryScope(user_id=user, session_id="s")),
        ],
        actor="svc",
    )
    later = await store.add(
        collection, [MemoryRecord(content="x", scope=MemoryScope(user_id=user))]
    )
    async with owner_engine.connect() as conn:
        mem_xmin = (
            await conn.execute(
                text("SELECT xmin::text FROM pgmemory_memories WHERE id = :id"), {"id": ids[0]}
            )
        ).scalar_one()
        audit = (
            await conn.execute(
                text(
                    "SELECT txid, content_sha256, actor, collection, session_id FROM pgmemory_memory_audit "
                    "WHERE memory_id = :id"
                ),
                {"id": ids[0]},
            )
        ).one()
        txids = dict(
            (
                await conn.execute(
                    text("SELECT memory_id, txid FROM pgmemory_memory_audit WHERE user_id = :u"),
                    {"u": user},
                )
            ).all()
        )
        secret = (
            await conn.execute(
                text("SELECT secret FROM pgmemory_user_secrets WHERE user_id = :u"), {"u": user}
            )
        ).scalar_one()
    # One write, one transaction id on its audit rows (another write, another id); on one
    # server it is the memory row's own xmin (on Citus the row's xmin is its shard's).
    assert txids[ids[0]] == txids[ids[1]] != txids[later[0]]
    if not citus_cluster.enabled():
        assert str(audit.txid) == mem_xmin
    # Keyed with the user's secret: sha256(secret || sha256("hello")), never the plain sha256.
    plain = hashlib.sha256(b"hello").digest()
    assert audit.content_sha256 == hashlib.sha256(secret + plain).hexdigest() != plain.hex()
    assert (audit.actor, audit.collection, audit.session_id) == ("svc", collection, "s")


async def test_recall_is_audited_with_ids_and_scores(store: MemoryStore, collection: str) -> None:
    user = unique("u")
    ids = await store.add(
        collection,
        [
            MemoryRecord(content="likes tea", scope=MemoryScope(user_id=user)),
            MemoryRecord(content="hates coffee", scope=MemoryScope(user_id=user)),
        ],
    )
    hits = await store.search(
        collection,
        MemoryScope(user_id=user),
        query="what does the user drink",
        limit=2,
        trace=RecallTrace(provider="p1", mode="before_ai_invoke", session_id="sess-9"),
    )
    await store.search(collection, MemoryScope(user_id=user), query="not audited", audit=False)
    async with store.engine.connect() as conn:
        rows = (
            (
                await conn.execute(
                    text("SELECT * FROM pgmemory_recall_audit WHERE user_id = :u"), {"u": user}
                )
            )
            .mappings()
            .all()
        )
    assert len(rows) == 1
    row = rows[0]
    assert row["memory_ids"] == [h.memory.id for h in hits]
    assert set(row["memory_ids"]) == set(ids)
    assert row["scores"] == pytest.approx([h.score for h in hits], rel=1e-5)
    assert (row["provider"], row["mode"], row["requesting_session_id"]) == (
        "p1",
        "before_ai_invoke",
        "sess-9",
    )
    assert row["query_text"] is None and len(row["query_sha256"]) == 64


async def test_collections_of_different_sizes_coexist(store: MemoryStore) -> None:
    small, large = unique("c384"), unique("c1536")
    await store.create_collection(small, dimensions=384, embedding_model="test-384")
    await store.create_collection(large, dimensions=1536, embedding_model="test-1536")
    user = unique("u")
    rng = np.random.default_rng(5)
    v384, v1536 = rng.standard_normal(384), rng.standard_normal(1536)
    await store.add(
        small, [MemoryRecord(content="s", scope=MemoryScope(user_id=user), embedding=v384)]
    )
    await store.add(
        large, [MemoryRecord(content="l", scope=MemoryScope(user_id=user), embedding=v1536)]
    )
    assert (await store.search(large, MemoryScope(user_id=user), vector=v1536))[
        0
    ].score == pytest.approx(1.0, abs=1e-5)
    assert (await store.search(small, MemoryScope(user_id=user), vector=v384))[
        0
    ].memory.content == "s"
    with pytest.raises(CollectionError, match="1536 dimensions; this collection holds 384"):
        await store.add(
            small, [MemoryRecord(content="x", scope=MemoryScope(user_id=user), embedding=v1536)]
        )
    # Same name, another model: refused.
    with pytest.raises(CollectionError, match="exists with 384 dimensions"):
        await store.create_collection(small, dimensions=384, embedding_model="other-model")
    assert await store.drop_collection(large) == 1
    with pytest.raises(CollectionError, match="unknown collection"):
        await store.get_collection(large)


async def test_text_query_needs_the_collections_model(store: MemoryStore) -> None:
    name = unique("c")
    await store.create_collection(name, dimensions=512, embedding_model="another-512-model")
    with pytest.raises(CollectionError, match="another-512-model"):
        await store.search(name, MemoryScope(user_id="u"), query="hello")
    with pytest.raises(CollectionError, match="another-512-model"):
        await store.add(name, [MemoryRecord(content="hello", scope=MemoryScope(user_id="u"))])


async def test_large_batches_are_chunked_and_copy_import_is_audited(
    store: MemoryStore, collection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pgmemory.store.writes as store_module

    monkeypatch.setattr(store_module, "INSERT_CHUNK_ROWS", 70)
    user = unique("u")
    vectors = rand_vectors(250, seed=6)
    ids = await store.add(
        collection,
        [
            MemoryRecord(content=f"r{i}", scope=MemoryScope(user_id=user), embedding=v)
            for i, v in enumerate(vectors)
        ],
    )
    assert len(set(ids)) == 250
    imported = await store.import_records(
        collection,
        (
            MemoryRecord(
                content=f"imp{i}", scope=MemoryScope(user_id=user, session_id="bulk"), embedding=v
            )
            for i, v in enumerate(vectors)
        ),
        batch_rows=64,
    )
    assert imported == 250
    assert await store.count(collection, MemoryScope(user_id=user)) == 500
    hits = await store.search(
        collection, MemoryScope(user_id=user, session_id="bulk"), vector=vectors[17], limit=1
    )
    assert hits[0].memory.content == "imp17"
    async with store.engine.connect() as conn:
        audited = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pgmemory_memory_audit WHERE user_id = :u AND operation = 'insert'"
                ),
                {"u": user},
            )
        ).scalar_one()
    assert audited == 500


async def test_a_failure_inside_a_later_chunk_writes_nothing(
    store: MemoryStore, collection: str, poisoned_memories: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database-side failure in the third chunk rolls back the first two as well."""
    import pgmemory.store.writes as store_module

    monkeypatch.setattr(store_module, "INSERT_CHUNK_ROWS", 10)
    user = unique("u")
    records = [MemoryRecord(content=f"ok{i}", scope=MemoryScope(user_id=user)) for i in range(25)]
    records.append(MemoryRecord(content=poisoned_memories, scope=MemoryScope(user_id=user)))
    with pytest.raises(Exception, match="poisoned row"):
        await store.add(collection, records)
    assert await store.count(collection, MemoryScope(user_id=user)) == 0
    async with store.engine.connect() as conn:
        audited = (
            await conn.execute(
                text("SELECT count(*) FROM pgmemory_memory_audit WHERE user_id = :u"), {"u": user}
            )
        ).scalar_one()
    assert audited == 0


async def test_chat_history_is_ordered_deduplicated_and_paginated(store: MemoryStore) -> None:
    session = unique("s")
    msgs = [
        {"message_id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant", "text": f"t{i}"}
        for i in range(5)
    ]
    assert await store.append_history(session, msgs[:3]) == 3
    assert await store.append_history(session, msgs[2:]) == 2  # m2 is already there
    rows = await store.read_history(session)
    assert [r.message["message_id"] for r in rows] == ["m0", "m1", "m2", "m3", "m4"]
    page = await store.read_history(session, after_seq=rows[1].seq, limit=2)
    assert [r.message["text"] for r in page] == ["t2", "t3"]
    assert await store.count_history(session) == 5
    assert await store.count_history(session, user_id="someone-else") == 0
    assert await store.delete_history(session) == 5
    assert await store.read_history(session) == []


async def test_concurrent_history_appends_do_not_collide(store: MemoryStore) -> None:
    import asyncio

    session = unique("s")
    await asyncio.gather(
        *[
            store.append_history(
                session, [{"message_id": f"w{w}-{i}", "role": "user"} for i in range(5)]
            )
            for w in range(4)
        ]
    )
    rows = await store.read_history(session)
    assert len(rows) == 20 and len({r.seq for r in rows}) == 20


async def test_an_append_waiting_for_the_session_numbers_after_what_committed_meanwhile(
    store: MemoryStore,
) -> None:
    """An append that starts while another append to the session is still open waits for it,
    then numbers its messages after the rows that append committed (its snapshot, taken
    before, would not show them)."""
    import asyncio

    session = unique("s")
    inside, release = asyncio.Event(), asyncio.Event()

    async def open_append() -> None:
        async with store.shared_transaction():
            await store.append_history(session, [{"message_id": "first", "role": "user"}])
            inside.set()
            await release.wait()

    holder = asyncio.create_task(open_append())
    await inside.wait()
    second = asyncio.create_task(
        store.append_history(session, [{"message_id": "second", "role": "user"}])
    )
    await asyncio.sleep(0.3)
    waited = not second.done()
    release.set()
    await holder
    assert await second == 1
    assert waited, "the second append did not wait for the session's append lock"
    rows = await store.read_history(session)
    assert [(r.seq, r.message["message_id"]) for r in rows] == [(1, "first"), (2, "second")]


async def test_keyword_search_matches_chinese_and_english(
    store: MemoryStore, collection: str
) -> None:
    user = unique("u")
    await store.add(
        collection,
        [
            MemoryRecord(content="上次点了辣椒炒肉和清炒菜心", scope=MemoryScope(user_id=user)),
            MemoryRecord(content="我不能吃辣", scope=MemoryScope(user_id=user)),
            MemoryRecord(
                content="Order number 4711 was delivered late", scope=MemoryScope(user_id=user)
            ),
            MemoryRecord(
                content="辣椒炒肉 for somebody else", scope=MemoryScope(user_id=unique("other"))
            ),
        ],
    )
    scope = MemoryScope(user_id=user)
    hits = await store.search(collection, scope, query="辣椒炒肉", mode="text", limit=5)
    assert [h.memory.content for h in hits] == ["上次点了辣椒炒肉和清炒菜心"]
    hits = await store.search(collection, scope, query="what happened to order 4711?", mode="text")
    assert [h.memory.content for h in hits] == ["Order number 4711 was delivered late"]
    assert await store.search(collection, scope, query="the of and", mode="text") == []


async def test_hybrid_fuses_keywords_similarity_and_recency(
    store: MemoryStore, collection: str
) -> None:
    from pgmemory.store.records import SearchWeights

    user = unique("u")
    scope = MemoryScope(user_id=user)
    old = datetime(2025, 1, 1, tzinfo=UTC)
    await store.add(
        collection,
        [
            MemoryRecord(
                content=f"filler note {i} about the weather",
                scope=scope,
                created_at=old + timedelta(days=i),
            )
            for i in range(8)
        ]
        + [
            MemoryRecord(content="Invoice code ZX-93 is unpaid", scope=scope, created_at=old),
            MemoryRecord(content="newest entry: went jogging", scope=scope),
        ],
    )
    hybrid = await store.search(collection, scope, query="ZX-93", mode="hybrid", limit=3)
    assert hybrid[0].memory.content == "Invoice code ZX-93 is unpaid"
    recent = await store.search(
        collection,
        scope,
        query="weather",
        mode="hybrid",
        limit=1,
        weights=SearchWeights(vector=0.0, text=0.0, recency=1.0),
    )
    assert recent[0].memory.content == "newest entry: went jogging"
    with pytest.raises(Exception, match="pass query="):
        await store.search(collection, scope, vector=np.ones(512), mode="hybrid")


async def test_facts_merge_overwrite_remove_and_audit(store: MemoryStore) -> None:
    user = unique("u")
    scope = MemoryScope(user_id=user)
    assert await store.get_facts("profile", scope) == {}
    assert await store.merge_facts("profile", scope, {"name": "Alice"}) == {"name": "Alice"}
    merged = await store.merge_facts(
        "profile", scope, {"age": 30, "name": "Alice"}, actor="extractor"
    )
    assert merged == {"name": "Alice", "age": 30}
    assert await store.merge_facts("profile", scope, {"age": 31}) == {"name": "Alice", "age": 31}
    assert await store.merge_facts("profile", scope, {"name": None}) == {"age": 31}
    assert await store.get_facts("profile", MemoryScope(user_id=user, session_id="s")) == {}
    async with store.engine.begin() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT key, old_value, new_value FROM pgmemory_fact_audit WHERE user_id = :u ORDER BY id"
                ),
                {"u": user},
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("name", None, "Alice"),
        ("age", None, 30),
        ("age", 30, 31),
        ("name", "Alice", None),
    ]
    assert await store.delete_facts(scope) == 1
    with pytest.raises(ScopeError):
        await store.get_facts("profile", MemoryScope())


async def test_erase_user_removes_everything_personal_in_one_go(store: MemoryStore) -> None:
    alice, bob = unique("alice"), unique("bob")
    names = []
    for _ in range(2):
        name = unique("c")
        await store.create_collection(name)
        names.append(name)
        await store.add(
            name,
            [
                MemoryRecord(content="alice's secret", scope=MemoryScope(user_id=alice)),
                MemoryRecord(content="bob's note", scope=MemoryScope(user_id=bob)),
            ],
        )
    await store.merge_facts("profile", MemoryScope(user_id=alice), {"name": "Alice"})
    await store.merge_facts("profile", MemoryScope(user_id=alice, session_id="s"), {"age": 3})
    await store.append_history(
        "s1", [{"message_id": "m", "role": "user", "text": "hi"}], user_id=alice
    )
    await store.search(
        names[0],
        MemoryScope(user_id=alice),
        query="secret",
        trace=RecallTrace(include_query_text=True),
    )
    counts = await store.erase_user(alice, actor="dpo")
    assert counts == {
        "memories": 2,
        "facts": 2,
        "history_messages": 1,
        "derivation_jobs": 0,
        "memory_audit_rows_pseudonymised": 4,
        "recall_audit_rows_pseudonymised": 1,
        "fact_audit_rows_pseudonymised": 2,
    }
    for name in names:
        assert await store.count(name, MemoryScope(user_id=alice)) == 0
        assert await store.count(name, MemoryScope(user_id=bob)) == 1
    assert await store.get_facts("profile", MemoryScope(user_id=alice)) == {}
    assert await store.read_history("s1", user_id=alice) == []
    async with store.engine.begin() as conn:
        leftovers = (
            await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM pgmemory_fact_audit WHERE new_value IS NOT NULL AND user_id LIKE 'erased:%')"
                    " + (SELECT count(*) FROM pgmemory_recall_audit WHERE query_text IS NOT NULL AND user_id LIKE 'erased:%')"
                ),
            )
        ).scalar_one()
        deletes = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pgmemory_memory_audit AS x WHERE x.operation = 'delete' AND x.actor = 'dpo'"
                    " AND x.user_id = (SELECT y.new_value ->> 'pseudonym' FROM pgmemory_fact_audit AS y"
                    " WHERE y.namespace = 'pgmemory:erasure' ORDER BY y.id DESC LIMIT 1)"
                ),
            )
        ).scalar_one()
    assert leftovers == 0 and deletes == 2


async def test_a_message_is_stored_once_per_scope(store: MemoryStore, collection: str) -> None:
    user = unique("u")
    scope = MemoryScope(user_id=user, session_id="s")
    first = await store.add(
        collection,
        [
            MemoryRecord(content="I like tea", scope=scope, message_id="m1"),
            MemoryRecord(content="no id, always stored", scope=scope),
        ],
    )
    again = await store.add(
        collection,
        [
            MemoryRecord(content="I like tea", scope=scope, message_id="m1"),
            MemoryRecord(content="new", scope=scope, message_id="m2"),
            MemoryRecord(content="no id, always stored", scope=scope),
        ],
    )
    assert len(first) == 2 and len(again) == 2
    other_session = await store.add(
        collection,
        [
            MemoryRecord(
                content="I like tea",
                scope=MemoryScope(user_id=user, session_id="t"),
                message_id="m1",
            )
        ],
    )
    assert len(other_session) == 1  # the same id in another scope is another memory
    imported = await store.import_records(
        collection,
        [
            MemoryRecord(content="I like tea", scope=scope, message_id="m1"),
            MemoryRecord(content="fresh", scope=scope, message_id="m3"),
        ],
    )
    assert imported == 1
    contents = sorted(
        m.content for m in await store.list(collection, MemoryScope(user_id=user, session_id="s"))
    )
    assert contents == [
        "I like tea",
        "fresh",
        "new",
        "no id, always stored",
        "no id, always stored",
    ]


async def test_keyword_ranking_is_bm25_rare_terms_weigh_more(
    store: MemoryStore, collection: str
) -> None:
    user = unique("u")
    scope = MemoryScope(user_id=user)
    common = [
        MemoryRecord(content=f"the weather report number {i} says sunny weather", scope=scope)
        for i in range(6)
    ]
    await store.add(
        collection,
        [
            *common,
            MemoryRecord(content="my passport expires in march", scope=scope),
            MemoryRecord(
                content="weather weather weather weather and also a passport", scope=scope
            ),
        ],
    )
    hits = await store.search(collection, scope, query="weather passport", mode="text", limit=8)
    contents = [h.memory.content for h in hits]
    # both passport memories beat every weather-only one: 'passport' is rare in the scope
    assert set(contents[:2]) == {
        "my passport expires in march",
        "weather weather weather weather and also a passport",
    }
    assert len(contents) == 8 and all(h.score > 0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


async def test_bulk_import_is_not_cut_by_the_statement_timeout(database_url: str, embedder) -> None:
    from pgmemory.settings import Settings

    settings = Settings(_env_file=None, statement_timeout_ms=60)  # type: ignore[call-arg]
    async with MemoryStore(database_url, settings=settings, embedder=embedder) as strict:
        name = unique("c")
        await strict.create_collection(name, dimensions=8, embedding_model="m")
        rng = np.random.default_rng(3)
        imported = await strict.import_records(
            name,
            [
                MemoryRecord(content=f"r{i}", scope=MemoryScope(user_id="u"), embedding=v)
                for i, v in enumerate(rng.standard_normal((3000, 8)))
            ],
        )
        assert imported == 3000
