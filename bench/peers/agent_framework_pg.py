"""Peer: agent-framework-postgres ``PostgresCollection`` (Microsoft Agent Framework, alpha).

Used as its README shows: a ``@vectorstoremodel`` dataclass (str key, ``user_id`` data field with
``is_indexed=True``, a ``vector`` field of ``dims`` dimensions with the defaults: index kind
``default`` = no vector index, so search is exact, cosine distance), ``PostgresStore`` with its
own pool (psycopg ``AsyncConnectionPool``, 1-10 connections, autocommit), ``get_collection``,
``ensure_collection_exists()``, ``upsert(..., generate_vectors=False)`` and
``search(vector=..., filter=Filter("user_id", "eq", u), top=3)``. Vectors are passed in, so no
embedding client exists. A batch upsert is one transaction (``executemany`` inside it), so a
turn's 2 records are one transaction.

Notes from its source (agent_framework_postgres/_vector_store.py, 1.0.0a261015):
* ``is_indexed=True`` gives a plain B-tree on ``user_id``, but the ``eq`` filter compiles to
  ``user_id COLLATE "C" IS NOT DISTINCT FROM $1``, which no B-tree can serve: every scoped
  search scans the whole table (the ``small`` figures show it).
* exact search orders by ``(embedding <=> q) + 0`` inside a forced-rollback savepoint.
Run by bench/store/scale.py in bench/.peers/agent-framework/.
"""

import warnings
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import _harness as h
import numpy as np
from agent_framework import Filter, VectorStoreField, vectorstoremodel
from agent_framework_postgres import PostgresStore

BATCH = 1_000
warnings.filterwarnings("ignore", message=".*experimental.*")  # vector stores are experimental


def model(dims: int) -> type:
    @vectorstoremodel(collection_name="scale_memories")
    @dataclass
    class Memory:
        id: Annotated[str, VectorStoreField("key")]
        user_id: Annotated[str, VectorStoreField("data", is_indexed=True)]
        text: Annotated[str, VectorStoreField("data")]
        role: Annotated[str, VectorStoreField("data")]
        created_at: Annotated[datetime, VectorStoreField("data")]
        embedding: Annotated[list[float] | None, VectorStoreField("vector", dimensions=dims)] = None

    return Memory


class Adapter:
    import_how = "upsert of 1,000 records a call (executemany in one transaction)"

    def __init__(self, url: str, data: h.Data) -> None:
        self.url = h.libpq_url(url)
        self.data = data
        self.Memory = model(data.dims)

    async def setup(self) -> None:
        self.store = PostgresStore(connection_string=self.url)
        self.collection = self.store.get_collection(self.Memory)
        await self.collection.ensure_collection_exists()

    async def import_rows(self, data: h.Data, progress: bool) -> None:
        async def put(rows: range) -> None:
            vecs = data.vectors[rows.start : rows.stop].tolist()
            await self.collection.upsert(
                [self.Memory(str(i), h.user_name(data.user[i]), data.text(i), "user",
                             data.created_at(i), vecs[i - rows.start]) for i in rows],
                generate_vectors=False,
            )  # fmt: skip

        await h.import_batches(
            data, BATCH, "import PostgresCollection (upsert 1,000 a call)", progress, put
        )

    async def after_import(self) -> None:
        await h.vacuum_analyze(self.url)

    async def search(self, user: str, vector: np.ndarray, k: int) -> list[int]:
        results = await self.collection.search(
            vector=vector.tolist(), filter=Filter("user_id", "eq", user), top=k
        )
        return [h.row_index(r["record"].text) async for r in results]

    async def add(self, user: str, vectors: np.ndarray, texts: list[str]) -> None:
        now = datetime.now(h.T0.tzinfo)
        await self.collection.upsert(
            [self.Memory(str(h.row_index(t)), user, t, role, now, v.tolist())
             for t, role, v in zip(texts, ("user", "assistant"), vectors, strict=True)],
            generate_vectors=False,
        )  # fmt: skip

    async def close(self) -> None:
        await self.store.close()


def make(url: str, data: h.Data) -> Any:
    return Adapter(url, data)


if __name__ == "__main__":
    h.peer_main(make)
