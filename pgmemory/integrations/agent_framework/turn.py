"""One turn, one transaction: the after-run writes of every pgmemory provider of an agent.

agent-framework calls ``after_run`` in reverse provider order and stops at the first error, with
no hook around the whole phase. So each pgmemory provider's ``after_run`` only registers itself
in ``SessionContext.metadata`` until the framework reaches the first pgmemory provider in list
order (the last it calls); that call runs every registered one in list order, inside their units
of work (one shared transaction per store, :meth:`pgmemory.MemoryStore.shared_transaction`,
deferred: the turn's history and memory rows are sent with its commit, one round trip), which
roll back if any fails. A framework provider failing between two of ours therefore stops
the framework before our last call: nothing of that turn is written.

When the agent persists history per service call
(``require_per_service_call_history_persistence``), the framework calls history providers from
its middleware after every model call instead; then each pgmemory provider writes on its own,
as the framework expects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

from agent_framework import AgentSession, Message, SessionContext

from pgmemory.integrations.agent_framework.binding import check_own_state_key
from pgmemory.integrations.agent_framework.messages import input_messages

#: Where the providers whose writes wait for the turn's last pgmemory provider are kept.
WAITING = "pgmemory.after_run_waiting"


class TurnWriter(ABC):
    """A pgmemory provider that writes after a run (what :func:`after_run_together` runs).

    A base class, not a runtime-checkable protocol: the turn asks each of the agent's providers
    whether it is one, twice per turn and provider, and a protocol's check read every member
    of it each time (~15 us apiece).
    """

    source_id: str

    @abstractmethod
    def unit_of_work(self, context: SessionContext) -> AbstractAsyncContextManager[object]:
        """What the provider's writes of a turn belong to (the store's shared transaction)."""

    @abstractmethod
    async def write_turn(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Write what the turn leaves behind (called inside :meth:`unit_of_work`)."""


def check_run(provider: TurnWriter, *, agent: Any, context: SessionContext) -> list[Message]:
    """What each hook of a pgmemory provider checks first, before anything is read or written:
    that no other provider of ``agent`` has its state key (:func:`~pgmemory.integrations.
    agent_framework.binding.check_own_state_key`) and that the run's input items are messages
    (:func:`~pgmemory.integrations.agent_framework.messages.input_messages`).

    Returns:
        The run's input messages.

    Raises:
        InvalidInputError: two providers share a ``source_id``, or an input item is not a
            ``Message``.
    """
    check_own_state_key(provider, agent)
    return input_messages(context)


async def after_run_together(
    owner: TurnWriter,
    *,
    agent: Any,
    session: AgentSession,
    context: SessionContext,
    state: dict[str, Any],
) -> None:
    """Run the writes of every pgmemory provider of ``agent`` together, all or nothing.

    Each call registers ``owner``; the call for the first pgmemory provider in list order runs
    the registered ones, in list order, inside their units of work. The error of a failing
    write propagates (after the rollback), as the framework's own errors do.

    Raises:
        InvalidInputError: what :func:`check_run` refuses (before anything is written).
    """
    check_run(owner, agent=agent, context=context)
    providers = list(getattr(agent, "context_providers", None) or ())
    listed = [p for p in providers if isinstance(p, TurnWriter)]
    if owner not in listed or getattr(agent, "require_per_service_call_history_persistence", False):
        async with owner.unit_of_work(context):
            await owner.write_turn(agent=agent, session=session, context=context, state=state)
        return
    waiting: dict[str, dict[str, Any]] = context.metadata.setdefault(WAITING, {})
    waiting[owner.source_id] = state
    if owner is not listed[0]:
        return
    del context.metadata[WAITING]
    turn = [p for p in listed if p.source_id in waiting]
    async with AsyncExitStack() as units:
        for provider in turn:
            await units.enter_async_context(provider.unit_of_work(context))
        for provider in turn:
            await provider.write_turn(
                agent=agent, session=session, context=context, state=waiting[provider.source_id]
            )


__all__ = ["WAITING", "TurnWriter", "after_run_together", "check_run"]
