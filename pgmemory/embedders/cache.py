"""An in-process embedding cache keyed by (model id, sha256 of the text)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from pgmemory.embedders.base import Embedder


class CachedEmbedder:
    """Wraps an embedder so that a text already embedded is not embedded again.

    Duplicates inside one batch are embedded once too. ``hits`` and ``misses`` count texts,
    for tests and tuning.

    Args:
        inner: the embedder that does the work.
        max_entries: vectors kept; least-recently-used entries beyond it are dropped.
    """

    def __init__(self, inner: Embedder, *, max_entries: int = 50_000) -> None:
        self.inner = inner
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def model_id(self) -> str:
        """The inner embedder's model id."""
        return self.inner.model_id

    @property
    def dimensions(self) -> int:
        """The inner embedder's vector length."""
        return self.inner.dimensions

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch, asking the inner embedder only for texts not seen before.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), dimensions)`` float32 array, in the order of ``texts``.
        """
        keys = [(self.model_id, hashlib.sha256(t.encode("utf-8")).digest()) for t in texts]
        missing: dict[tuple[str, bytes], str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key in self._cache:
                self._cache.move_to_end(key)
            elif key not in missing:
                missing[key] = text
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        if missing:
            vectors = await self.inner.embed(list(missing.values()))
            for key, vector in zip(missing, vectors, strict=True):
                self._cache[key] = vector
        out = np.empty((len(keys), self.dimensions), dtype=np.float32)
        for i, key in enumerate(keys):
            out[i] = self._cache[key]
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return out
