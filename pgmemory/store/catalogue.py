"""Collections: the catalogue fixing each collection's vector size and embedding model.

A collection's vectors all come from one model, so the catalogue is also where a text becomes a
vector: :meth:`Catalogue.embed` refuses an embedder of another model.

A collection's model changes only when ``pgmemory db reembed`` switches it over
(:mod:`pgmemory.admin.reembedding`); an entry read here is read again after
:data:`RECHECK_S`, so a process still running the old embedder is refused within that time
instead of searching new vectors with old queries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

import pgmemory.telemetry as telemetry
from pgmemory.errors import CollectionError, EmbedderMismatchError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.records import CollectionInfo
from pgmemory.store.validation import check_dimensions, check_name

if TYPE_CHECKING:
    from pgmemory.embedders.base import Embedder

#: Seconds a catalogue entry is used before it is read again (a re-embedding may have switched
#: the collection to another model).
RECHECK_S = 10.0


class Catalogue:
    """The collections of one database, each entry cached for :data:`RECHECK_S` once read.

    Args:
        db: The database.
        embedder: Returns the store's embedder (built on first use): the default size and
            model of new collections, and what embeds texts given without a vector.
    """

    def __init__(self, db: Database, embedder: Callable[[], Embedder]) -> None:
        self._db = db
        self._embedder = embedder
        #: name -> (entry, monotonic time it was read)
        self._cache: dict[str, tuple[CollectionInfo, float]] = {}

    async def create(
        self, name: str, *, dimensions: int | None, embedding_model: str | None
    ) -> CollectionInfo:
        """Create a collection, or return it if it exists with the same size and model.

        Raises:
            CollectionError: It exists with another size or model, or the size is out of range.
            InvalidInputError: The name or model is not a usable name.
        """
        with telemetry.operation(
            telemetry.CREATE_MEMORY_STORE, settings=self._db.settings, collection=name
        ):
            check_name(name, what="collection name")
            if dimensions is None or embedding_model is None:
                embedder = self._embedder()
                dimensions = dimensions if dimensions is not None else embedder.dimensions
                embedding_model = embedding_model or embedder.model_id
            check_dimensions(dimensions)
            check_name(embedding_model, what="embedding_model")
            async with self._db.write() as conn:
                await conn.execute(
                    clause(q.INSERT_COLLECTION),
                    {"name": name, "dimensions": dimensions, "embedding_model": embedding_model},
                )
            info = await self.get(name)
            if info.dimensions != dimensions or info.embedding_model != embedding_model:
                raise CollectionError(
                    f"collection {name!r} exists with {info.dimensions} dimensions from model "
                    f"{info.embedding_model!r}; asked for {dimensions} from {embedding_model!r}. "
                    "Use another collection name for another model."
                )
            return info

    async def get(self, name: str) -> CollectionInfo:
        """A collection's catalogue entry.

        Raises:
            CollectionError: No such collection.
        """
        cached = self._cache.get(name)
        now = time.monotonic()
        if cached is not None and now - cached[1] < RECHECK_S:
            return cached[0]
        async with self._db.read(None) as conn:
            row = (await conn.execute(clause(q.GET_COLLECTION), {"name": name})).mappings().first()
        if row is None:
            raise CollectionError(
                f"unknown collection {name!r}: create it first with "
                f"`await store.create_collection({name!r})`"
            )
        info = CollectionInfo(**row)
        self._cache[name] = (info, now)
        return info

    def forget(self, name: str) -> None:
        """Read ``name``'s entry again on its next use (after this process changed it)."""
        self._cache.pop(name, None)

    async def entries(self) -> list[CollectionInfo]:
        """Every collection in the catalogue, by name."""
        async with self._db.read(None) as conn:
            rows = (await conn.execute(clause(q.LIST_COLLECTIONS))).mappings().all()
        return [CollectionInfo(**row) for row in rows]

    async def drop(self, name: str, *, actor: str | None) -> int:
        """Delete a collection and all its memories (each deletion audited); returns the count."""
        with telemetry.operation(
            telemetry.DELETE_MEMORY_STORE, settings=self._db.settings, collection=name
        ) as op:
            await self.get(name)
            async with self._db.write() as conn:
                await conn.execute(clause(q.SEQUENTIAL_SHARD_WRITES))
                deleted = await conn.execute(
                    clause(q.delete_scope(())), {"collection": name, "actor": actor or ""}
                )
                count = len(deleted.all())
                await conn.execute(clause(q.DELETE_COLLECTION), {"name": name})
            self.forget(name)
            op.count("record.count", count)
            return count

    async def embed(self, info: CollectionInfo, texts: list[str]) -> np.ndarray:
        """Embed texts for a collection with the store's embedder.

        Raises:
            CollectionError: The embedder's model is not the collection's.
        """
        embedder = self._embedder()
        if embedder.model_id != info.embedding_model:
            raise EmbedderMismatchError(
                f"collection {info.name!r} holds vectors of model {info.embedding_model!r}, but "
                f"the store's embedder is {embedder.model_id!r}: pass a matching embedder to "
                "MemoryStore(embedder=...), or pass vectors yourself",
                collection=info.name,
                collection_model=info.embedding_model,
                embedder_model=embedder.model_id,
            )
        with telemetry.embedding(embedder.model_id, len(texts)):
            return await embedder.embed(texts)
