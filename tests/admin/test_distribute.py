"""``pgmemory db distribute`` on a real Citus cluster (``make test-citus``): one go on a fresh
migrated database, all-or-nothing, the audit triggers on every shard, Citus's DETAIL shown.

Each test makes its own database on every node of the session's cluster; on a single server
(``make test``) there is no cluster, and these tests say so and skip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from pgmemory.admin import Admin, distribution
from pgmemory.admin.distribution import Distribution
from pgmemory.cli import run
from pgmemory.errors import DatabaseNotReadyError
from pgmemory.settings import Settings
from pgmemory.store import migrate, routing
from pgmemory.store._engine.database import Database
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.citus import cluster as citus_cluster
from tests.conftest import _database


@pytest.fixture
def cluster(server_url: str) -> citus_cluster.Cluster:
    found = citus_cluster.serving(server_url)
    if found is None:
        pytest.skip("needs the Citus cluster of `make test-citus` (PGMEMORY_TEST_CITUS=1)")
    return found


@pytest.fixture
def migrated(cluster: citus_cluster.Cluster, server_url: str) -> Iterator[str]:
    """A database on every node of the cluster, migrated to head, not distributed."""
    with _database(server_url, "pgmemory_dist") as url:
        migrate.upgrade(url)
        yield url


def _layout(url: str) -> dict[str, tuple[str, str, int]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT CAST(table_name AS text), CAST(citus_table_type AS text), "
                    "distribution_column, colocation_id FROM citus_tables"
                )
            ).all()
    finally:
        engine.dispose()
    return {name: (kind, column, colocation) for name, kind, column, colocation in rows}


async def _distribute(url: str) -> Distribution:
    async with MemoryStore(url) as store:
        return await Admin(store).distribute()


async def test_distribute_succeeds_in_one_go_and_again_changes_nothing(
    cluster: citus_cluster.Cluster, migrated: str
) -> None:
    done = await _distribute(migrated)
    assert done.reference == list(routing.REFERENCE_TABLES)
    assert done.distributed == list(routing.PER_USER_TABLES)
    assert done.unchanged == []
    layout = _layout(migrated)
    assert {table: kind for table, (kind, _, _) in layout.items()} == {
        **dict.fromkeys(routing.REFERENCE_TABLES, "reference"),
        **dict.fromkeys(routing.PER_USER_TABLES, "distributed"),
    }
    per_user = [layout[table] for table in routing.PER_USER_TABLES]
    assert {column for _, column, _ in per_user} == {routing.DISTRIBUTION_COLUMN}
    together = [layout[t] for t in routing.PER_USER_TABLES if t not in routing.SEPARATELY_COLOCATED]
    assert len({colocation for _, _, colocation in together}) == 1, "not co-located"
    # The secrets, read by the owner's function inside the role's transactions, apart.
    for table in routing.SEPARATELY_COLOCATED:
        assert layout[table][2] not in {colocation for _, _, colocation in together}, table

    again = await _distribute(migrated)
    assert (again.reference, again.distributed) == ([], [])
    assert sorted(again.unchanged) == sorted(routing.REFERENCE_TABLES + routing.PER_USER_TABLES)


async def test_the_audit_guard_triggers_are_on_every_shard(
    cluster: citus_cluster.Cluster, migrated: str
) -> None:
    await _distribute(migrated)
    name = sa.engine.make_url(migrated).database
    assert name
    for worker in cluster.workers:
        engine = sa.create_engine(worker.url(name))
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SET citus.override_table_visibility = off"))  # see shards
                shards, guarded = conn.execute(
                    sa.text(
                        "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM "
                        "pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname "
                        "LIKE 'pgmemory\\_audit\\_guard%')) FROM pg_class c WHERE c.relkind = 'r' "
                        "AND c.relname ~ '^pgmemory_(memory|recall|fact)_audit_[0-9]+$'"
                    )
                ).one()
        finally:
            engine.dispose()
        assert shards > 0 and guarded == shards, (worker.port, shards, guarded)


async def test_a_half_distributed_database_is_finished(migrated: str) -> None:
    """What an earlier `db distribute` left: the catalogue a reference table, which made
    pgmemory_memories a Citus 'local' table, and nothing distributed."""
    engine = sa.create_engine(migrated, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT create_reference_table('pgmemory_collections')"))
    engine.dispose()
    assert _layout(migrated)["pgmemory_memories"][0] == "local"

    done = await _distribute(migrated)
    assert done.unchanged == list(routing.REFERENCE_TABLES)
    assert done.distributed == list(routing.PER_USER_TABLES)
    assert _layout(migrated)["pgmemory_memories"][:2] == ("distributed", "user_id")


async def test_a_refusal_shows_citus_detail_and_changes_nothing(
    migrated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A unique index without the distribution column: Citus cannot distribute the table.
    engine = sa.create_engine(migrated, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(
            sa.text("CREATE UNIQUE INDEX facts_by_namespace ON pgmemory_facts (namespace)")
        )
    engine.dispose()

    with pytest.raises(DatabaseNotReadyError) as raised:
        await _distribute(migrated)
    message = str(raised.value)
    assert "create_distributed_table(pgmemory_facts" in message
    assert "DETAIL: " in message and "partition column" in message
    assert "nothing was changed" in message
    assert _layout(migrated) == {}, "the tables distributed before the refusal stayed so"

    assert await asyncio.to_thread(run, ["--url", migrated, "db", "distribute"]) == 1
    assert "DETAIL: " in capsys.readouterr().err


async def test_a_table_sharded_another_way_is_refused(migrated: str) -> None:
    engine = sa.create_engine(migrated, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT create_reference_table('pgmemory_user_secrets')"))
    engine.dispose()
    with pytest.raises(DatabaseNotReadyError, match="pgmemory_user_secrets is a reference table"):
        await _distribute(migrated)
    assert set(_layout(migrated)) == {"pgmemory_user_secrets"}, "something was changed"


async def test_partitioning_is_refused_on_a_citus_database(migrated: str) -> None:
    """db partition is for one server: on a Citus database it says so and changes nothing."""
    async with MemoryStore(migrated) as store:
        with pytest.raises(DatabaseNotReadyError, match="citus extension.*Nothing was changed"):
            await Admin(store).partition_memories(partitions=4)
    engine = sa.create_engine(migrated)
    with engine.connect() as conn:
        kind = conn.execute(
            sa.text("SELECT relkind::text FROM pg_class WHERE oid = 'pgmemory_memories'::regclass")
        ).scalar_one()
    engine.dispose()
    assert kind == "r"


#: The revisions after 0008, in order: each must apply to an already distributed schema (a
#: database distributed at 0008, as a user moving to Citus then would have it).
AFTER_0008 = [
    "0009",
    "0010",
    "0012",
    "0013",
    "0014",
    "0015",
    "0016",
    "0017",
    "0018",
    "0019",
    "0020",
    "0021",
    "0022",
    "0023",
]


async def test_each_migration_after_0008_applies_to_a_distributed_database(
    cluster: citus_cluster.Cluster, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _database(server_url, "pgmemory_steps") as url:
        migrate.upgrade(url, "0008")
        # Distributed at 0008 by this version's `db distribute` (its database check told
        # that 0008 is the head, for this step only).
        with monkeypatch.context() as patch:
            patch.setattr(migrate, "head_revision", lambda: "0008")
            db = Database(url, settings=Settings(_env_file=None), migrate=False)  # type: ignore[call-arg]
            await db.open()
            try:
                done = await distribution.distribute(db)
            finally:
                await db.close()
        assert "pgmemory_memories" in done.distributed
        assert _revisions_after("0008") == AFTER_0008  # a new migration joins this list
        for revision in AFTER_0008:
            migrate.upgrade(url, revision)  # raises with Citus's error if it cannot apply
            assert migrate.current(url) == revision
        assert _layout(url)["pgmemory_memories"][:2] == ("distributed", "user_id")
        assert _layout(url)["pgmemory_jobs"][:2] == ("distributed", "user_id")  # by 0016
        assert _layout(url)["pgmemory_deleted_memories"][:2] == ("distributed", "user_id")
        assert _search_vector_storage(url) == {"m"}  # every shard's, by 0017
        assert _term_index_options(url) == {"{fastupdate=off}"}  # every shard's, by 0020
        # The migrated cluster serves the library: a write and a recall of one user.
        async with MemoryStore(url) as store:
            await store.create_collection("c", dimensions=3, embedding_model="test")
            scope = MemoryScope(user_id="ada")
            await store.add("c", [MemoryRecord(content="tea", scope=scope, embedding=[1, 0, 0])])
            hits = await store.search("c", scope, vector=[1, 0, 0], limit=1)
            assert [h.memory.content for h in hits] == ["tea"]
            # the keyword side through the scoped term index (0018), on the user's shard
            hits = await store.search("c", scope, query="tea", mode="text")
            assert [h.memory.content for h in hits] == ["tea"]
            # a delete audited on the user's shard, its evidence taken there (0023)
            assert await store.delete("c", ids=[hits[0].memory.id], scope=scope) == 1
        async with MemoryStore(url) as store:
            assert (await Admin(store).verify_audit()).ok


#: The storage of ``search_vector`` in the table ``{}`` names.
_SEARCH_VECTOR_STORAGE = (
    "SELECT attstorage::text FROM pg_attribute WHERE attrelid = {} AND attname = 'search_vector'"
)
#: The options of the term index (the GIN index) on the table ``{}`` names.
_TERM_INDEX_OPTIONS = (
    "SELECT COALESCE(c.reloptions::text, '') FROM pg_index AS i "
    "JOIN pg_class AS c ON c.oid = i.indexrelid JOIN pg_am AS a ON a.oid = c.relam "
    "WHERE i.indrelid = {} AND a.amname = 'gin'"
)


def _search_vector_storage(url: str) -> set[str]:
    """The storage of ``search_vector`` in the coordinator's table and every shard."""
    return _on_table_and_shards(url, _SEARCH_VECTOR_STORAGE)


