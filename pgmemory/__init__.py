"""pgmemory: long-term memory and chat history for AI agents in PostgreSQL with pgvector.

The public surface is what this module exports; everything else is internal.
"""

from pgmemory.embedders import CachedEmbedder, Embedder, OpenAIEmbedder, USEEmbedder, make_embedder
from pgmemory.errors import (
    CollectionError,
    DatabaseNotReadyError,
    EmbeddingError,
    InvalidInputError,
    PgMemoryError,
    ScopeError,
)
from pgmemory.settings import Settings
from pgmemory.store.records import (
    CollectionInfo,
    HistoryRow,
    Memory,
    MemoryHit,
    MemoryRecord,
    MemoryScope,
    RecallTrace,
)
from pgmemory.store.store import MemoryStore

__all__ = [
    "CachedEmbedder",
    "CollectionError",
    "CollectionInfo",
    "DatabaseNotReadyError",
    "Embedder",
    "EmbeddingError",
    "HistoryRow",
    "InvalidInputError",
    "Memory",
    "MemoryHit",
    "MemoryRecord",
    "MemoryScope",
    "MemoryStore",
    "OpenAIEmbedder",
    "PgMemoryError",
    "RecallTrace",
    "ScopeError",
    "Settings",
    "USEEmbedder",
    "make_embedder",
]
