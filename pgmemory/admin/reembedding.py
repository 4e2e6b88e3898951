"""Re-embedding: move a collection to another embedding model while it serves searches.

A collection's vectors all come from one model (the catalogue records it), so changing the
model means every memory needs a new vector. :func:`reembed` does it in two phases:

1. **Staging**, in batches, while the application runs: each memory's text is embedded by the
   new model and the vector kept in ``embedding_next``, beside the ``embedding`` every search
   still uses. Nothing a search or a write sees changes. A run that stops (an error, Ctrl-C,
   a lost connection) leaves what it staged; the next run for the same model resumes where
   the vectors are missing. A run for another model is refused unless ``restart``.
2. **The switch**, in ONE transaction: the collection's catalogue row is locked (new memories
   of the collection wait), the memories written meanwhile are staged, every staged vector
   replaces the old one and the catalogue names the new model and size. It commits whole or
   not at all. It reads the collection once more (to find memories written meanwhile) and
   rewrites every row: on a large collection that takes a while, and the collection's new
   memories wait for it.

After the switch, processes still running the old embedder are refused with a
:class:`~pgmemory.errors.CollectionError` once their catalogue entry is read again (within
:data:`pgmemory.store.catalogue.RECHECK_S`): restart them with the new embedder. A memory that
such a process wrote in that window keeps the old model's name in its row, and the next
``reembed`` for the new model re-embeds it. Vectors a caller gave (``MemoryRecord.embedding``)
are replaced by the new model's vector of the memory's text.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from pgmemory.admin import statements as s
from pgmemory.errors import CollectionError, InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store._engine.binary import array
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.validation import check_dimensions, check_name, check_vector

if TYPE_CHECKING:
    from pgmemory.embedders.base import Embedder

logger = logging.getLogger(__name__)

#: Memories embedded per batch unless the caller says otherwise.
DEFAULT_BATCH = 64
#: The keyset before every memory.
_START = (uuid.UUID(int=0), "")

#: ``progress(staged, total)``: called after each batch.
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Reembedding:
    """What :func:`reembed` did.

    Attributes:
        collection: The collection.
        model: The model its vectors now come from (or are being staged for).
        dimensions: That model's vector size.
        embedded: Memories embedded by this run (staging and switch together).
        total: Memories in the collection when the run ended.
        switched: Whether the collection now uses the new vectors (False with
            ``switch=False``: staged only).
    """

    collection: str
    model: str
    dimensions: int
    embedded: int
    total: int
    switched: bool


async def reembed(
    db: Database,
    collection: str,
    embedder: Embedder,
    *,
    batch_size: int = DEFAULT_BATCH,
    switch: bool = True,
    restart: bool = False,
    progress: Progress | None = None,
) -> Reembedding:
    """Re-embed every memory of ``collection`` with ``embedder`` (see the module).

    Args:
        db: The database.
        collection: The collection.
        embedder: The new model's embedder.
        batch_size: Memories embedded per batch (1 to 10,000).
        switch: Switch over once every memory is staged; False stages only (run again with
            ``switch`` later: only what is missing is embedded then).
        restart: Drop vectors staged for another model first, instead of refusing.
        progress: Called with ``(staged, total)`` after each batch.

    Returns:
        What was done.

    Raises:
        CollectionError: No such collection; another model is being staged (use
            ``restart``); or the collection has an approximate index and the new
            model's size differs. A collection that already uses the model, with nothing
            left to re-embed, is no error: nothing is done.
        InvalidInputError: A bad batch size, or the embedder's model id or size.
        EmbeddingError: The embedder failed (what was staged stays; run again to resume).
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInputError(f"batch_size is {batch_size!r}; expected an integer from 1")
    batch_size = min(batch_size, 10_000)
    model = check_name(embedder.model_id, what="the embedder's model_id")
    dimensions = check_dimensions(embedder.dimensions)
    params = {"collection": collection, "model": model, "dimensions": dimensions}
    async with db.write(users=()) as conn:
        state = (await conn.execute(clause(s.REEMBED_STATE), params)).mappings().first()
        if state is None:
            raise CollectionError(f"unknown collection {collection!r}")
        pending = state["next_embedding_model"]
        if pending is not None and (pending, state["next_dimensions"]) != (model, dimensions):
            if not restart:
                raise CollectionError(
                    f"collection {collection!r} is being re-embedded with model {pending!r}; "
                    f"finish that run, or pass restart (--restart) to drop its staged vectors "
                    f"and re-embed with {model!r}"
                )
            await conn.execute(clause(q.SEQUENTIAL_SHARD_WRITES))
            await conn.execute(clause(s.REEMBED_CLEAR), params)
            await conn.execute(clause(s.REEMBED_FORGET), params)
        if dimensions != state["dimensions"]:
            index = (await conn.execute(clause(q.ANN_INDEX_STATE), params)).first()
            if index is not None:
                raise CollectionError(
                    f"collection {collection!r} has an approximate ({index.amname}) index over "
                    f"{state['dimensions']}-dimension vectors, and model {model!r} makes "
                    f"{dimensions}: disable it first (store.disable_ann({collection!r}, "
                    "drop_index=True)), re-embed, then enable it again"
                )
        begun = (await conn.execute(clause(s.REEMBED_BEGIN), params)).all()
        if not begun:  # another run named its model between the read and here
            raise _pending_elsewhere(collection, model)
    embedded = await _stage(db, embedder, params, batch_size=batch_size, progress=progress)
    if switch:
        embedded += await _switch(db, embedder, params, batch_size=batch_size)
    async with db.read(None) as conn:
        counts = (await conn.execute(clause(s.REEMBED_COUNTS), params)).mappings().one()
    logger.info(
        "re-embedded %d memories of a collection with model %s%s",
        embedded,
        model,
        "" if switch else " (staged, not switched)",
    )
    return Reembedding(
        collection=collection,
        model=model,
        dimensions=dimensions,
        embedded=embedded,
        total=int(counts["total"]),
        switched=switch,
    )


