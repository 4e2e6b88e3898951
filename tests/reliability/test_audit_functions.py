"""The audit functions refuse what the owner would not do, whichever role calls them, and audit
rows carry the server's time: the least-privilege role can append audit rows and erase or prune
through the functions, never rewrite what the audit says.

Every misuse is tried as the schema's owner and as the application role (``pgmemory db roles``),
directly in SQL as an attacker holding the role's credentials would; after all of them the
audit is unchanged and ``audit verify`` still passes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from pgmemory import InvalidInputError, MemoryRecord, MemoryScope, MemoryStore, PgMemoryError
from pgmemory.admin import Admin
from tests.conftest import unique

DIMENSIONS = 3

#: An audit row the role may write by itself (a recall that showed nothing: the application's
#: own statement; rows that record a change need the change, tests/reliability/
#: test_audit_forgery.py), dated by the writer.
_RECALL_AUDIT_DATED = (
    "INSERT INTO pgmemory_recall_audit (user_id, collection, application_id, agent_id, "
    "session_id, query_sha256, memory_ids, scores, at) "
    "VALUES (:u, 'c', '', '', '', repeat('0', 64), '{}', '{}', '2001-01-01') RETURNING at"
)


def _audit_rows(database_url: str) -> list[tuple[object, ...]]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            return sorted(
                tuple(row)
                for table in (
                    "pgmemory_memory_audit",
                    "pgmemory_recall_audit",
                    "pgmemory_fact_audit",
                )
                for row in conn.execute(sa.text(f"SELECT id, user_id, row_sha256 FROM {table}"))
            )
    finally:
        engine.dispose()


async def _live_user(database_url: str) -> tuple[str, str]:
    """A user with a stored memory and a recall; returns (user, collection)."""
    user, collection = unique("live"), f"c_{uuid.uuid4().hex[:10]}"
    async with MemoryStore(database_url) as store:
        await store.create_collection(collection, dimensions=DIMENSIONS, embedding_model="t:3")
        scope = MemoryScope(user_id=user)
        await store.add(collection, [MemoryRecord(content="x", scope=scope, embedding=[1, 0, 0])])
        await store.search(collection, scope, vector=[1, 0, 0], limit=1)
        await Admin(store).prune_audit(timedelta(days=3650), actor="setup")  # a prune record
        erased = unique("gone")
        await store.add(
            collection,
            [MemoryRecord(content="y", scope=MemoryScope(user_id=erased), embedding=[0, 1, 0])],
        )
        await store.erase_user(erased)  # an erasure record and a pseudonym
    return user, collection


async def test_every_misuse_is_refused_and_the_audit_is_unchanged(
    database_url: str, role_engine: sa.Engine
) -> None:
    live, _ = await _live_user(database_url)
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        pseudonym = conn.execute(
            sa.text(
                "SELECT user_id FROM pgmemory_memory_audit WHERE left(user_id, 7) = 'erased:' LIMIT 1"
            )
        ).scalar_one()
    engine.dispose()
    before = _audit_rows(database_url)
    attempts = {
        "erase the records user": "SELECT pgmemory_erase_user_audit('', 'attacker')",
        "erase a pseudonym": f"SELECT pgmemory_erase_user_audit('{pseudonym}', 'attacker')",
        "erase a user whose data is stored": "SELECT pgmemory_erase_user_audit(:live, 'attacker')",
        "prune with a future cutoff": (
            "SELECT pgmemory_prune_audit(now() + interval '1 day', true, true, true, 'attacker')"
        ),
        "prune a minute ahead": (
            "SELECT pgmemory_prune_audit(now() + interval '1 minute', true, true, true, 'a')"
        ),
    }
    for what, statement in attempts.items():
        with pytest.raises(sa.exc.DBAPIError) as refused, role_engine.begin() as conn:
            conn.execute(sa.text(statement), {"live": live})
        message = str(refused.value.orig)
        assert message.startswith("pgmemory: "), (what, message)
        assert live not in message, what  # no user id in the refusal
    assert _audit_rows(database_url) == before
    async with MemoryStore(database_url) as owner:
        report = await Admin(owner).verify_audit()
    assert report.ok, report.problems


async def test_audit_rows_carry_the_servers_time_whatever_the_insert_says(
    database_url: str, role_engine: sa.Engine
) -> None:
    user = unique("dated")
    with role_engine.begin() as conn:
        at = conn.execute(
            sa.text(_RECALL_AUDIT_DATED),
            {"u": user},
        ).scalar_one()
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
    # The server's clock: this transaction's start (on Citus, the worker's, a moment later).
    assert timedelta(0) <= at - now < timedelta(seconds=5)


async def test_the_library_refuses_them_too_with_its_own_errors(database_url: str) -> None:
    async with MemoryStore(database_url) as store:
        with pytest.raises(InvalidInputError, match="in the future"):
            await Admin(store).prune_audit(datetime.now(UTC) + timedelta(hours=1))


async def test_a_write_landing_inside_an_erasure_makes_it_fail_whole(database_url: str) -> None:
    """A write of the user that lands after the erasure deleted the user's rows (simulated,
    deterministically, by a trigger on the last of those deletes) leaves live data the audit
    function sees: the erasure fails with a pgmemory error and nothing of it is kept."""
    user, collection = await _live_user(database_url)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE FUNCTION pgmemory_test_late_write() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN INSERT INTO pgmemory_facts (user_id, application_id, agent_id, session_id, "
            "namespace, facts) VALUES (OLD.user_id, '', '', '', 'late', '{}') "
            "ON CONFLICT DO NOTHING; RETURN OLD; END $$"
        ))  # fmt: skip
        conn.execute(sa.text(
            "CREATE TRIGGER pgmemory_test_late_write AFTER DELETE ON pgmemory_chat_messages "
            "FOR EACH ROW EXECUTE FUNCTION pgmemory_test_late_write()"
        ))  # fmt: skip
    try:
        async with MemoryStore(database_url) as store:
            await store.append_history(
                "s", [{"message_id": "m", "role": "user", "text": "hi"}], user_id=user
            )
            with pytest.raises(PgMemoryError, match="nothing was erased") as refused:
                await store.erase_user(user)
            assert user not in str(refused.value)
            assert await store.count(collection, MemoryScope(user_id=user)) == 1  # all kept
            assert await store.count_history("s", user_id=user) == 1
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TRIGGER pgmemory_test_late_write ON pgmemory_chat_messages"))
            conn.execute(sa.text("DROP FUNCTION pgmemory_test_late_write()"))
        engine.dispose()


@pytest.mark.slow
async def test_an_erasure_does_not_depend_on_the_users_size(database_url: str) -> None:
    """A user of 20,000 memories is erased under a statement timeout far shorter than the
    erasure takes (the store's own timeout covers interactive statements, not erasure)."""
    from pgmemory.settings import Settings

    user, collection = unique("big"), f"c_{uuid.uuid4().hex[:10]}"
    scope = MemoryScope(user_id=user)
    async with MemoryStore(database_url) as store:
        await store.create_collection(collection, dimensions=DIMENSIONS, embedding_model="t:3")
        await store.import_records(
            collection,
            (
                MemoryRecord(content=f"m{i}", scope=scope, embedding=[1, 0, i % 7])
                for i in range(20_000)
            ),
        )
    settings = Settings(_env_file=None, statement_timeout_ms=20)  # type: ignore[call-arg]
    async with MemoryStore(database_url, settings=settings) as store:
        counts = await store.erase_user(user)
        assert counts["memories"] == 20_000
    # checked under the default timeout: right after the erasure a count of the scope still
    # visits the 20,000 dead index entries, which the 20 ms meant for the erasure does not cover
    async with MemoryStore(database_url) as store:
        assert await store.count(collection, scope) == 0


async def test_a_role_setting_the_functions_flag_itself_gains_nothing(
    database_url: str, role_engine: sa.Engine
) -> None:
    """The guard honours the functions' flag for the tables' owner only: set by the role in
    its own transaction, it neither backdates an insert nor opens UPDATE or DELETE."""
    user = unique("flag")
    with role_engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL pgmemory.audit_change = 'sanctioned'"))
        at = conn.execute(
            sa.text(_RECALL_AUDIT_DATED),
            {"u": user},
        ).scalar_one()
    if role_engine.url.username == sa.engine.make_url(database_url).username:
        return  # the owner holding the flag is what the functions are (and may do anything)
    assert at.year > 2001  # stamped with the server's clock
    with pytest.raises(sa.exc.DBAPIError), role_engine.begin() as conn:
        conn.execute(sa.text("SET LOCAL pgmemory.audit_change = 'sanctioned'"))
        conn.execute(sa.text("DELETE FROM pgmemory_recall_audit WHERE user_id = :u"), {"u": user})


async def test_an_erasure_moves_each_audit_row_whole_to_the_pseudonym(
    database_url: str, role_engine: sa.Engine
) -> None:
    """Each audit row of an erased user is moved (the distribution column cannot be updated on
    Citus): under the pseudonym with its id, time and hashed values, the personal ones blanked;
    none stays under the user, and the audit still verifies."""
    user, _ = await _live_user(database_url)
    async with MemoryStore(database_url) as store:
        await store.merge_facts("profile", MemoryScope(user_id=user), {"city": "Oslo"})
    columns = {
        "pgmemory_memory_audit": "id, at, txid, operation, memory_id, collection, content_sha256",
        "pgmemory_recall_audit": "id, at, collection, mode, query_sha256, memory_ids, scores",
        "pgmemory_fact_audit": "id, at, namespace, key",
    }
    engine = sa.create_engine(database_url)

    def rows(who: str) -> dict[str, list[tuple[object, ...]]]:
        with engine.connect() as conn:
            return {
                table: [
                    tuple(r)
                    for r in conn.execute(
                        sa.text(f"SELECT {cols} FROM {table} WHERE user_id = :u ORDER BY id"),
                        {"u": who},
                    )
                ]
                for table, cols in columns.items()
            }

    try:
        before = rows(user)
        assert all(before.values())
        with role_engine.begin() as conn:
            summary = conn.execute(
                sa.text("SELECT pgmemory_erase_user(:u, 'test')"), {"u": user}
            ).scalar_one()
        pseudonym = summary["pseudonym"]
        after = rows(pseudonym)
        assert not any(rows(user).values())
        # The memory's delete row joins the moved ones; every earlier row moved unchanged.
        assert (
            after["pgmemory_memory_audit"][: len(before["pgmemory_memory_audit"])]
            == (before["pgmemory_memory_audit"])
        )
        assert [r[3] for r in after["pgmemory_memory_audit"]][-1] == "delete"
        assert after["pgmemory_recall_audit"] == before["pgmemory_recall_audit"]
        assert after["pgmemory_fact_audit"] == before["pgmemory_fact_audit"]
        assert summary["erased"] == {"memories": 1, "facts": 1, "history_messages": 0, "jobs": 0}
        with engine.connect() as conn:
            kept = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pgmemory_fact_audit WHERE user_id = :p "
                    "AND (old_value IS NOT NULL OR new_value IS NOT NULL)"
                ),
                {"p": pseudonym},
            ).scalar_one()
        assert kept == 0
    finally:
        engine.dispose()
    async with MemoryStore(database_url) as owner:
        report = await Admin(owner).verify_audit()
    assert report.ok, report.problems
