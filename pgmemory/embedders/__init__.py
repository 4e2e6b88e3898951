"""Embedders: the protocol, the local models, OpenAI-compatible embeddings, a cache, batching.

Names are imported on first use (PEP 562), so ``from pgmemory.embedders import USEEmbedder``
does not load the ``openai`` package, and no embedder loads its model before it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgmemory._exports import lazy_exports

if TYPE_CHECKING:
    from pgmemory.embedders.base import (
        Embedder as Embedder,
        warm_up as warm_up,
    )
    from pgmemory.embedders.batching import (
        BatchingEmbedder as BatchingEmbedder,
    )
    from pgmemory.embedders.cache import (
        CachedEmbedder as CachedEmbedder,
    )
    from pgmemory.embedders.factory import (
        make_embedder as make_embedder,
    )
    from pgmemory.embedders.minilm import (
        MiniLMEmbedder as MiniLMEmbedder,
    )
    from pgmemory.embedders.openai import (
        OpenAIEmbedder as OpenAIEmbedder,
    )
    from pgmemory.embedders.use import (
        USEEmbedder as USEEmbedder,
    )

__all__, __getattr__, __dir__ = lazy_exports(__name__)
