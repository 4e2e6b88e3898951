"""Memory providers: chat-history memory (recall of earlier turns), fact memory, and the chat
history kept in PostgreSQL. They are the context providers that need the store."""

from pgmemory.memory.chat_history import (
    ChatHistoryMemoryProvider,
    ChatHistoryMemoryProviderOptions,
)
from pgmemory.memory.facts import FactMemoryProvider
from pgmemory.memory.postgres_history import PostgresHistoryProvider

__all__ = [
    "ChatHistoryMemoryProvider",
    "ChatHistoryMemoryProviderOptions",
    "FactMemoryProvider",
    "PostgresHistoryProvider",
]
