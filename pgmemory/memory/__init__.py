"""Memory providers: chat-history memory (recall of earlier turns) and fact memory."""

from pgmemory.memory.chat_history import (
    ChatHistoryMemoryProvider,
    ChatHistoryMemoryProviderOptions,
)
from pgmemory.memory.facts import FactMemoryProvider

__all__ = ["ChatHistoryMemoryProvider", "ChatHistoryMemoryProviderOptions", "FactMemoryProvider"]
