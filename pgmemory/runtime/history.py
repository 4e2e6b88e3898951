"""History providers: context providers that load and save a session's conversation.

Exactly one history provider per agent may *load* messages (``load_messages=True``); it feeds
the prior conversation to the model, stamped ``chat_history``. Others can record the
conversation for audit (``load_messages=False``, optionally ``store_context_messages=True`` to
record what other providers injected). When an agent has no loading history provider, it adds
an :class:`InMemoryHistoryProvider`, which keeps the messages in the session's state (so they
travel with ``session.to_dict()``).

Subclasses implement :meth:`HistoryProvider.get_messages` and :meth:`HistoryProvider.save_messages`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.messages import CHAT_HISTORY, Message
from pgmemory.runtime.providers import ContextProvider, SessionContext
from pgmemory.runtime.reducers import ChatReducer, ReducerTrigger, check_trigger

if TYPE_CHECKING:
    from pgmemory.runtime.session import AgentSession


class HistoryProvider(ContextProvider):
    """Base class of history providers.

    Nothing is saved when the run failed.

    Args:
        source_id: the provider's id (default: the class's ``default_source_id``).
        load_messages: feed the stored history to the model before each run (only one
            provider of an agent may).
        store_inputs: save the caller's input messages after each run.
        store_outputs: save the agent's response messages after each run.
        store_context_messages: also save messages other context providers added (not
            loaded history).
        store_context_from: limit ``store_context_messages`` to these providers' source ids.
        reducer: shrinks the history (:class:`~pgmemory.runtime.reducers.ChatReducer`).
        reducer_trigger: ``"before_messages_retrieved"`` (default) reduces what is loaded;
            ``"after_messages_added"`` rewrites the stored history, for providers that
            support it.
        state_key: the key of its state in ``session.state`` (default: ``source_id``).

    Raises:
        InvalidInputError: no source id, a reducer without ``reduce()``, an unknown trigger,
            or a rewrite the provider does not support.
    """

    #: Whether this provider can rewrite its stored history (``after_messages_added``).
    supports_rewrite: bool = False
    #: The source id used when none is given.
    default_source_id: str | None = None

    def __init__(
        self,
        source_id: str | None = None,
        *,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_outputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: Sequence[str] | None = None,
        reducer: ChatReducer | None = None,
        reducer_trigger: ReducerTrigger = "before_messages_retrieved",
        state_key: str | None = None,
    ) -> None:
        source_id = source_id if source_id is not None else self.default_source_id
        if source_id is None:
            raise InvalidInputError(
                f"{type(self).__name__} needs a source_id (e.g. 'audit_history')"
            )
        super().__init__(source_id, state_key=state_key)
        self.load_messages = bool(load_messages)
        self.store_inputs = bool(store_inputs)
        self.store_outputs = bool(store_outputs)
        self.store_context_messages = bool(store_context_messages)
        self.store_context_from = (
            set(store_context_from) if store_context_from is not None else None
        )
        if reducer is not None and not hasattr(reducer, "reduce"):
            raise InvalidInputError(
                f"reducer {reducer!r} has no reduce(); pass MessageCountingReducer(...) or SummarizingReducer(...)"
            )
        self.reducer = reducer
        self.reducer_trigger: ReducerTrigger = check_trigger(reducer_trigger)
        if (
            reducer is not None
            and self.reducer_trigger == "after_messages_added"
            and not self.supports_rewrite
        ):
            raise InvalidInputError(
                f"{type(self).__name__} keeps every stored message and cannot apply a reducer "
                "after messages are added; use reducer_trigger='before_messages_retrieved'"
            )

    # -- storage (subclasses) ----------------------------------------------------------------

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        """The stored history of the session, oldest first."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_messages()")

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[Message],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append ``messages`` to the session's stored history."""
        raise NotImplementedError(f"{type(self).__name__} must implement save_messages()")

    # -- hooks -------------------------------------------------------------------------------

    def messages_to_store(self, context: SessionContext) -> list[Message]:
        """What :meth:`after_run` saves, per the store_* options, in conversation order."""
        if context.exception is not None:
            return []
        chosen: list[Message] = []
        if self.store_context_messages:
            for message in context.get_messages():
                if message.source_type == CHAT_HISTORY or message.source_id == self.source_id:
                    continue
                if self.store_context_from is None or message.source_id in self.store_context_from:
                    chosen.append(message)
        if self.store_inputs:
            chosen.extend(context.input_messages)
        if self.store_outputs:
            chosen.extend(context.response_messages)
        return chosen

    async def before_run(
        self,
        *,
        agent: Any,
        session: AgentSession,
        context: SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Load the history (if ``load_messages``) and add it to the run as ``chat_history``."""
        if not self.load_messages:
            return
        messages = await self.get_messages(session.session_id, state=state)
        if self.reducer is not None and self.reducer_trigger == "before_messages_retrieved":
            messages = await self.reducer.reduce(messages)
        if messages:
            context.extend_messages(self, messages, source_type=CHAT_HISTORY)

    async def after_run(
        self,
        *,
        agent: Any,
        session: AgentSession,
        context: SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Save this run's messages (nothing if the run failed)."""
        messages = self.messages_to_store(context)
        if messages:
            await self.save_messages(session.session_id, messages, state=state)


class InMemoryHistoryProvider(HistoryProvider):
    """History kept in the session's state (``state["messages"]``, as message dicts).

    Because it lives in the session, it is saved and restored with ``session.to_dict()`` /
    ``agent.deserialize_session()``. Supports both reducer triggers.
    """

    supports_rewrite = True
    default_source_id = "in_memory_history"

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        return [Message.from_dict(d) for d in (state or {}).get("messages", [])]

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[Message],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if state is None:
            raise InvalidInputError(
                "InMemoryHistoryProvider keeps messages in session state; pass state=..."
            )
        stored: list[dict[str, Any]] = state.setdefault("messages", [])
        known = {d.get("message_id") for d in stored}
        for message in messages:
            if message.message_id not in known:
                stored.append(message.to_dict())
                known.add(message.message_id)
        if self.reducer is not None and self.reducer_trigger == "after_messages_added":
            reduced = await self.reducer.reduce([Message.from_dict(d) for d in stored])
            state["messages"] = [m.to_dict() for m in reduced]

    def messages(self, session: AgentSession) -> list[Message]:
        """The history this provider holds for ``session`` (a convenience for callers/tests)."""
        return [
            Message.from_dict(d) for d in session.state.get(self.state_key, {}).get("messages", [])
        ]


__all__ = ["HistoryProvider", "InMemoryHistoryProvider"]
