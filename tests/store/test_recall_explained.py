"""A recall says why: reasons and signals in the store, the audit, Admin, the CLI and the page;
migration 0010 keeps old audit rows verifying; add's message_id is its idempotency key."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, RecallTrace, SearchWeights
from pgmemory.admin import Admin
from pgmemory.cli import main as cli_main
from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.recall_text import line_tokens
from tests.conftest import CachedEmbedder, unique

T0 = datetime(2026, 11, 1, tzinfo=UTC)


async def _conversation(store: MemoryStore, collection: str, user: str) -> None:
    scope = MemoryScope(user_id=user, session_id="s1")
    rows = [
        ("What did the doctor recommend for my knee?", "user"),
        ("She recommended swimming twice a week.", "assistant"),
        ("I love hiking in the Alps", "user"),
        ("Hiking is great exercise.", "assistant"),
    ]
    await store.add(
        collection,
        [
            MemoryRecord(content=c, scope=scope, role=r, created_at=T0 + timedelta(minutes=i))
            for i, (c, r) in enumerate(rows)
        ],
    )


async def test_search_explain_gives_signals_that_sum_to_the_score(
    store: MemoryStore, collection: str
) -> None:
    user = unique("u")
    await _conversation(store, collection, user)
    scope = MemoryScope(user_id=user)
    hits = await store.search(collection, scope, query="doctor knee", limit=4, explain=True)
    assert hits and all(h.signals is not None for h in hits)
    for h in hits:
        s = h.signals
        assert s is not None and s.similarity is not None and s.keywords is not None
        total = s.similarity + s.keywords + (s.recency or 0) + (s.neighbour or 0)
        assert total == pytest.approx(h.score, abs=1e-4)
    # no neighbour weight: no neighbour share
    flat = await store.search(
        collection, scope, query="doctor knee", explain=True, weights=SearchWeights(neighbour=0)
    )
    assert all(
        h.signals is not None and h.signals.neighbour == pytest.approx(0, abs=1e-5) for h in flat
    )
    for mode, signal in (("vector", "similarity"), ("text", "keywords")):
        [hit] = await store.search(
            collection, scope, query="doctor", mode=mode, limit=1, explain=True
        )  # type: ignore[arg-type]
        assert getattr(hit.signals, signal) == pytest.approx(hit.score, abs=1e-5)
    ranked = await store.search(
        collection, scope, query="doctor", explain=True, weights=SearchWeights(fusion="rank")
    )
    assert ranked[0].signals is not None and ranked[0].signals.similarity == pytest.approx(
        1 / 61, abs=1e-4
    )
    # without explain: no signals, and the default mode of a text query is hybrid
    plain = await store.search(collection, scope, query="doctor knee", limit=4)
    assert [h.signals for h in plain] == [None] * len(plain)
    assert [h.memory.id for h in plain] == [h.memory.id for h in hits]
    async with store.engine.connect() as conn:
        audited = (
            await conn.execute(
                text(
                    "SELECT mode, reasons, signals FROM pgmemory_recall_audit WHERE user_id = :u ORDER BY id"
                ),
                {"u": user},
            )
        ).all()
    assert audited[0].mode == "hybrid" and audited[0].reasons and audited[0].signals
    assert audited[-1].mode == "hybrid" and audited[-1].reasons is None


async def test_the_answer_next_to_the_match_is_a_neighbour(
    store: MemoryStore, collection: str
) -> None:
    user = unique("u")
    await _conversation(store, collection, user)
    got = await store.recall(
        collection,
        MemoryScope(user_id=user),
        query="what did the doctor recommend for my knee",
        recent_turns=0,
        max_results=3,
        weights=SearchWeights(neighbour=2.0),
    )
    reasons = {i.memory.content: i.reason for i in got.items}
    assert reasons["What did the doctor recommend for my knee?"] == "match"
    assert reasons["She recommended swimming twice a week."] == "neighbour"


async def test_admin_cli_and_page_show_reasons_and_signals(
    store: MemoryStore, collection: str, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    user = unique("u")
    await _conversation(store, collection, user)
    long_text = "swimming " * 400 + "THE-END"
    await store.add(
        collection,
        [MemoryRecord(content=long_text, scope=MemoryScope(user_id=user, session_id="s2"))],
    )
    got = await store.recall(
        collection,
        MemoryScope(user_id=user),
        query="swimming",
        recent_turns=1,
        trace=RecallTrace(provider="test"),
    )
    assert {i.reason for i in got.items} >= {"recent", "match"}
    page = await Admin(store).user_recalls(user)
    [recall] = page.items
    assert recall.mode == "hybrid"
    assert [m.reason for m in recall.memories] == [i.reason for i in got.items]
    for m, item in zip(recall.memories, got.items, strict=True):
        if item.reason == "recent":
            assert m.signals is None
        else:
            assert m.signals is not None and item.signals is not None
            assert m.signals.similarity == pytest.approx(item.signals.similarity, abs=1e-4)
    # pgmemory audit --user U --json
    args = ["--url", store.url, "audit", "--user", user, "--json"]
    assert await asyncio.to_thread(cli_main, args) == 0
    out = json.loads(capsys.readouterr().out)
    [shown] = out["recalls"]
    assert [m["reason"] for m in shown["memories"]] == [i.reason for i in got.items]
    assert any(m["signals"] and m["signals"]["similarity"] is not None for m in shown["memories"])
    # the audit page: reason badges, signals, and a long memory shortened behind <details>
    pytest.importorskip("starlette")
    from pgmemory.ui.app import create_app
    from tests.ui.test_app import bearer, client_for

    # The page is the operators': it runs as the owner, who alone may read the tokens.
    async with MemoryStore(database_url) as owner:
        token = (await Admin(owner).issue_token(f"op-{user}")).token
        async with client_for(create_app(owner), headers=bearer(token)) as client:
            body = (await client.get("/user/recalls", params={"user": user})).text
    assert "reason-recent" in body and "reason-match" in body
    assert "similarity " in body
    assert "<details>" in body and "THE-END" in body  # the full text, behind the summary


async def test_add_message_id_is_the_idempotency_key(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id=unique("u"))
    for _ in range(2):
        await store.add(
            collection,
            [MemoryRecord(content="Bob is allergic to peanuts", scope=scope, message_id="note-1")],
        )
    assert await store.count(collection, scope) == 1
    # the same text under another key is another memory ("yes" said twice is two messages)
    await store.add(collection, [MemoryRecord(content="yes", scope=scope, message_id="m-2")])
    await store.add(collection, [MemoryRecord(content="yes", scope=scope, message_id="m-3")])
    assert await store.count(collection, scope) == 3


async def test_migration_0010_backfills_costs_and_old_audit_rows_still_verify(
    fresh_database: str, embedder: CachedEmbedder, settings: Settings
) -> None:
    migrate.upgrade(fresh_database, "0009")
    engine = create_async_engine(fresh_database.replace("postgresql://", "postgresql+psycopg://"))
    vector = "[" + ",".join(["0.1"] * 3) + "]"
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO pgmemory_collections VALUES ('old', 3, 'test', now())")
        )
        for i, (role, content) in enumerate([("user", 'héllo "wörld"'), ("tool", "x" * 5000)]):
            await conn.execute(
                text(
                    "INSERT INTO pgmemory_memories (id, user_id, collection, role, content, "
                    "content_sha256, embedding, embedding_model) VALUES (gen_random_uuid(), "
                    "'alice', 'old', :role, :content, repeat('0', 64), CAST(:v AS vector), 'test')"
                ),
                {"role": role, "content": content, "v": vector},
            )
            del i
        await conn.execute(
            text(
                "INSERT INTO pgmemory_recall_audit (user_id, collection, application_id, "
                "agent_id, session_id, provider, mode, query_sha256, memory_ids, scores) "
                "VALUES ('alice', 'old', '', '', '', 'p', 'before_ai_invoke', repeat('1', 64), "
                "ARRAY[gen_random_uuid()], ARRAY[0.5::real])"
            )
        )
    await engine.dispose()
    migrate.upgrade(fresh_database)
    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        async with store.engine.connect() as conn:
            rows = (
                await conn.execute(
                    text("SELECT role, content, recall_tokens FROM pgmemory_memories")
                )
            ).all()
        assert rows and all(r.recall_tokens == line_tokens(r.role, r.content) for r in rows)
        report = await Admin(store).verify_audit()
        assert report.ok, report.problems
        got = await store.recall(
            "old", MemoryScope(user_id="alice"), query="hello", mode="text", include_tools=True
        )
        assert got.items
        assert (await Admin(store).verify_audit()).ok
        recalls = (await Admin(store).user_recalls("alice")).items
        assert [r.mode for r in recalls] == ["text", "before_ai_invoke"]
        assert recalls[1].memories[0].reason is None  # an old row reads as before
        async with store.engine.begin() as conn:
            await conn.execute(
                text("ALTER TABLE pgmemory_recall_audit DISABLE TRIGGER pgmemory_audit_guard")
            )
            await conn.execute(
                text("UPDATE pgmemory_recall_audit SET reasons = NULL WHERE mode = 'text'")
            )
            await conn.execute(
                text("ALTER TABLE pgmemory_recall_audit ENABLE TRIGGER pgmemory_audit_guard")
            )
        report = await Admin(store).verify_audit()
        assert [c.name for c in report.problems] == ["row hashes"]
