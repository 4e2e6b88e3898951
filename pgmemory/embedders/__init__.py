"""Embedders: the protocol, the local models, OpenAI-compatible embeddings, and a cache."""

from __future__ import annotations

from pgmemory.embedders.base import Embedder
from pgmemory.embedders.cache import CachedEmbedder
from pgmemory.embedders.openai import OpenAIEmbedder
from pgmemory.embedders.use import USEEmbedder
from pgmemory.settings import Settings


def make_embedder(settings: Settings | None = None, *, cache: bool = True) -> Embedder:
    """The embedder ``settings.embedder`` names (``use`` by default), wrapped in a cache."""
    settings = settings or Settings()
    embedder: Embedder
    if settings.embedder == "use":
        embedder = USEEmbedder(threads=settings.embedder_threads)
    elif settings.embedder == "minilm":
        from pgmemory.embedders.minilm import MiniLMEmbedder

        embedder = MiniLMEmbedder(threads=settings.embedder_threads)
    else:
        if settings.openai_embedding_dimensions is None:
            raise ValueError(
                "PGMEMORY_EMBEDDER=openai needs PGMEMORY_OPENAI_EMBEDDING_DIMENSIONS "
                "(e.g. 1536 for text-embedding-3-small)"
            )
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        embedder = OpenAIEmbedder(
            model=settings.openai_embedding_model,
            dimensions=settings.openai_embedding_dimensions,
            base_url=settings.openai_base_url,
            api_key=key,
            max_retries=settings.openai_max_retries,
            timeout_s=settings.openai_timeout_s,
        )
    return CachedEmbedder(embedder) if cache else embedder


__all__ = ["CachedEmbedder", "Embedder", "OpenAIEmbedder", "USEEmbedder", "make_embedder"]