def _term_index_options(url: str) -> set[str]:
    """The options of the term index on the coordinator's table and on every shard."""
    return _on_table_and_shards(url, _TERM_INDEX_OPTIONS)


def _on_table_and_shards(url: str, query: str) -> set[str]:
    """The distinct answers of ``query`` (one value; ``{}`` is the table) on the coordinator's
    ``pgmemory_memories`` and on each of its shards."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            local = conn.execute(
                sa.text(query.format("'pgmemory_memories'::regclass"))
            ).scalar_one()
            shards = conn.execute(
                sa.text("SELECT result FROM run_command_on_shards('pgmemory_memories', :c)"),
                {"c": query.format("'%s'::regclass")},
            ).scalars()
            return {local, *shards}
    finally:
        engine.dispose()


def _revisions_after(revision: str) -> list[str]:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    chain = [s.revision for s in script.walk_revisions()][::-1]
    return chain[chain.index(revision) + 1 :]


async def test_a_database_with_memories_distributes_and_keeps_them(migrated: str) -> None:
    """Moving a live single-server database: rows, history and audit written before
    `db distribute` are all there after it, searched on the user's shard, and verify."""
    scope = MemoryScope(user_id="ada", session_id="s1")
    async with MemoryStore(migrated) as store:
        await store.create_collection("c", dimensions=3, embedding_model="test")
        ids = await store.add(
            "c",
            [
                MemoryRecord(content="tea", scope=scope, embedding=[1, 0, 0]),
                MemoryRecord(content="jazz", scope=scope, embedding=[0, 1, 0]),
            ],
        )
        await store.append_history(
            "s1", [{"message_id": "m1", "role": "user", "t": 1}], user_id="ada"
        )
        before = await store.search("c", MemoryScope(user_id="ada"), vector=[1, 0, 0], limit=2)
    done = await _distribute(migrated)
    assert "pgmemory_memories" in done.distributed
    async with MemoryStore(migrated) as store:
        after = await store.search("c", MemoryScope(user_id="ada"), vector=[1, 0, 0], limit=2)
        assert [h.memory.id for h in after] == [h.memory.id for h in before] == ids
        assert await store.count_history("s1", user_id="ada") == 1
        assert (await Admin(store).verify_audit()).ok
        audited = (await Admin(store).user_memory_audit("ada")).items
        assert {a.memory_id for a in audited} == set(ids)
    # Nothing is left behind on the coordinator: Citus keeps a distributed table's former
    # local rows on disk until told to drop them, and `db distribute` does.
    engine = sa.create_engine(migrated)
    try:
        with engine.connect() as conn:
            left = {
                table: conn.execute(
                    sa.text("SELECT pg_relation_size(CAST(:t AS regclass))"), {"t": table}
                ).scalar_one()
                for table in routing.PER_USER_TABLES
            }
    finally:
        engine.dispose()
    assert set(left.values()) == {0}, left
