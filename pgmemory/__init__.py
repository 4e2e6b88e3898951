"""pgmemory: long-term memory and chat history for AI agents in PostgreSQL with pgvector.

The public surface is what this module exports; everything else is internal.

Names are imported on first use (PEP 562), so ``import pgmemory`` is cheap and loads neither
SQLAlchemy, the ``openai`` package nor numpy: ``pgmemory.MemoryStore`` imports the store when
it is first asked for. Type checkers and IDEs see the real imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgmemory.embedders import (
        CachedEmbedder,
        Embedder,
        OpenAIEmbedder,
        USEEmbedder,
        make_embedder,
    )
    from pgmemory.errors import (
        AfterRunError,
        CollectionError,
        DatabaseNotReadyError,
        EmbeddingError,
        InvalidInputError,
        MissingExtraError,
        PgMemoryError,
        ScopeError,
        StructuredOutputError,
        ToolArgumentsError,
        ToolLoopLimitError,
    )
    from pgmemory.memory import (
        ChatHistoryMemoryProvider,
        ChatHistoryMemoryProviderOptions,
        FactMemoryProvider,
        PostgresHistoryProvider,
    )
    from pgmemory.runtime import (
        Agent,
        AgentResponse,
        AgentResponseUpdate,
        AgentSession,
        ChatClient,
        ChatReducer,
        ChatResponse,
        ContextProvider,
        FunctionCallContent,
        FunctionResultContent,
        HistoryProvider,
        InMemoryHistoryProvider,
        Message,
        MessageCountingReducer,
        MessageFilter,
        OpenAIChatClient,
        ProviderSessionState,
        SessionContext,
        SummarizingReducer,
        TextContent,
        Tool,
        all_messages,
        external_only,
        filter_by_source,
        tool,
    )
    from pgmemory.settings import Settings
    from pgmemory.store.records import (
        AnnStatus,
        CollectionInfo,
        HistoryRow,
        Memory,
        MemoryHit,
        MemoryRecord,
        MemoryScope,
        RecallTrace,
        SearchWeights,
    )
    from pgmemory.store.store import MemoryStore
    from pgmemory.sync import SyncMemoryStore

#: Module -> the public names imported from it. The imports above, this table and ``__all__``
#: must name the same things; tests/test_startup.py checks that they do.
_MODULES: dict[str, tuple[str, ...]] = {
    "pgmemory.embedders": (
        "CachedEmbedder",
        "Embedder",
        "OpenAIEmbedder",
        "USEEmbedder",
        "make_embedder",
    ),
    "pgmemory.errors": (
        "AfterRunError",
        "CollectionError",
        "DatabaseNotReadyError",
        "EmbeddingError",
        "InvalidInputError",
        "MissingExtraError",
        "PgMemoryError",
        "ScopeError",
        "StructuredOutputError",
        "ToolArgumentsError",
        "ToolLoopLimitError",
    ),
    "pgmemory.memory": (
        "ChatHistoryMemoryProvider",
        "ChatHistoryMemoryProviderOptions",
        "FactMemoryProvider",
        "PostgresHistoryProvider",
    ),
    "pgmemory.runtime": (
        "Agent",
        "AgentResponse",
        "AgentResponseUpdate",
        "AgentSession",
        "ChatClient",
        "ChatReducer",
        "ChatResponse",
        "ContextProvider",
        "FunctionCallContent",
        "FunctionResultContent",
        "HistoryProvider",
        "InMemoryHistoryProvider",
        "Message",
        "MessageCountingReducer",
        "MessageFilter",
        "OpenAIChatClient",
        "ProviderSessionState",
        "SessionContext",
        "SummarizingReducer",
        "TextContent",
        "Tool",
        "all_messages",
        "external_only",
        "filter_by_source",
        "tool",
    ),
    "pgmemory.settings": ("Settings",),
    "pgmemory.sync": ("SyncMemoryStore",),
    "pgmemory.store.records": (
        "AnnStatus",
        "CollectionInfo",
        "HistoryRow",
        "Memory",
        "MemoryHit",
        "MemoryRecord",
        "MemoryScope",
        "RecallTrace",
        "SearchWeights",
    ),
    "pgmemory.store.store": ("MemoryStore",),
}

#: Public name -> the module to import it from.
_EXPORTS: dict[str, str] = {name: module for module, names in _MODULES.items() for name in names}

# A literal list, so type checkers and IDEs know what `from pgmemory import *` brings.
__all__ = [
    "AfterRunError",
    "Agent",
    "AgentResponse",
    "AgentResponseUpdate",
    "AgentSession",
    "AnnStatus",
    "CachedEmbedder",
    "ChatClient",
    "ChatHistoryMemoryProvider",
    "ChatHistoryMemoryProviderOptions",
    "ChatReducer",
    "ChatResponse",
    "CollectionError",
    "CollectionInfo",
    "ContextProvider",
    "DatabaseNotReadyError",
    "Embedder",
    "EmbeddingError",
    "FactMemoryProvider",
    "FunctionCallContent",
    "FunctionResultContent",
    "HistoryProvider",
    "HistoryRow",
    "InMemoryHistoryProvider",
    "InvalidInputError",
    "Memory",
    "MemoryHit",
    "MemoryRecord",
    "MemoryScope",
    "MemoryStore",
    "Message",
    "MessageCountingReducer",
    "MessageFilter",
    "MissingExtraError",
    "OpenAIChatClient",
    "OpenAIEmbedder",
    "PgMemoryError",
    "PostgresHistoryProvider",
    "ProviderSessionState",
    "RecallTrace",
    "ScopeError",
    "SearchWeights",
    "SessionContext",
    "Settings",
    "StructuredOutputError",
    "SummarizingReducer",
    "SyncMemoryStore",
    "TextContent",
    "Tool",
    "ToolArgumentsError",
    "ToolLoopLimitError",
    "USEEmbedder",
    "all_messages",
    "external_only",
    "filter_by_source",
    "make_embedder",
    "tool",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562).

    Args:
        name: the attribute asked for.

    Returns:
        The object ``name`` refers to (also cached in this module's namespace, so later
        accesses are plain attribute lookups).

    Raises:
        AttributeError: ``name`` is not a public name of pgmemory.
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
