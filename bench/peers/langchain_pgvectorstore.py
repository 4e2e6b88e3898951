"""Peer: langchain-postgres ``PGVectorStore`` (v2: one table per store, typed metadata columns).

Used as its docs show: ``PGEngine.from_connection_string`` (SQLAlchemy async engine, psycopg,
pool 8 + 2), ``ainit_vectorstore_table(..., metadata_columns=[Column("user_id", "TEXT")])``,
``PGVectorStore.create(...)``, ``aadd_embeddings`` and ``asimilarity_search_with_score_by_vector``
with ``filter={"user_id": {"$eq": u}}``. No vector index by default (so search is exact); we add
a plain B-tree on user_id, which any deployment would, so the filter is not a table scan.
Run by bench/store/scale.py in bench/.peers/langchain/.
"""

from __future__ import annotations

from typing import Any

import _harness as h
import numpy as np
import sqlalchemy as sa
from langchain_core.embeddings import Embeddings
from langchain_postgres import Column, PGEngine, PGVectorStore

BATCH = 1_000
TABLE = "scale_memories"


class NoEmbeddings(Embeddings):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise RuntimeError("the benchmark passes precomputed vectors")

    def embed_query(self, text: str) -> list[float]:
        raise RuntimeError("the benchmark passes precomputed vectors")


class Adapter:
    import_how = "aadd_embeddings, 1,000 rows a call (one INSERT per row inside)"

    def __init__(self, url: str, data: h.Data) -> None:
        self.url = h.sqlalchemy_url(url, "psycopg")
        self.data = data

    async def setup(self) -> None:
        self.engine = PGEngine.from_connection_string(self.url, pool_size=8, max_overflow=2)
        await self.engine.ainit_vectorstore_table(
            TABLE, self.data.dims,
            metadata_columns=[Column("user_id", "TEXT"), Column("created_at", "TEXT")],
        )  # fmt: skip
        eng = sa.create_engine(h.sqlalchemy_url(self.url, "psycopg"))
        with eng.begin() as conn:
            conn.execute(sa.text(f"CREATE INDEX ON {TABLE} (user_id)"))
        eng.dispose()
        self.store = await PGVectorStore.create(
            self.engine, embedding_service=NoEmbeddings(), table_name=TABLE,
            metadata_columns=["user_id", "created_at"],
        )  # fmt: skip

    async def import_rows(self, data: h.Data, progress: bool) -> None:
        async def put(rows: range) -> None:
            await self.store.aadd_embeddings(
                texts=[data.text(i) for i in rows],
                embeddings=data.vectors[rows.start : rows.stop].tolist(),
                metadatas=[{"user_id": h.user_name(data.user[i]),
                            "created_at": data.created_at(i).isoformat()} for i in rows],
            )  # fmt: skip

        await h.import_batches(data, BATCH, "import PGVectorStore", progress, put)

    async def after_import(self) -> None:
        await h.vacuum_analyze(self.url)

    async def search(self, user: str, vector: np.ndarray, k: int) -> list[int]:
        hits = await self.store.asimilarity_search_with_score_by_vector(
            vector.tolist(), k=k, filter={"user_id": {"$eq": user}}
        )
        return [h.row_index(doc.page_content) for doc, _ in hits]

    async def add(self, user: str, vectors: np.ndarray, texts: list[str]) -> None:
        await self.store.aadd_embeddings(
            texts=texts, embeddings=vectors.tolist(),
            metadatas=[{"user_id": user}, {"user_id": user}],
        )  # fmt: skip

    async def close(self) -> None:
        await self.engine.close()


def make(url: str, data: h.Data) -> Any:
    return Adapter(url, data)


if __name__ == "__main__":
    h.peer_main(make)
