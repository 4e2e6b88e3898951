"""pgmemory's providers for an ``agent_framework.Agent``: the one place the benchmarks build them.

``bench/serve/_serve_app.py`` (the served turn) and ``bench/serve/_turn_worker.py`` (the
provider A/B, also run on an older checkout) both call :func:`pgmemory_providers`, so the
switch between provider APIs is made here once. It imports nothing from ``bench`` (the A/B
worker loads this file by path, beside an older ``pgmemory``).

Two APIs are understood:

* the API of issue 22 (``ChatHistoryMemoryProvider(store, collection, user_id=...)``,
  ``PostgresHistoryProvider(store, user_id=...)``, subclasses of agent-framework's own
  provider classes; ``user_id`` a str or ``callable(session) -> str``);
* the integration before it (``pgmemory.integrations.agent_framework``: twin classes with a
  ``state_initializer`` and the user id read from ``session.state["user_id"]``).

Callers always bind the user both ways (``user_of(session)`` and ``session.state["user_id"]``),
so either API runs unchanged; once only the new API exists the second branch can go.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def _classes() -> tuple[Any, Any]:
    """The agent-framework provider classes of the ``pgmemory`` on ``sys.path``: the lazy
    top-level exports once they are agent-framework providers (issue 22), else the
    integration's twins."""
    import agent_framework as af

    import pgmemory

    memory_cls = getattr(pgmemory, "ChatHistoryMemoryProvider", None)
    history_cls = getattr(pgmemory, "PostgresHistoryProvider", None)
    if isinstance(memory_cls, type) and issubclass(memory_cls, af.ContextProvider):
        return memory_cls, history_cls
    from pgmemory.integrations.agent_framework import (
        ChatHistoryMemoryProvider,
        PostgresHistoryProvider,
    )

    return ChatHistoryMemoryProvider, PostgresHistoryProvider


def provider_api() -> str:
    """``"user_id"`` (issue 22's constructors) or ``"state_initializer"`` (the integration
    before it)."""
    memory_cls, _ = _classes()
    return (
        "user_id"
        if "user_id" in inspect.signature(memory_cls).parameters
        else ("state_initializer")
    )


def pgmemory_providers(store: Any, collection: str, user_of: Callable[[Any], str]) -> list[Any]:
    """``[history, memory]``: ``PostgresHistoryProvider`` and ``ChatHistoryMemoryProvider``
    with their defaults (storage scope: user + session; search scope: the user), in the order
    the README recommends. ``user_of(session)`` names the request's user."""
    memory_cls, history_cls = _classes()
    if provider_api() == "user_id":
        return [
            history_cls(store, user_id=user_of),
            memory_cls(store, collection, user_id=user_of),
        ]
    from pgmemory import MemoryScope

    def per_user(session: Any) -> Any:
        user = user_of(session)
        return memory_cls.State(
            storage_scope=MemoryScope(user_id=user, session_id=session.session_id),
            search_scope=MemoryScope(user_id=user),
        )

    return [history_cls(store), memory_cls(store, collection, state_initializer=per_user)]
