"""Shared fixtures: a real PostgreSQL (embedded, or PGMEMORY_TEST_DATABASE_URL) and stores.

Each test session works in a fresh database created for it (dropped at the end), migrated to
head once. Tests that need an empty or oddly configured database make their own with
``fresh_database``. With ``PGMEMORY_TEST_CITUS`` set, the server is a Citus cluster started
for the session (``tests/citus/cluster.py``, ``make test-citus``): each database is made on
every node and the session's is distributed after migrating.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.admin import Admin
from pgmemory.embedders import CachedEmbedder, USEEmbedder
from pgmemory.settings import Settings
from pgmemory.store import migrate
from pgmemory.store.embedded import EmbeddedServer
from pgmemory.store.store import MemoryStore
from tests.citus import cluster as citus_cluster
from tests.openai_server import OpenAIServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """On a Citus cluster, skip the reviewed list of tests that cannot apply to one."""
    if citus_cluster.enabled():
        from tests.citus.not_applicable import skip_not_applicable

        skip_not_applicable(items)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of the server the tests use (its maintenance database)."""
    external = os.environ.get("PGMEMORY_TEST_DATABASE_URL")
    if external:
        yield external
        return
    if citus_cluster.enabled():  # PGMEMORY_TEST_CITUS: a coordinator and two workers
        with citus_cluster.running_cluster() as cluster:
            yield cluster.url()
        return
    with tempfile.TemporaryDirectory(prefix="pgmemory-test-") as tmp:
        server = EmbeddedServer(Path(tmp) / "pgdata")
        url = server.start()
        try:
            yield url
        finally:
            server.stop()


@contextlib.contextmanager
def _database(server_url: str, prefix: str) -> Iterator[str]:
    cluster = citus_cluster.serving(server_url)
    if cluster is not None:  # on every node, with citus, the workers registered in it
        with citus_cluster.database(cluster, prefix) as url:
            yield url
        return
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def fresh_database(server_url: str) -> Iterator[str]:
    """A new, empty database (no extension, no schema) for this test only."""
    with _database(server_url, "pgmemory_fresh") as url:
        yield url


@pytest.fixture(scope="session")
def database_url(server_url: str) -> Iterator[str]:
    """The session's database, migrated to head."""
    with _database(server_url, "pgmemory_test") as url:
        migrate.upgrade(url)
        if citus_cluster.serving(url) is not None:
            citus_cluster.distribute(url)  # pgmemory db distribute
        yield url


#: Set (to anything non-empty) to run the tests' stores as a least-privilege application role
#: (``MemoryStore.create_app_role``) instead of the owner that migrated the database.
APP_ROLE_ENV = "PGMEMORY_TEST_APP_ROLE"
APP_ROLE_PASSWORD = "app-role-password-for-tests"


@pytest.fixture(scope="session")
def app_role_url(database_url: str) -> Iterator[str]:
    """The session database's URL as a new application role (dropped at the end)."""
    import asyncio

    role = f"pgmemory_app_{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        async with MemoryStore(database_url) as owner:
            await Admin(owner).create_app_role(role, APP_ROLE_PASSWORD)

    asyncio.run(create())
    url = make_url(database_url).set(username=role, password=APP_ROLE_PASSWORD)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        owner_engine = sa.create_engine(database_url)
        with owner_engine.begin() as conn:
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        owner_engine.dispose()


@pytest.fixture(scope="session")
def store_url(request: pytest.FixtureRequest, database_url: str) -> str:
    """The URL the ``store`` fixture opens: the owner's, or the application role's when
    PGMEMORY_TEST_APP_ROLE is set."""
    if os.environ.get(APP_ROLE_ENV):
        url: str = request.getfixturevalue("app_role_url")
        return url
    return database_url


@pytest.fixture(scope="session")
def embedder() -> CachedEmbedder:
    """The default local embedder (multilingual USE), shared by all tests."""
    return CachedEmbedder(USEEmbedder())


@pytest.fixture
def settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


@pytest_asyncio.fixture
async def store(
    store_url: str, embedder: CachedEmbedder, settings: Settings
) -> AsyncIterator[MemoryStore]:
    """An open store on the session database (as the application role under
    PGMEMORY_TEST_APP_ROLE)."""
    async with MemoryStore(store_url, settings=settings, embedder=embedder) as opened:
        yield opened


@pytest_asyncio.fixture
async def owner_engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """The session database as the owner that migrated it: for the setup and inspection an
    application role may not do (reading secrets, DDL), whatever role ``store`` runs as."""
    async with MemoryStore(database_url) as owner:
        yield owner.engine


@pytest_asyncio.fixture
async def poisoned_memories(owner_engine: AsyncEngine) -> AsyncIterator[str]:
    """For one test, the database refuses to insert a memory whose content is ``"poison"``
    (a trigger raising ``poisoned row``): a failure a write only meets on the server."""
    async with owner_engine.begin() as conn:
        # On Citus a trigger on a distributed table is created on every shard only with this
        # (a placeholder setting on one server).
        await conn.execute(sa.text("SET LOCAL citus.enable_unsafe_triggers = on"))
        await conn.execute(
            sa.text(
                "CREATE OR REPLACE FUNCTION pg_temp_poison() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN IF NEW.content = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF; "
                "RETURN NEW; END $$"
            )
        )
        await conn.execute(
            sa.text(
                "CREATE TRIGGER poison BEFORE INSERT ON pgmemory_memories "
                "FOR EACH ROW EXECUTE FUNCTION pg_temp_poison()"
            )
        )
    try:
        yield "poison"
    finally:
        async with owner_engine.begin() as conn:
            await conn.execute(sa.text("SET LOCAL citus.enable_unsafe_triggers = on"))
            await conn.execute(sa.text("DROP TRIGGER poison ON pgmemory_memories"))
        async with owner_engine.begin() as conn:  # Citus: not after the shards' DDL in one
            await conn.execute(sa.text("DROP FUNCTION pg_temp_poison()"))


@pytest_asyncio.fixture
async def collection(store: MemoryStore) -> str:
    """A new collection (USE model, 512 dims) with a unique name."""
    name = f"c_{uuid.uuid4().hex[:10]}"
    await store.create_collection(name)
    return name


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A fresh scripted OpenAI-compatible chat-completions server for one test."""
    with OpenAIServer() as server:
        yield server


@pytest.fixture
def chat_client(openai_server: OpenAIServer) -> Any:
    """agent-framework's ``OpenAIChatCompletionClient`` (the real ``openai`` client inside) on
    ``openai_server``, no retries."""
    from agent_framework.openai import OpenAIChatCompletionClient
    from openai import AsyncOpenAI

    return OpenAIChatCompletionClient(
        model="test-model",
        async_client=AsyncOpenAI(base_url=openai_server.url, api_key="test", max_retries=0),
    )


def unique(prefix: str) -> str:
    """A unique id for scope values, so tests never see each other's rows."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
