"""Peer: langchain-postgres ``PGVector`` (the original langchain_pg_embedding schema), async mode.

Used as its docs show: one collection, the user as a metadata filter (``{"user_id": u}``),
vectors passed in (``aadd_embeddings``), ``asimilarity_search_with_score_by_vector``. PGVector
creates no vector index of its own (only a GIN index on cmetadata), so search is exact:
filter on JSONB, then sort the collection's matching rows by cosine distance.
Run by bench/store/scale.py in bench/.peers/langchain/ (see PEERS there).
"""

from __future__ import annotations

from typing import Any

import _harness as h
import numpy as np
from langchain_core.embeddings import Embeddings
from langchain_postgres import PGVector

BATCH = 1_000


class NoEmbeddings(Embeddings):
    """Vectors are always passed in; embedding a text here would be a bug."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise RuntimeError("the benchmark passes precomputed vectors")

    def embed_query(self, text: str) -> list[float]:
        raise RuntimeError("the benchmark passes precomputed vectors")


class Adapter:
    import_how = "aadd_embeddings, 1,000 rows a call"

    def __init__(self, url: str, data: h.Data) -> None:
        self.url = h.sqlalchemy_url(url, "psycopg")
        self.data = data

    async def setup(self) -> None:
        self.store = PGVector(
            NoEmbeddings(), connection=self.url, embedding_length=self.data.dims,
            collection_name="scale", async_mode=True,
            engine_args={"pool_size": 8, "max_overflow": 2},
        )  # fmt: skip

    async def import_rows(self, data: h.Data, progress: bool) -> None:
        async def put(rows: range) -> None:
            await self.store.aadd_embeddings(
                texts=[data.text(i) for i in rows],
                embeddings=data.vectors[rows.start : rows.stop].tolist(),
                metadatas=[{"user_id": h.user_name(data.user[i]),
                            "created_at": data.created_at(i).isoformat()} for i in rows],
            )  # fmt: skip

        await h.import_batches(
            data, BATCH, "import PGVector (aadd_embeddings, 1,000 a call)", progress, put
        )

    async def after_import(self) -> None:
        await h.vacuum_analyze(self.url)

    async def search(self, user: str, vector: np.ndarray, k: int) -> list[int]:
        hits = await self.store.asimilarity_search_with_score_by_vector(
            vector.tolist(), k=k, filter={"user_id": user}
        )
        return [h.row_index(doc.page_content) for doc, _ in hits]

    async def add(self, user: str, vectors: np.ndarray, texts: list[str]) -> None:
        await self.store.aadd_embeddings(
            texts=texts, embeddings=vectors.tolist(),
            metadatas=[{"user_id": user, "role": "user"}, {"user_id": user, "role": "assistant"}],
        )  # fmt: skip

    async def close(self) -> None:
        await self.store._async_engine.dispose()


def make(url: str, data: h.Data) -> Any:
    return Adapter(url, data)


if __name__ == "__main__":
    h.peer_main(make)