async def _stage(
    db: Database,
    embedder: Embedder,
    params: dict[str, Any],
    *,
    batch_size: int,
    progress: Progress | None,
) -> int:
    """Embed and stage batches until none is left; returns how many were embedded."""
    async with db.read(None) as conn:
        counts = (await conn.execute(clause(s.REEMBED_COUNTS), params)).mappings().one()
    total, staged = int(counts["total"]), int(counts["total"]) - int(counts["todo"])
    after = _START
    embedded = 0
    while True:
        async with db.read(None) as conn:
            rows = await _todo(conn, params, after, batch_size)
        if not rows:
            return embedded
        vectors = await _embed(embedder, rows, params["dimensions"])
        users = {row["user_id"] for row in rows}
        async with db.write(users=users) as conn:
            await _write_staged(conn, params, rows, vectors)
        embedded += len(rows)
        staged += len(rows)
        after = (rows[-1]["id"], rows[-1]["user_id"])
        if progress is not None:
            progress(staged, max(total, staged))


async def _switch(
    db: Database, embedder: Embedder, params: dict[str, Any], *, batch_size: int
) -> int:
    """The switch, in one transaction; returns how many late memories it embedded first."""
    embedded = 0
    # It writes every user's memories: every read of a replica waits for it.
    async with db.write(users=None) as conn:
        await conn.execute(clause(q.SEQUENTIAL_SHARD_WRITES))
        await conn.execute(clause(q.NO_STATEMENT_TIMEOUT))
        await conn.execute(clause(s.REEMBED_LOCK), params)
        state = (await conn.execute(clause(s.REEMBED_STATE), params)).mappings().one()
        if (state["next_embedding_model"], state["next_dimensions"]) != (
            params["model"],
            params["dimensions"],
        ):  # a run with --restart took over meanwhile: its vectors are not ours to swap in
            raise _pending_elsewhere(params["collection"], params["model"])
        after = _START
        while rows := await _todo(conn, params, after, batch_size):
            vectors = await _embed(embedder, rows, params["dimensions"])
            await _write_staged(conn, params, rows, vectors)
            embedded += len(rows)
            after = (rows[-1]["id"], rows[-1]["user_id"])
        await conn.execute(clause(s.REEMBED_SWAP), params)
        await conn.execute(clause(s.REEMBED_SWITCH), params)
    return embedded


def _pending_elsewhere(collection: str, model: str) -> CollectionError:
    return CollectionError(
        f"another run is re-embedding collection {collection!r} with another model than "
        f"{model!r}; nothing of this run was switched in (run again, with restart if it "
        "should replace the other one)"
    )


async def _todo(
    conn: AsyncConnection, params: dict[str, Any], after: tuple[uuid.UUID, str], batch: int
) -> list[Any]:
    result = await conn.execute(
        clause(s.REEMBED_TODO),
        {**params, "after_id": after[0], "after_user": after[1], "batch": batch},
    )
    return list(result.mappings().all())


async def _embed(embedder: Embedder, rows: Sequence[Any], dimensions: int) -> list[Any]:
    vectors = await embedder.embed([row["content"] for row in rows])
    return [
        check_vector(vector, dimensions=dimensions, what="the new model's vector")
        for vector in vectors
    ]


async def _write_staged(
    conn: AsyncConnection, params: dict[str, Any], rows: Sequence[Any], vectors: Sequence[Any]
) -> None:
    """Stage the vectors, one statement per user (each routed to that user's shard)."""
    pairs = sorted(zip(rows, vectors, strict=True), key=lambda pair: pair[0]["user_id"])
    for user, group in groupby(pairs, key=lambda pair: pair[0]["user_id"]):
        members = list(group)
        await conn.execute(
            clause(s.REEMBED_STAGE),
            {
                **params,
                "user_id": user,
                "ids": [row["id"] for row, _ in members],
                "embeddings": array("vector", (vector for _, vector in members)),
            },
        )


__all__ = ["DEFAULT_BATCH", "Reembedding", "reembed"]
