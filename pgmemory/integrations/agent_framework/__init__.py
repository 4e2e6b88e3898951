"""pgmemory's providers for agent-framework: ``pip install 'pgmemory-agents[agent-framework]'``.

The classes are agent-framework ``ContextProvider`` / ``HistoryProvider`` subclasses; they use
the framework's own ``Message``, ``SessionContext`` and ``AgentSession``::

    from agent_framework import Agent
    from pgmemory import ChatHistoryMemoryProvider, PostgresHistoryProvider

    memory = ChatHistoryMemoryProvider(store, "chat", user_id=current_user)
    history = PostgresHistoryProvider(store, user_id=current_user)
    agent = Agent(client=client, context_providers=[history, memory])

They are also lazy exports of :mod:`pgmemory` (``pgmemory.ChatHistoryMemoryProvider``), which
import this package, and so agent-framework, on first use only.
"""

from __future__ import annotations

from pgmemory.extras import require

require("agent_framework", extra="agent-framework", purpose="pgmemory's agent-framework providers")

from pgmemory.integrations.agent_framework.chat_history import (  # noqa: E402
    ChatHistoryMemoryProvider,
)
from pgmemory.integrations.agent_framework.chat_history_options import (  # noqa: E402
    ChatHistoryMemoryProviderOptions,
)
from pgmemory.integrations.agent_framework.client import chat_client  # noqa: E402
from pgmemory.integrations.agent_framework.fact_worker import FactWorker  # noqa: E402
from pgmemory.integrations.agent_framework.facts import FactMemoryProvider  # noqa: E402
from pgmemory.integrations.agent_framework.history import PostgresHistoryProvider  # noqa: E402
from pgmemory.integrations.agent_framework.messages import (  # noqa: E402
    MessageFilter,
    all_messages,
    external_only,
)

__all__ = [
    "ChatHistoryMemoryProvider",
    "ChatHistoryMemoryProviderOptions",
    "FactMemoryProvider",
    "FactWorker",
    "MessageFilter",
    "PostgresHistoryProvider",
    "all_messages",
    "chat_client",
    "external_only",
]
