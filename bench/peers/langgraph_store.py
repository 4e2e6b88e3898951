"""Peer: LangGraph ``AsyncPostgresStore`` (langgraph-checkpoint-postgres) with a vector index.

Used as its docs show: namespace ``("memories", user_id)``, ``index={"dims", "embed",
"fields": ["text"]}`` (defaults: cosine, HNSW index on store_vectors), ``aput``/``abatch`` and
``asearch(namespace, query=..., limit=3)``. The store embeds texts itself, so ``embed`` is a
lookup of the precomputed vectors (by row index parsed from the text, or registered just
before the call): no model runs. A pool of 8-10 connections (autocommit, as the store sets).
Note: the store runs in autocommit mode; a turn's 2 puts go in one ``abatch`` (one pipeline),
not in one transaction. Run by bench/store/scale.py in bench/.peers/langgraph/.
"""

from __future__ import annotations

import itertools
from typing import Any

import _harness as h
import numpy as np
from langgraph.store.base import PutOp
from langgraph.store.postgres.aio import AsyncPostgresStore

BATCH = 1_000


class Adapter:
    import_how = "abatch of 1,000 PutOps a call, autocommit"

    def __init__(self, url: str, data: h.Data) -> None:
        self.url = h.libpq_url(url)
        self.data = data
        self.pending: dict[str, np.ndarray] = {}
        self.counter = itertools.count()

    async def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for t in texts:
            v = self.pending.pop(t, None)
            if v is None:
                v = self.data.vectors[h.row_index(t)]
            out.append(v.tolist())
        return out

    async def setup(self) -> None:
        self._cm = AsyncPostgresStore.from_conn_string(
            self.url,
            pool_config={"min_size": 8, "max_size": 10},
            index={"dims": self.data.dims, "embed": self.embed, "fields": ["text"]},
        )
        self.store = await self._cm.__aenter__()
        await self.store.setup()

    async def import_rows(self, data: h.Data, progress: bool) -> None:
        async def put(rows: range) -> None:
            await self.store.abatch([
                PutOp(("memories", h.user_name(data.user[i])), str(i),
                      {"text": data.text(i), "created_at": data.created_at(i).isoformat()})
                for i in rows
            ])  # fmt: skip

        await h.import_batches(
            data, BATCH, "import LangGraph store (abatch of 1,000 PutOps)", progress, put
        )

    async def after_import(self) -> None:
        await h.vacuum_analyze(self.url)

    async def search(self, user: str, vector: np.ndarray, k: int) -> list[int]:
        q = f"query {next(self.counter)}"
        self.pending[q] = vector
        items = await self.store.asearch(("memories", user), query=q, limit=k)
        return [int(item.key) for item in items]

    async def add(self, user: str, vectors: np.ndarray, texts: list[str]) -> None:
        ops = []
        for text, role, vec in zip(texts, ("user", "assistant"), vectors, strict=True):
            self.pending[text] = vec
            ops.append(PutOp(("memories", user), str(h.row_index(text)),
                             {"text": text, "role": role}))  # fmt: skip
        await self.store.abatch(ops)

    async def close(self) -> None:
        await self._cm.__aexit__(None, None, None)


def make(url: str, data: h.Data) -> Any:
    return Adapter(url, data)


if __name__ == "__main__":
    h.peer_main(make)
