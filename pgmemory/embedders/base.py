"""The embedder protocol and the checks every embedder's output goes through."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from pgmemory.errors import EmbeddingError


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into float32 vectors.

    ``model_id`` names the model that made a vector; it is stored beside every vector, and a
    collection refuses vectors from any other model. ``dimensions`` is the vector length.
    """

    @property
    def model_id(self) -> str:
        """The name of the model, stored beside every vector it makes."""
        ...

    @property
    def dimensions(self) -> int:
        """The length of every vector."""
        ...

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), dimensions)`` float32 array, row ``i`` the vector of ``texts[i]``.
        """
        ...


class WrappingEmbedder:
    """An embedder in front of another one (a cache, a batcher): the vectors are the inner
    embedder's, so its ``model_id`` and ``dimensions`` are too. A wrapper subclasses this and
    defines ``embed``.

    Args:
        inner: the embedder that does the work.
    """

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    @property
    def model_id(self) -> str:
        """The inner embedder's model id."""
        return self.inner.model_id

    @property
    def dimensions(self) -> int:
        """The inner embedder's vector length."""
        return self.inner.dimensions


def as_matrix(vectors: object, *, rows: int, dimensions: int, model_id: str) -> np.ndarray:
    """Check an embedder's output and return it as a C-contiguous float32 matrix.

    Args:
        vectors: what the model returned (anything numpy turns into a 2-D array).
        rows: the number of texts embedded.
        dimensions: the embedder's vector length.
        model_id: the embedder's model, for the error message.

    Returns:
        The vectors as a ``(rows, dimensions)`` C-contiguous float32 array.

    Raises:
        EmbeddingError: the shape is wrong, a value is not a number, or one is NaN or infinite.
    """
    try:
        matrix = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
    except (TypeError, ValueError):  # ragged rows, strings, objects
        raise EmbeddingError(
            f"embedder {model_id!r} returned something other than {rows} vectors of "
            f"{dimensions} numbers"
        ) from None
    if matrix.ndim != 2 or matrix.shape != (rows, dimensions):
        raise EmbeddingError(
            f"embedder {model_id!r} returned shape {matrix.shape}, expected ({rows}, {dimensions})"
        )
    if not np.isfinite(matrix).all():
        raise EmbeddingError(f"embedder {model_id!r} returned NaN or infinite values")
    return matrix


async def warm_up(embedder: Embedder) -> None:
    """Load ``embedder``'s model now, so the first real call does not pay for it.

    Calls the embedder's own ``warm_up()`` when it has one (every pgmemory embedder does:
    local models load and run one tiny batch, remote ones do nothing); any other embedder
    embeds one short text. Call it once at start-up, e.g. in a web application's lifespan::

        await warm_up(store.embedder)

    Args:
        embedder: the embedder to warm up.

    Raises:
        EmbeddingError: the model could not be loaded or run.
    """
    method = getattr(embedder, "warm_up", None)
    if callable(method):
        await method()
    else:
        await embedder.embed(["warm-up"])
