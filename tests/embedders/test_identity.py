"""An embedder's id names its model and size, never the endpoint it is served from."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.embedders import make_embedder
from pgmemory.embedders.openai import OpenAIEmbedder
from pgmemory.store import migrate
from tests.embedders.test_embedders import _EmbeddingsServer


@pytest.fixture
def embeddings_server() -> Iterator[_EmbeddingsServer]:
    server = _EmbeddingsServer(fail_first=0)
    yield server
    server.close()


async def test_same_model_from_another_url_keeps_its_collection(
    embeddings_server: _EmbeddingsServer, database_url: str
) -> None:
    loopback = OpenAIEmbedder(
        model="emb-small", dimensions=6, base_url=embeddings_server.url, api_key="k"
    )
    renamed = embeddings_server.url.replace("127.0.0.1", "localhost")
    moved = OpenAIEmbedder(model="emb-small", dimensions=6, base_url=renamed, api_key="k")
    assert loopback.model_id == moved.model_id == "openai:emb-small@6"

    name = f"moved_{uuid.uuid4().hex[:8]}"
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(database_url, settings=settings, embedder=loopback) as store:
        await store.create_collection(name)
        await store.add(name, [MemoryRecord(content="a", scope=MemoryScope(user_id="u"))])
    async with MemoryStore(database_url, settings=settings, embedder=moved) as store:
        await store.add(name, [MemoryRecord(content="bb", scope=MemoryScope(user_id="u"))])
        assert await store.count(name, MemoryScope(user_id="u")) == 2


def test_explicit_model_id() -> None:
    embedder = OpenAIEmbedder(model="m", dimensions=4, api_key="k", model_id="acme:m-v2@4")
    assert embedder.model_id == "acme:m-v2@4"


def test_embeddings_endpoint_falls_back_to_the_chat_one() -> None:
    shared = Settings(  # type: ignore[call-arg]
        _env_file=None,
        embedder="openai",
        openai_base_url="http://127.0.0.1:9/v1",
        openai_api_key=SecretStr("chat-key"),
        openai_embedding_dimensions=8,
    )
    embedder = make_embedder(shared, cache=False)
    assert isinstance(embedder, OpenAIEmbedder)
    assert str(embedder._client.base_url).startswith("http://127.0.0.1:9/v1")
    assert embedder._client.api_key == "chat-key"

    own = shared.model_copy(
        update={
            "openai_embedding_base_url": "http://127.0.0.1:10/v1",
            "openai_embedding_api_key": SecretStr("emb-key"),
            "openai_embedding_model_id": "custom@8",
        }
    )
    embedder = make_embedder(own, cache=False)
    assert isinstance(embedder, OpenAIEmbedder)
    assert str(embedder._client.base_url).startswith("http://127.0.0.1:10/v1")
    assert embedder._client.api_key == "emb-key"
    assert embedder.model_id == "custom@8"


def test_migration_drops_the_host_from_old_ids(fresh_database: str) -> None:
    migrate.upgrade(fresh_database, "0003")
    engine = sa.create_engine(fresh_database)
    old = {
        "old_url": "http://127.0.0.1:8799/v1:text-embedding-3-small@256",
        "old_host": "https://api.example.com:text-embedding-3-large@1024",
        "local": "google/universal-sentence-encoder-multilingual-3",
    }
    with engine.begin() as conn:
        for name, model in old.items():
            conn.execute(
                sa.text(
                    "INSERT INTO pgmemory_collections (name, dimensions, embedding_model) "
                    "VALUES (:n, 8, :m)"
                ),
                {"n": name, "m": model},
            )
    migrate.upgrade(fresh_database)
    with engine.connect() as conn:
        rows = dict(
            conn.execute(sa.text("SELECT name, embedding_model FROM pgmemory_collections")).all()
        )
    engine.dispose()
    assert rows == {
        "old_url": "openai:text-embedding-3-small@256",
        "old_host": "openai:text-embedding-3-large@1024",
        "local": "google/universal-sentence-encoder-multilingual-3",
    }
