"""Erasure that erases, and an audit only pgmemory's own functions may change (migration 0006)."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.admin import Admin
from pgmemory.embedders import CachedEmbedder
from pgmemory.errors import DatabaseNotReadyError, InvalidInputError
from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.jobs import JobQueue
from pgmemory.store.records import MemoryRecord, MemoryScope, RecallTrace
from pgmemory.store.store import MemoryStore
from tests.conftest import unique

AUDITS = ("pgmemory_memory_audit", "pgmemory_recall_audit", "pgmemory_fact_audit")
GUESS = "diagnosed with diabetes"


def _sha(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8")).hexdigest()


async def _secret(owner: AsyncEngine, user: str) -> bytes | None:
    async with owner.connect() as conn:
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
    store: MemoryStore, collection: str, owner_engine: AsyncEngine
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
    assert await _secret(owner_engine, user) is not None

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
    assert await _secret(owner_engine, user) is None
    assert pseudonym != "erased:" + _sha(user)


async def test_a_write_after_erasure_gets_a_fresh_secret(
    store: MemoryStore, collection: str, owner_engine: AsyncEngine
) -> None:
    user = unique("bob@example.com")
    await _seed(store, collection, user)
    before = await _secret(owner_engine, user)
    await store.erase_user(user)
    await store.add(collection, [MemoryRecord(content=GUESS, scope=MemoryScope(user_id=user))])
    after = await _secret(owner_engine, user)
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
    store: MemoryStore, collection: str, owner_engine: AsyncEngine
) -> None:
    await _seed(store, collection, unique("carol"))
    for statement in (
        "UPDATE {t} SET user_id = user_id",
        "DELETE FROM {t}",
        "TRUNCATE {t}",
    ):
        for table in AUDITS:
            # The owner (the application role's privileges refuse before the guard is asked).
            with pytest.raises(DBAPIError, match="audit rows are append-only"):
                async with owner_engine.begin() as conn:
                    await conn.execute(text(statement.format(t=table)))


async def test_verify_passes_on_a_store_after_erasure_and_after_prune(
    store: MemoryStore, collection: str
) -> None:
    report = await Admin(store).verify_audit()
    assert report.ok, report.problems
    user = unique("dave")
    await _seed(store, collection, user)
    await store.erase_user(user, actor="dpo")
    report = await Admin(store).verify_audit()
    assert report.ok, report.problems
    await Admin(store).prune_audit(timedelta(days=3650), actor="retention")
    report = await Admin(store).verify_audit()
    assert report.ok, report.problems
    assert {c.name for c in report.checks} >= {"guard triggers", "row hashes", "grants"}
    assert report.tables["pgmemory_memory_audit"]["rows"]


async def test_verify_names_a_disabled_trigger_and_a_row_the_owner_changed(
    fresh_database: str, embedder: CachedEmbedder, settings: Settings
) -> None:
    migrate.upgrade(fresh_database)
    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        assert (await Admin(store).verify_audit()).ok  # an empty audit
        name = unique("c")
        await store.create_collection(name, dimensions=3, embedding_model="test")
        await store.add(
            name,
            [MemoryRecord(content="x", embedding=[1.0, 0, 0], scope=MemoryScope(user_id="u"))],
        )
        assert (await Admin(store).verify_audit()).ok
        async with store.engine.begin() as conn:
            await conn.execute(
                text("ALTER TABLE pgmemory_memory_audit DISABLE TRIGGER pgmemory_audit_guard")
            )
        report = await Admin(store).verify_audit()
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
        report = await Admin(store).verify_audit()
        assert [c.name for c in report.problems] == ["row hashes"]
        assert "pgmemory_memory_audit: 1 row(s)" in report.problems[0].detail


async def test_the_application_role_writes_erases_and_prunes_but_cannot_touch_the_audit(
    app_role_url: str, embedder: CachedEmbedder, settings: Settings
) -> None:
    async with MemoryStore(app_role_url, settings=settings, embedder=embedder) as app:
        name = unique("c")
        await app.create_collection(name)
        user = unique("erin@example.com")
        await _seed(app, name, user)
        assert (await app.read_history("s1", user_id=user)) == []
        refused = {
            "DELETE FROM pgmemory_memory_audit": "permission denied",
            "UPDATE pgmemory_recall_audit SET query_text = NULL": "permission denied",
            "TRUNCATE pgmemory_fact_audit": "permission denied",
            "SELECT secret FROM pgmemory_user_secrets": "permission denied",
            "SELECT token_sha256 FROM pgmemory_access_tokens": "permission denied",
            "INSERT INTO pgmemory_access_tokens (name, purpose, token_sha256, expires_at) "
            "VALUES ('x', 'ui', 'h', now() + interval '1 day')": "permission denied",
            "CREATE TABLE pgmemory_rogue (id int)": "permission denied for schema",
            "DROP TABLE pgmemory_memory_audit": "must be owner",
            "ALTER TABLE pgmemory_memory_audit DISABLE TRIGGER pgmemory_audit_guard": "must be owner",
        }
        for statement, error in refused.items():
            with pytest.raises(DBAPIError, match=error):
                async with app.engine.begin() as conn:
                    # Even with the guard's switch set: privileges refuse first.
                    await conn.execute(text("SET LOCAL pgmemory.audit_change = 'sanctioned'"))
                    await conn.execute(text(statement))
        # The sanctioned paths work as the application role.
        counts = await app.erase_user(user, actor="dpo")
        assert counts["memories"] == 1 and counts["memory_audit_rows_pseudonymised"] == 2
        pruned = await Admin(app).prune_audit(timedelta(days=3650), actor="retention")
        assert set(pruned) == {"recall_audit", "memory_audit", "fact_audit"}
        report = await Admin(app).verify_audit()
        assert report.ok, report.problems
        assert "privileges refused the probe" in next(
            c.detail for c in report.checks if c.name == "guard probe"
        )


async def test_create_app_role_sends_only_a_verifier_and_refuses_bad_names(
    store: MemoryStore, database_url: str
) -> None:
    import base64
    import hmac

    password = "correct horse battery staple"
    role = f"pgmemory_app_{unique('r').split('-')[1]}"
    async with MemoryStore(database_url, embedder=store.embedder) as owner:
        report = await Admin(owner).create_app_role(role, password)
        again = await Admin(owner).create_app_role(role, password + "!")  # a re-run resets it
        assert report.created and not again.created
        assert all(password not in s for s in report.statements)
        async with owner.engine.begin() as conn:
            stored = (
                await conn.execute(
                    text("SELECT rolpassword FROM pg_authid WHERE rolname = :r"), {"r": role}
                )
            ).scalar_one()
            await conn.execute(text(f'DROP OWNED BY "{role}"'))
            await conn.execute(text(f'DROP ROLE "{role}"'))
        # SCRAM-SHA-256$<iterations>:<salt>$<stored key>:<server key>, of the newest password.
        method, rest = stored.split("$", 1)
        iterations_salt, keys = rest.split("$")
        iterations, salt = iterations_salt.split(":")
        salted = hashlib.pbkdf2_hmac(
            "sha256", (password + "!").encode(), base64.b64decode(salt), int(iterations)
        )
        client_key = hmac.new(salted, b"Client Key", "sha256").digest()
        assert method == "SCRAM-SHA-256"
        assert keys.split(":")[0] == base64.b64encode(hashlib.sha256(client_key).digest()).decode()
        for bad in ('x"; DROP TABLE t; --', "Robert", "pg_app", "", "a" * 64, "1abc"):
            with pytest.raises(InvalidInputError, match="role name must be"):
                await Admin(owner).create_app_role(bad, password)
        with pytest.raises(InvalidInputError, match="shorter than 12"):
            await Admin(owner).create_app_role("pgmemory_short", "short")


async def test_a_role_set_up_before_a_table_existed_is_told_to_run_db_roles_again(
    database_url: str, embedder: CachedEmbedder, settings: Settings
) -> None:
    password = "correct horse battery staple"
    role = f"pgmemory_app_{unique('r').split('-')[1]}"
    url = make_url(database_url).set(username=role, password=password)
    name = unique("c")
    scope = MemoryScope(user_id=unique("u"))
    async with MemoryStore(database_url, embedder=embedder) as owner:
        await owner.create_collection(name)
        await Admin(owner).create_app_role(role, password)
        try:
            async with owner.engine.begin() as conn:
                # What a role set up before the queue (0016) or before the memories has.
                await conn.execute(text(f'REVOKE ALL ON pgmemory_jobs FROM "{role}"'))
                await conn.execute(text(f'REVOKE ALL ON pgmemory_memories FROM "{role}"'))
            rerun = rf"role {role} has no privilege on {{}}.*run `pgmemory db roles {role}` again"
            async with MemoryStore(url, settings=settings, embedder=embedder) as app:
                with pytest.raises(DatabaseNotReadyError, match=rerun.format("pgmemory_jobs")):
                    await JobQueue(app.database).enqueue("facts", scope, {"n": 1})
                # the fast path's statement, on psycopg directly
                with pytest.raises(DatabaseNotReadyError, match=rerun.format("pgmemory_memories")):
                    await app.search(name, scope, query="tea")
                # what the role is refused by design stays a plain refusal
                with pytest.raises(DBAPIError, match="permission denied for table"):
                    async with app.engine.begin() as conn:
                        await conn.execute(text("DELETE FROM pgmemory_memory_audit"))
            await Admin(owner).create_app_role(role, password)  # the fix the error names
            async with MemoryStore(url, settings=settings, embedder=embedder) as app:
                await JobQueue(app.database).enqueue("facts", scope, {"n": 1})
                assert await app.search(name, scope, query="tea") == []
        finally:
            async with owner.engine.begin() as conn:
                await conn.execute(text(f'DROP OWNED BY "{role}"'))
                await conn.execute(text(f'DROP ROLE "{role}"'))
