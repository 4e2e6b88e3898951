"""The fixed vocabularies a message carries, shared by the runtime and the store.

``Role`` is who said a message; ``SourceType`` says where a message came from:

``external``
    passed in by the caller (the default for any message built by hand);
``chat_history``
    loaded from a history provider;
``context_provider``
    added by a context provider before the model call (``source_id`` names the provider).

:data:`FACTS_NAMESPACE` is the facts namespace fact memory writes by default, and so the one
``pgmemory mcp``'s ``get_facts`` reads by default.
"""

from __future__ import annotations

from typing import Literal, TypeAlias, get_args

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
SourceType: TypeAlias = Literal["external", "chat_history", "context_provider"]

#: Every valid role, in the order above.
ROLES: tuple[str, ...] = get_args(Role)
#: Every valid source type, in the order above.
SOURCE_TYPES: tuple[str, ...] = get_args(SourceType)

EXTERNAL: SourceType = "external"
CHAT_HISTORY: SourceType = "chat_history"
CONTEXT_PROVIDER: SourceType = "context_provider"

#: The facts namespace ``FactMemoryProvider`` writes by default (its default ``source_id``,
#: which its ``namespace`` defaults to), and the one the MCP server's ``get_facts`` reads by
#: default (``pgmemory mcp --facts-namespace``).
FACTS_NAMESPACE = "fact_memory"
