"""pgmemory as agent-framework's memory: ``pip install 'pgmemory[agent-framework]'``.

The classes here are agent-framework ``ContextProvider`` / ``HistoryProvider`` subclasses, so
``agent_framework.Agent(client, instructions, context_providers=[...])`` runs them unchanged::

    from pgmemory.integrations.agent_framework import (
        ChatHistoryMemoryProvider, PostgresHistoryProvider)

    memory = ChatHistoryMemoryProvider(store, "chat", state_initializer=per_user)
    agent = Agent(client, "...", context_providers=[PostgresHistoryProvider(store), memory])
"""

from __future__ import annotations

from pgmemory.extras import require

require("agent_framework", extra="agent-framework", purpose="pgmemory.integrations.agent_framework")

from pgmemory.integrations.agent_framework.providers import (  # noqa: E402
    ChatHistoryMemoryProvider,
    FactMemoryProvider,
    FrameworkSession,
    PostgresHistoryProvider,
)

__all__ = [
    "ChatHistoryMemoryProvider",
    "FactMemoryProvider",
    "FrameworkSession",
    "PostgresHistoryProvider",
]
