"""Embedders: the protocol, the local models, OpenAI-compatible embeddings, a cache, batching.

Names are imported on first use (PEP 562), so ``from pgmemory.embedders import USEEmbedder``
does not load the ``openai`` package, and no embedder loads its model before it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgmemory.embedders.base import Embedder, warm_up
    from pgmemory.embedders.batching import BatchingEmbedder
    from pgmemory.embedders.cache import CachedEmbedder
    from pgmemory.embedders.factory import make_embedder
    from pgmemory.embedders.minilm import MiniLMEmbedder
    from pgmemory.embedders.openai import OpenAIEmbedder
    from pgmemory.embedders.use import USEEmbedder

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "BatchingEmbedder": "pgmemory.embedders.batching",
    "CachedEmbedder": "pgmemory.embedders.cache",
    "Embedder": "pgmemory.embedders.base",
    "MiniLMEmbedder": "pgmemory.embedders.minilm",
    "OpenAIEmbedder": "pgmemory.embedders.openai",
    "USEEmbedder": "pgmemory.embedders.use",
    "make_embedder": "pgmemory.embedders.factory",
    "warm_up": "pgmemory.embedders.base",
}

__all__ = [
    "BatchingEmbedder",
    "CachedEmbedder",
    "Embedder",
    "MiniLMEmbedder",
    "OpenAIEmbedder",
    "USEEmbedder",
    "make_embedder",
    "warm_up",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562).

    Args:
        name: the attribute asked for.

    Returns:
        The object ``name`` refers to (also cached in this module's namespace).

    Raises:
        AttributeError: ``name`` is not a public name of this package.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's namespace plus every public name, imported or not."""
    return sorted(set(globals()) | set(__all__))
