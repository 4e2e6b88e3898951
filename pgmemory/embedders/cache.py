"""An in-process embedding cache keyed by (model id, sha256 of the text)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from pgmemory.embedders.base import Embedder, WrappingEmbedder


class CachedEmbedder(WrappingEmbedder):
    """Wraps an embedder so that a text already embedded is not embedded again.

    Duplicates inside one batch are embedded once too. ``hits`` and ``misses`` count texts,
    for tests and tuning.

    Args:
        inner: the embedder that does the work.
        max_entries: vectors kept; least-recently-used entries beyond it are dropped.
    """

    def __init__(self, inner: Embedder, *, max_entries: int = 50_000) -> None:
        super().__init__(inner)
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch, asking the inner embedder only for texts not seen before.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), dimensions)`` float32 array, in the order of ``texts``.
        """
        model_id = self.model_id
        keys = [(model_id, hashlib.sha256(t.encode("utf-8")).digest()) for t in texts]
        out = np.empty((len(keys), self.dimensions), dtype=np.float32)
        # Hits are copied out now: a concurrent call may evict them while this one awaits.
        missing: dict[tuple[str, bytes], list[int]] = {}
        texts_missing: list[str] = []
        for i, (key, text) in enumerate(zip(keys, texts, strict=True)):
            vector = self._cache.get(key)
            if vector is not None:
                self._cache.move_to_end(key)
                out[i] = vector
            elif key in missing:
                missing[key].append(i)
            else:
                missing[key] = [i]
                texts_missing.append(text)
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        if missing:
            vectors = await self.inner.embed(texts_missing)
            for (key, rows), vector in zip(missing.items(), vectors, strict=True):
                out[rows] = vector
                self._cache[key] = out[rows[0]].copy()  # its own row, not a view of a batch
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return out

    async def warm_up(self) -> None:
        """Warm the inner embedder up (see :func:`pgmemory.embedders.base.warm_up`)."""
        from pgmemory.embedders.base import warm_up

        await warm_up(self.inner)
