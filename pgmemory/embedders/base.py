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
    def model_id(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch: returns a ``(len(texts), dimensions)`` float32 array."""
        ...


def as_matrix(vectors: object, *, rows: int, dimensions: int, model_id: str) -> np.ndarray:
    """Check an embedder's output and return it as a C-contiguous float32 matrix."""
    matrix = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
    if matrix.ndim != 2 or matrix.shape != (rows, dimensions):
        raise EmbeddingError(
            f"embedder {model_id!r} returned shape {matrix.shape}, expected ({rows}, {dimensions})"
        )
    if not np.isfinite(matrix).all():
        raise EmbeddingError(f"embedder {model_id!r} returned NaN or infinite values")
    return matrix
