"""pgmemory's providers as agent-framework context and history providers.

Each class here IS the framework's ``ContextProvider`` (or ``HistoryProvider``) and owns one of
pgmemory's own providers, built with the same arguments. A hook call converts the framework's
session and context into pgmemory's, runs pgmemory's hook, and hands back what it added
(instructions, messages, tools), so recall, storage and their audit are pgmemory's one
implementation; only types are adapted here.

The framework's session state is shared, not copied: pgmemory's provider keeps its state under
its ``state_key`` in the framework session's ``state`` dict, JSON-native, so it round-trips
through ``AgentSession.to_dict()`` / ``AgentSession.from_dict()``.

A turn is stored whole or not at all, as with pgmemory's own agent: the framework calls
``after_run`` in reverse list order and stops at the first error, so pgmemory's providers of
one agent run theirs together instead, when the framework reaches the first of them in list
order (the last it calls): in list order, inside their units of work (one transaction per
store), rolled back if any fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from typing import Any

import agent_framework as af

from pgmemory.integrations.agent_framework.messages import (
    to_framework,
    to_framework_tool,
    to_pgmemory,
)
from pgmemory.memory.chat_history import (
    ChatHistoryMemoryProvider as _ChatHistoryMemory,
    ChatHistoryMemoryProviderOptions,
)
from pgmemory.memory.facts import FactMemoryProvider as _FactMemory
from pgmemory.memory.postgres_history import PostgresHistoryProvider as _PostgresHistory
from pgmemory.runtime.agent import AgentResponse
from pgmemory.runtime.providers import ContextProvider as _CoreProvider, SessionContext
from pgmemory.runtime.session import AgentSession


class FrameworkSession(AgentSession):
    """pgmemory's view of a framework session: same id, the very same ``state`` dict.

    ``framework_session`` is the framework's session itself; the state initializers of the
    classes below receive it.
    """

    __slots__ = ("framework_session",)

    def __init__(self, session: af.AgentSession) -> None:
        self.session_id = session.session_id
        self.state = session.state
        self.framework_session = session


def _history_sources(agent: Any) -> set[str]:
    providers = getattr(agent, "context_providers", None) or ()
    return {p.source_id for p in providers if isinstance(p, af.HistoryProvider)}


class _Bridge:
    """Runs one pgmemory provider's hooks on the framework's session and context."""

    def __init__(self, core: _CoreProvider) -> None:
        self.core = core

    def _context(self, agent: Any, context: af.SessionContext) -> SessionContext:
        history = _history_sources(agent)
        ours = SessionContext(
            session_id=context.session_id,
            input_messages=[
                to_pgmemory(m, history_sources=history) for m in context.input_messages
            ],
        )
        for source_id, messages in context.context_messages.items():
            for message in messages:
                converted = to_pgmemory(message, history_sources=history)
                ours.extend_messages(source_id, converted, source_type=converted.source_type)
        if context.response is not None:
            ours.response = AgentResponse(
                messages=[
                    to_pgmemory(m, history_sources=history) for m in context.response.messages
                ],
                session_id=context.session_id,
            )
        return ours

    async def run(
        self,
        hook: str,
        owner: af.ContextProvider,
        *,
        agent: Any,
        session: af.AgentSession,
        context: af.SessionContext,
        ours: SessionContext | None = None,
    ) -> None:
        """Run pgmemory's ``hook`` (``before_run``/``after_run``) and apply what it added.

        ``ours`` is pgmemory's view of ``context`` when the caller made it already.
        """
        if ours is None:
            ours = self._context(agent, context)
        known = len(ours.get_messages())
        view = FrameworkSession(session)
        state = session.state.setdefault(self.core.state_key, {})
        await getattr(self.core, hook)(agent=agent, session=view, context=ours, state=state)
        if ours.instructions:
            context.extend_instructions(owner.source_id, ours.instructions)
        for message in ours.get_messages()[known:]:
            context.extend_messages(
                owner,
                [to_framework(message)],
                origin_session_ids=list(message.origin_session_ids) or None,
            )
        if ours.tools:
            context.extend_tools(owner.source_id, [to_framework_tool(t) for t in ours.tools])


#: Where the providers whose after_run waits for the turn's last pgmemory provider are kept.
_WAITING = "pgmemory.after_run_waiting"


async def _after_run_together(
    owner: _Adapted | PostgresHistoryProvider,
    *,
    agent: Any,
    session: af.AgentSession,
    context: af.SessionContext,
) -> None:
    """Run the after_run of every pgmemory provider of the agent together, all or nothing.

    Each provider's call only registers it, until the framework calls the first pgmemory
    provider in list order (the framework goes in reverse); that call runs every registered
    one in list order inside their units of work, which roll back if any fails (the error
    then propagates, as the framework's own errors do). When the framework persists history
    per service call (it then skips history providers here), each runs on its own as before.
    """
    listed = [
        p
        for p in getattr(agent, "context_providers", None) or ()
        if isinstance(p, (_Adapted, PostgresHistoryProvider))
    ]
    if owner not in listed or getattr(agent, "require_per_service_call_history_persistence", False):
        await owner._bridge.run("after_run", owner, agent=agent, session=session, context=context)
        return
    waiting: list[Any] = context.metadata.setdefault(_WAITING, [])
    waiting.append(owner)
    if owner is not listed[0]:
        return
    del context.metadata[_WAITING]
    turn = [p for p in listed if p in waiting]
    views = [p._bridge._context(agent, context) for p in turn]
    async with AsyncExitStack() as units:
        for provider, view in zip(turn, views, strict=True):
            unit = provider._bridge.core.unit_of_work(view)
            if unit is not None:
                await units.enter_async_context(unit)
        for provider, view in zip(turn, views, strict=True):
            await provider._bridge.run(
                "after_run", provider, agent=agent, session=session, context=context, ours=view
            )


def _framework_initializer(initializer: Callable[[af.AgentSession], Any]) -> Callable[[Any], Any]:
    """Call the user's initializer with the framework's session, not pgmemory's view of it."""
    if not callable(initializer):
        return initializer  # pgmemory's provider reports the error, naming the argument

    def initialize(view: FrameworkSession) -> Any:
        return initializer(view.framework_session)

    return initialize


class _RunsPgmemoryHooks:
    """The framework's two hooks, each running the owned pgmemory provider's (``self.pgmemory``)
    on the framework's session and context. Listed first among the bases, so these hooks are
    the ones the framework calls."""

    pgmemory: _CoreProvider
    _bridge: _Bridge

    def _adopt(self, core: _CoreProvider) -> None:
        self.pgmemory = core
        self._bridge = _Bridge(core)

    async def before_run(
        self,
        *,
        agent: Any,
        session: af.AgentSession,
        context: af.SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Run pgmemory's ``before_run`` (recall, history, instructions, tools) on the
        framework's context."""
        await self._bridge.run("before_run", self, agent=agent, session=session, context=context)  # type: ignore[arg-type]

    async def after_run(
        self,
        *,
        agent: Any,
        session: af.AgentSession,
        context: af.SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Run pgmemory's ``after_run`` (storage, extraction) on the framework's context, with
        the agent's other pgmemory providers, all or nothing."""
        await _after_run_together(self, agent=agent, session=session, context=context)  # type: ignore[arg-type]


class _Adapted(_RunsPgmemoryHooks, af.ContextProvider):
    """A framework context provider whose hooks run a pgmemory provider."""


class ChatHistoryMemoryProvider(_Adapted):
    """:class:`pgmemory.ChatHistoryMemoryProvider` as an agent-framework ``ContextProvider``.

    Same constructor; ``state_initializer`` receives the framework's ``AgentSession``.

    Args:
        store: the open :class:`~pgmemory.MemoryStore`.
        collection_name: the collection memories are stored in and recalled from.
        state_initializer: ``callable(session) -> ChatHistoryMemoryProvider.State`` giving the
            storage and search scopes of a session.
        options: :class:`~pgmemory.ChatHistoryMemoryProviderOptions`.
        source_id: the provider's id (default: the class name).
    """

    State = _ChatHistoryMemory.State

    def __init__(
        self,
        store: Any,
        collection_name: str,
        *,
        state_initializer: Callable[[af.AgentSession], _ChatHistoryMemory.State],
        options: ChatHistoryMemoryProviderOptions | None = None,
        source_id: str | None = None,
    ) -> None:
        core = _ChatHistoryMemory(
            store,
            collection_name,
            state_initializer=_framework_initializer(state_initializer),
            options=options,
            source_id=source_id or type(self).__name__,
        )
        super().__init__(core.source_id)
        self._adopt(core)


class FactMemoryProvider(_Adapted):
    """:class:`pgmemory.FactMemoryProvider` as an agent-framework ``ContextProvider``.

    Same constructor (``chat_client`` is pgmemory's chat client used for fact extraction, e.g.
    :class:`pgmemory.OpenAIChatClient` on the agent's endpoint); ``state_initializer``
    receives the framework's ``AgentSession``.
    """

    State = _FactMemory.State

    def __init__(self, store: Any, chat_client: Any, model: Any, **options: Any) -> None:
        if "state_initializer" in options:
            options["state_initializer"] = _framework_initializer(options["state_initializer"])
        core = _FactMemory(store, chat_client, model, **options)
        super().__init__(core.source_id)
        self._adopt(core)

    @staticmethod
    def scope_from_session(key: str = "user_id", **fixed: str) -> Callable[[Any], Any]:
        """The usual initializer: the scope's user id read from ``session.state[key]``."""
        return _FactMemory.scope_from_session(key, **fixed)


class PostgresHistoryProvider(_RunsPgmemoryHooks, af.HistoryProvider):
    """:class:`pgmemory.PostgresHistoryProvider` as an agent-framework ``HistoryProvider``.

    Chat history in PostgreSQL, one row per message, surviving restarts; the same constructor
    as pgmemory's. Being a framework ``HistoryProvider`` that loads messages, it also keeps the
    framework from adding its in-memory history beside it.
    """

    pgmemory: _PostgresHistory

    def __init__(
        self,
        store: Any,
        source_id: str = "postgres_history",
        *,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_outputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            source_id,
            load_messages=load_messages,
            store_inputs=store_inputs,
            store_context_messages=store_context_messages,
            store_context_from=set(store_context_from) if store_context_from is not None else None,
            store_outputs=store_outputs,
        )
        self._adopt(
            _PostgresHistory(
                store,
                source_id,
                load_messages=load_messages,
                store_inputs=store_inputs,
                store_outputs=store_outputs,
                store_context_messages=store_context_messages,
                store_context_from=store_context_from,
                **options,
            )
        )

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[af.Message]:
        """Every stored message of the session, oldest first, as framework messages."""
        return [to_framework(m) for m in await self.pgmemory.get_messages(session_id, state=state)]

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[af.Message],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append framework messages to the stored history (ids already stored are skipped)."""
        await self.pgmemory.save_messages(
            session_id, [to_pgmemory(m) for m in messages], state=state
        )


__all__ = [
    "ChatHistoryMemoryProvider",
    "FactMemoryProvider",
    "FrameworkSession",
    "PostgresHistoryProvider",
]
