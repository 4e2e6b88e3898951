"""Peer: mem0 (``mem0ai``) ``AsyncMemory`` on its pgvector store, ``add(..., infer=False)``.

Used as its docs show: ``AsyncMemory(MemoryConfig(vector_store={"provider": "pgvector", ...}))``
with the pgvector defaults (table ``id uuid, vector, payload jsonb``, HNSW cosine index, GIN
full-text index on ``payload->>'text_lemmatized'``), ``add(messages, user_id=u, infer=False)`` and
``search(query, filters={"user_id": u}, top_k=3, threshold=0.0)``.

Offline, and how:
* ``infer=False`` stores each message as is: no LLM call. mem0 still builds an LLM client from
  config at construction; we give the default ``openai`` provider a placeholder key - the
  client is built, never called.
* Embedder: mem0 accepts no vectors on ``add``/``search``, it always embeds text. Its documented
  custom-embedder route is the ``langchain`` provider with a LangChain ``Embeddings`` object;
  ours is a lookup of the precomputed vectors (by row index parsed from the text, or registered
  just before the call), as the LangGraph adapter does: no model runs.
* ``MEM0_TELEMETRY=False`` (else PostHog events and a notice config fetched over HTTP),
  ``MEM0_DIR`` and the SQLite history database in a temporary directory.
* spaCy is not installed (mem0's ``nlp`` extra): BM25 lemmatising falls back to the raw text and
  query entity extraction to none; nothing is downloaded.
* A guard refuses any Python-level network connection other than loopback / Unix sockets
  (psycopg's libpq connects in C and is not affected); any attempt fails the run.

What a call costs in mem0 (its own code, 2.2.1): ``search`` runs the vector query (over-fetching
``max(4 * top_k, 60)`` rows) and a full-text query on the same scope, then scores in Python;
``add`` of a turn's 2 messages is 2 INSERTs in 2 transactions (not one) plus 2 history rows in
SQLite. The store's own calls are synchronous psycopg run in threads (``asyncio.to_thread``).
``threshold=0.0``: the default 0.1 drops neighbours below cosine 0.1, which would count as misses
here; recall@3 should measure the store, not the relevance cut-off.
We add a B-tree on ``(payload->>'user_id')`` (mem0 creates none), as the PGVectorStore adapter
adds one on user_id: without it the scope filter has no statistics and no index.
Run by bench/store/scale.py in bench/.peers/mem0/.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import socket
import tempfile
from typing import Any

TMP = tempfile.mkdtemp(prefix="mem0-bench-")
os.environ["MEM0_TELEMETRY"] = "False"
os.environ["MEM0_DIR"] = TMP

# --- network guard (installed before mem0 is imported) -----------------------------------------
NETWORK_ATTEMPTS: list[str] = []
_connect = socket.socket.connect
_getaddrinfo = socket.getaddrinfo
_LOCAL = {"localhost", "127.0.0.1", "::1", None, ""}


def _guard_connect(self: socket.socket, address: Any) -> Any:
    if self.family != socket.AF_UNIX and address[0] not in _LOCAL:
        NETWORK_ATTEMPTS.append(f"connect {address!r}")
        raise OSError(f"network disabled by the benchmark: connect to {address!r}")
    return _connect(self, address)


def _guard_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
    h_ = host.decode() if isinstance(host, bytes) else host
    if h_ not in _LOCAL:
        NETWORK_ATTEMPTS.append(f"resolve {h_!r}")
        raise OSError(f"network disabled by the benchmark: resolve {h_!r}")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _guard_connect  # type: ignore[method-assign]
socket.getaddrinfo = _guard_getaddrinfo  # type: ignore[assignment]

import _harness as h  # noqa: E402
import numpy as np  # noqa: E402
import psycopg  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from mem0 import AsyncMemory  # noqa: E402
from mem0.configs.base import MemoryConfig  # noqa: E402

COLLECTION = "scale_memories"
IMPORT_TASKS = 8


class LookupEmbeddings(Embeddings):
    """The precomputed vector of a text: registered just before the call, or by row index."""

    def __init__(self, data: h.Data) -> None:
        self.data = data
        self.pending: dict[str, np.ndarray] = {}

    def _one(self, text: str) -> list[float]:
        v = self.pending.pop(text, None)
        if v is None:
            i = h.row_index(text)
            if i < 0:
                raise RuntimeError(f"no precomputed vector for {text!r}")
            v = self.data.vectors[i]
        return v.tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)


class Adapter:
    import_how = f"add(infer=False), one row a call, {IMPORT_TASKS} calls in flight"

    def __init__(self, url: str, data: h.Data) -> None:
        self.url = h.libpq_url(url)
        self.data = data
        self.embedder = LookupEmbeddings(data)
        self.counter = itertools.count()

    async def setup(self) -> None:
        config = MemoryConfig(
            vector_store={"provider": "pgvector", "config": {
                "connection_string": self.url, "collection_name": COLLECTION,
                "embedding_model_dims": self.data.dims, "minconn": 8, "maxconn": 10,
            }},
            embedder={"provider": "langchain", "config": {"model": self.embedder}},
            llm={"provider": "openai", "config": {"api_key": "offline-placeholder-never-called"}},
            history_db_path=os.path.join(TMP, "history.db"),
        )  # fmt: skip
        self.memory = AsyncMemory(config)
        # the table and mem0's indexes are created on first use; create them now, then our B-tree
        await asyncio.to_thread(self.memory.vector_store._ensure_collection)
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(f"CREATE INDEX ON {COLLECTION} ((payload->>'user_id'))")

    async def import_rows(self, data: h.Data, progress: bool) -> None:
        bar = h._bar(
            data.rows, f"import mem0 (add infer=False, {IMPORT_TASKS} in flight)", progress
        )
        rows = iter(range(data.rows))

        async def worker() -> None:
            for i in rows:
                await self.memory.add(
                    [{"role": "user", "content": data.text(i)}],
                    user_id=h.user_name(data.user[i]), infer=False,
                    metadata={"created_at": data.created_at(i).isoformat()},
                )  # fmt: skip
                if bar is not None:
                    bar.update()

        await asyncio.gather(*(worker() for _ in range(IMPORT_TASKS)))
        if bar is not None:
            bar.close()

    async def after_import(self) -> None:
        await h.vacuum_analyze(self.url)

    async def search(self, user: str, vector: np.ndarray, k: int) -> list[int]:
        q = f"q{next(self.counter)}"  # a token no stored text contains: BM25 adds nothing
        self.embedder.pending[q] = vector
        out = await self.memory.search(q, filters={"user_id": user}, top_k=k, threshold=0.0)
        return [h.row_index(r["memory"]) for r in out["results"]]

    async def add(self, user: str, vectors: np.ndarray, texts: list[str]) -> None:
        for t, v in zip(texts, vectors, strict=True):
            self.embedder.pending[t] = v
        await self.memory.add(
            [{"role": "user", "content": texts[0]}, {"role": "assistant", "content": texts[1]}],
            user_id=user, infer=False,
        )  # fmt: skip

    async def close(self) -> None:
        self.memory.close()
        await asyncio.to_thread(self.memory.vector_store.connection_pool.close)
        shutil.rmtree(TMP, ignore_errors=True)  # MEM0_DIR and the SQLite history
        if NETWORK_ATTEMPTS:
            raise RuntimeError(f"mem0 tried the network: {NETWORK_ATTEMPTS[:5]}")


def make(url: str, data: h.Data) -> Any:
    return Adapter(url, data)


if __name__ == "__main__":
    h.peer_main(make)
