"""Build the embedder the settings name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgmemory.errors import InvalidInputError

if TYPE_CHECKING:
    from pgmemory.embedders.base import Embedder
    from pgmemory.settings import Settings


def make_embedder(settings: Settings | None = None, *, cache: bool = True) -> Embedder:
    """Build the embedder ``settings.embedder`` names (``use`` by default).

    Only the chosen embedder's module is imported, so a deployment that uses OpenAI embeddings
    needs neither local model installed. A local model is wrapped in a
    :class:`~pgmemory.embedders.batching.BatchingEmbedder` (unless ``embed_batching`` is
    off), so concurrent calls share model calls on one worker thread; the cache goes in
    front of it.

    Args:
        settings: where to read the choice and its options; ``None`` reads the environment
            (``PGMEMORY_EMBEDDER`` and friends) with :class:`~pgmemory.settings.Settings`.
        cache: wrap the embedder in a :class:`~pgmemory.embedders.cache.CachedEmbedder`, so a
            text already embedded in this process is not embedded again.

    Returns:
        The embedder: ``CachedEmbedder(BatchingEmbedder(local model))`` by default, without
        the cache when ``cache`` is false, without batching when ``embed_batching`` is off.

    Raises:
        InvalidInputError: ``PGMEMORY_EMBEDDER=openai`` without
            ``PGMEMORY_OPENAI_EMBEDDING_DIMENSIONS``.
        MissingExtraError: the chosen local embedder's extra (``use``, ``minilm``) is not
            installed.
    """
    from pgmemory.embedders.cache import CachedEmbedder

    if settings is None:
        from pgmemory.settings import Settings

        settings = Settings()
    embedder: Embedder
    if settings.embedder == "openai":
        return _openai(settings, cache=cache)
    if settings.embedder == "use":
        from pgmemory.embedders.use import USEEmbedder

        embedder = USEEmbedder(threads=settings.embedder_threads)
    else:
        from pgmemory.embedders.minilm import MiniLMEmbedder

        embedder = MiniLMEmbedder(threads=settings.embedder_threads)
    if settings.embed_batching:
        from pgmemory.embedders.batching import BatchingEmbedder

        embedder = BatchingEmbedder(
            embedder, max_batch=settings.embed_batch_max, wait_ms=settings.embed_batch_wait_ms
        )
    return CachedEmbedder(embedder) if cache else embedder


def _openai(settings: Settings, *, cache: bool) -> Embedder:
    """The OpenAI-compatible embedder the settings describe (never batched: it batches itself)."""
    from pgmemory.embedders.cache import CachedEmbedder

    if settings.openai_embedding_dimensions is None:
        raise InvalidInputError(
            "PGMEMORY_EMBEDDER=openai needs PGMEMORY_OPENAI_EMBEDDING_DIMENSIONS "
            "(e.g. 1536 for text-embedding-3-small)"
        )
    from pgmemory.embedders.openai import OpenAIEmbedder

    secret = settings.openai_embedding_api_key or settings.openai_api_key
    embedder = OpenAIEmbedder(
        model=settings.openai_embedding_model,
        dimensions=settings.openai_embedding_dimensions,
        base_url=settings.openai_embedding_base_url or settings.openai_base_url,
        api_key=secret.get_secret_value() if secret else None,
        model_id=settings.openai_embedding_model_id,
        max_retries=settings.openai_max_retries,
        timeout_s=settings.openai_timeout_s,
    )
    return CachedEmbedder(embedder) if cache else embedder
