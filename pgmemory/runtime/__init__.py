"""The agent runtime: messages, tools, sessions, context and history providers, reducers,
the OpenAI-compatible chat client and the agent that ties them together.

Each concept has its own module; everything public is re-exported here. The runtime knows
nothing of the database: providers backed by the store live in :mod:`pgmemory.memory`.
"""

from pgmemory.runtime.agent import AfterRunError, Agent, AgentResponse, AgentResponseUpdate
from pgmemory.runtime.chat import ChatClient, ChatResponse, ChatResponseUpdate
from pgmemory.runtime.history import HistoryProvider, InMemoryHistoryProvider
from pgmemory.runtime.messages import (
    CHAT_HISTORY,
    CONTEXT_PROVIDER,
    EXTERNAL,
    FunctionCallContent,
    FunctionResultContent,
    Message,
    TextContent,
    all_messages,
    external_only,
    filter_by_source,
)
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.providers import ContextProvider, MessageFilter, SessionContext
from pgmemory.runtime.reducers import ChatReducer, MessageCountingReducer, SummarizingReducer
from pgmemory.runtime.session import AgentSession, ProviderSessionState
from pgmemory.runtime.tools import Tool, tool

__all__ = [
    "CHAT_HISTORY",
    "CONTEXT_PROVIDER",
    "EXTERNAL",
    "AfterRunError",
    "Agent",
    "AgentResponse",
    "AgentResponseUpdate",
    "AgentSession",
    "ChatClient",
    "ChatReducer",
    "ChatResponse",
    "ChatResponseUpdate",
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
]
