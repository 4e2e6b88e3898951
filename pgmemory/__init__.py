"""pgmemory: long-term memory and chat history for AI agents in PostgreSQL with pgvector.

The public surface is what this module exports; everything else is internal.

Names are imported on first use (PEP 562), so ``import pgmemory`` is cheap and loads neither
SQLAlchemy, the ``openai`` package, numpy nor agent-framework: ``pgmemory.MemoryStore`` imports
the store when it is first asked for, and ``pgmemory.ChatHistoryMemoryProvider`` (and the other
providers) agent-framework, which the ``agent-framework`` extra installs. The imports under ``TYPE_CHECKING`` below are the one list of public
names: type checkers and IDEs read them, and :func:`pgmemory._exports.lazy_exports` makes
``__all__`` and the lazy imports from the same lines. ``pgmemory.__version__`` is the installed
distribution's version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgmemory._exports import lazy_exports

if TYPE_CHECKING:
    from pgmemory.admin import Admin as Admin
    from pgmemory.embedders import (
        CachedEmbedder as CachedEmbedder,
        Embedder as Embedder,
        OpenAIEmbedder as OpenAIEmbedder,
        USEEmbedder as USEEmbedder,
        make_embedder as make_embedder,
    )
    from pgmemory.errors import (
        CollectionError as CollectionError,
        ConnectionLostError as ConnectionLostError,
        DatabaseError as DatabaseError,
        DatabaseNotReadyError as DatabaseNotReadyError,
        DatabaseUnavailableError as DatabaseUnavailableError,
        DuplicateIdError as DuplicateIdError,
        EmbedderMismatchError as EmbedderMismatchError,
        EmbeddingError as EmbeddingError,
        InvalidInputError as InvalidInputError,
        MissingExtraError as MissingExtraError,
        PgMemoryError as PgMemoryError,
        ScopeError as ScopeError,
        StatementTimeoutError as StatementTimeoutError,
        UnscopedError as UnscopedError,
    )
    from pgmemory.integrations.agent_framework.chat_history import (
        ChatHistoryMemoryProvider as ChatHistoryMemoryProvider,
    )
    from pgmemory.integrations.agent_framework.chat_history_options import (
        ChatHistoryMemoryProviderOptions as ChatHistoryMemoryProviderOptions,
    )
    from pgmemory.integrations.agent_framework.client import (
        chat_client as chat_client,
    )
    from pgmemory.integrations.agent_framework.fact_worker import (
        FactWorker as FactWorker,
    )
    from pgmemory.integrations.agent_framework.facts import (
        FactMemoryProvider as FactMemoryProvider,
    )
    from pgmemory.integrations.agent_framework.history import (
        PostgresHistoryProvider as PostgresHistoryProvider,
    )
    from pgmemory.integrations.agent_framework.messages import (
        MessageFilter as MessageFilter,
        all_messages as all_messages,
        external_only as external_only,
    )
    from pgmemory.settings import (
        Settings as Settings,
    )
    from pgmemory.store.records import (
        AnnStatus as AnnStatus,
        CollectionInfo as CollectionInfo,
        HistoryRow as HistoryRow,
        Memory as Memory,
        MemoryHit as MemoryHit,
        MemoryRecord as MemoryRecord,
        MemoryScope as MemoryScope,
        Recall as Recall,
        RecallItem as RecallItem,
        RecallTrace as RecallTrace,
        SearchWeights as SearchWeights,
        Signals as Signals,
        TwoPhaseStatus as TwoPhaseStatus,
    )
    from pgmemory.store.requests import (
        RecallRequest as RecallRequest,
    )
    from pgmemory.store.store import (
        MemoryStore as MemoryStore,
    )
    from pgmemory.sync import (
        SyncMemoryStore as SyncMemoryStore,
    )


def _version() -> str:
    from pgmemory.extras import installed_version

    return installed_version()


__all__, __getattr__, __dir__ = lazy_exports(__name__, computed={"__version__": _version})
