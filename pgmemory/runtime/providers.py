"""Context providers: hooks around every model call, and the per-run context they work on.

One provider instance serves every session of its agent, so it keeps no per-session fields:
per-session data goes in ``session.state`` (the ``state`` argument of the hooks is the
provider's own dict there, under :attr:`ContextProvider.state_key`; or use
:class:`~pgmemory.runtime.session.ProviderSessionState` for typed state).

Each run, the agent builds a :class:`SessionContext` from the caller's input, then calls every
provider's ``before_run`` in list order (each sees what earlier ones added), calls the model,
and calls every provider's ``after_run`` with the response, or with the exception if the model
call failed. After a successful model call the ``after_run`` hooks run inside the providers'
units of work (:meth:`ContextProvider.unit_of_work`), so what they store is kept whole or not
at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.messages import (
    CHAT_HISTORY,
    CONTEXT_PROVIDER,
    EXTERNAL,
    Message,
    SourceType,
    all_messages,
    external_only,
    filter_by_source,
)
from pgmemory.runtime.tools import Tool, ToolLike, as_tools, merge_tools

if TYPE_CHECKING:
    from pgmemory.runtime.responses import AgentResponse
    from pgmemory.runtime.session import AgentSession

#: Picks the messages a provider searches with or stores (``external_only`` by default).
MessageFilter = Callable[[Sequence[Message]], Sequence[Message]]


def _source_id_of(source: object) -> str:
    source_id = getattr(source, "source_id", source)
    if not isinstance(source_id, str) or not source_id.strip():
        raise InvalidInputError(
            f"source {source!r} has no usable source id; pass the provider or its source_id string"
        )
    return source_id


class SessionContext:
    """What one run sends to the model, as providers build it.

    ``input_messages`` are the caller's messages (stamped ``external`` unless already stamped).
    Providers add instructions, messages and tools with the ``extend_*`` methods; added messages
    are stamped with the adding provider's source id. After the model call ``response`` (or
    ``exception``) is set for ``after_run``.
    """

    def __init__(
        self,
        *,
        session_id: str | None,
        input_messages: Sequence[Message],
        instructions: str | None = None,
        tools: Sequence[Tool] = (),
    ) -> None:
        self.session_id = session_id
        self.input_messages: list[Message] = list(input_messages)
        self._instructions: list[tuple[str | None, str]] = []
        if instructions:
            self._instructions.append((None, instructions))
        self.context_messages: dict[str, list[Message]] = {}
        self._order: list[Message] = []
        self.tools: list[Tool] = list(tools)
        self.response: AgentResponse | None = None
        self.exception: BaseException | None = None
        #: Free-form scratch space shared by the providers of this run (not persisted).
        self.metadata: dict[str, Any] = {}

    # -- building --------------------------------------------------------------------------

    def extend_instructions(self, source: object, instructions: str | Iterable[str]) -> None:
        """Append instructions (they go into the system message after the agent's own)."""
        source_id = _source_id_of(source)
        items = [instructions] if isinstance(instructions, str) else list(instructions)
        for text in items:
            if not isinstance(text, str):
                raise InvalidInputError(
                    f"instructions from {source_id!r} must be strings, got {text!r}"
                )
            if text.strip():
                self._instructions.append((source_id, text))

    def extend_messages(
        self,
        source: object,
        messages: Message | Iterable[Message],
        *,
        source_type: SourceType = CONTEXT_PROVIDER,
    ) -> list[Message]:
        """Add messages for this run, stamped as coming from ``source`` (a provider or its id).

        The stamp is ``context_provider`` unless ``source_type`` says otherwise (history
        providers pass ``chat_history``). Stamped copies are stored and returned; the given
        messages are not changed.
        """
        source_id = _source_id_of(source)
        items = [messages] if isinstance(messages, Message) else list(messages)
        stamped: list[Message] = []
        for message in items:
            if not isinstance(message, Message):
                raise InvalidInputError(
                    f"extend_messages from {source_id!r} got {message!r}, not a Message"
                )
            stamped.append(message.with_source(source_type, source_id))
        self.context_messages.setdefault(source_id, []).extend(stamped)
        self._order.extend(stamped)
        return stamped

    def extend_tools(self, source: object, tools: ToolLike | Iterable[ToolLike]) -> None:
        """Make more tools available to the model for this run."""
        _source_id_of(source)
        items = [tools] if isinstance(tools, Tool) or callable(tools) else list(tools)
        self.tools = merge_tools(self.tools, as_tools(items))

    # -- reading ---------------------------------------------------------------------------

    @property
    def instructions(self) -> str | None:
        """The agent's instructions and every provider's additions, one paragraph each."""
        parts = [text for _, text in self._instructions]
        return "\n\n".join(parts) if parts else None

    def get_messages(
        self,
        *,
        sources: Iterable[str] | None = None,
        exclude_sources: Iterable[str] | None = None,
        source_types: SourceType | Iterable[SourceType] | None = None,
        include_input: bool = False,
        include_response: bool = False,
    ) -> list[Message]:
        """Messages added by providers so far (in the order added), optionally filtered.

        ``sources`` / ``exclude_sources`` select by provider source id, ``source_types`` by
        stamp. ``include_input`` appends the caller's input, ``include_response`` the response
        messages (after the run). Filters apply to everything returned.
        """
        result = list(self._order)
        if include_input:
            result.extend(self.input_messages)
        if include_response:
            result.extend(self.response_messages)
        if sources is not None:
            wanted = set(sources)
            result = [m for m in result if m.source_id in wanted]
        if exclude_sources is not None:
            unwanted = set(exclude_sources)
            result = [m for m in result if m.source_id not in unwanted]
        if source_types is not None:
            result = filter_by_source(result, source_types)
        return result

    @property
    def request_messages(self) -> list[Message]:
        """What the model is sent after the system message: history first, then the other
        providers' messages in the order added, then the caller's input."""
        history = [m for m in self._order if m.source_type == CHAT_HISTORY]
        others = [m for m in self._order if m.source_type != CHAT_HISTORY]
        return [*history, *others, *self.input_messages]

    @property
    def response_messages(self) -> list[Message]:
        """The messages the agent produced in this run (empty before or after a failure)."""
        return list(self.response.messages) if self.response is not None else []


class ContextProvider:
    """Base class of context providers. Override :meth:`before_run` and/or :meth:`after_run`.

    ``source_id`` identifies the provider (messages it adds are stamped with it) and is, unless
    ``state_key`` is given, the key of its dict in ``session.state``. The filters choose which
    messages :meth:`search_messages` and :meth:`storable_messages` return: by default a provider
    searches with and stores only ``external`` request messages (so memories never feed back
    into memory) and stores every response message.
    """

    def __init__(
        self,
        source_id: str,
        *,
        state_key: str | None = None,
        search_input_filter: MessageFilter = external_only,
        store_input_filter: MessageFilter = external_only,
        store_response_filter: MessageFilter = all_messages,
    ) -> None:
        if not isinstance(source_id, str) or not source_id.strip():
            raise InvalidInputError(
                f"source_id {source_id!r} is blank; pass a short name such as 'user-preferences'"
            )
        if state_key is not None and (not isinstance(state_key, str) or not state_key.strip()):
            raise InvalidInputError(
                f"state_key {state_key!r} is blank; pass a non-empty string or omit it"
            )
        self.source_id = source_id
        self.state_key: str = state_key or source_id
        self.search_input_filter = search_input_filter
        self.store_input_filter = store_input_filter
        self.store_response_filter = store_response_filter

    async def before_run(
        self,
        *,
        agent: Any,
        session: AgentSession,
        context: SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Called before the model: add instructions, messages or tools to ``context``."""

    async def after_run(
        self,
        *,
        agent: Any,
        session: AgentSession,
        context: SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Called after the model answered (``context.response``) or failed (``context.exception``)."""

    def unit_of_work(self, context: SessionContext) -> AbstractAsyncContextManager[object] | None:
        """What this provider's ``after_run`` writes belong to, or None (the default: nothing).

        After a successful model call the agent enters the unit of work of every provider that
        returns one (in list order), runs every ``after_run``, then leaves the units: normally
        when all succeeded (they commit), with an error when any hook or unit failed (they all
        roll back, and the agent raises :class:`~pgmemory.errors.AfterRunError`). Providers on
        a :class:`~pgmemory.MemoryStore` return ``store.shared_transaction()``, so the
        providers of one store commit a turn together. Entering may do slow work that needs no
        database, such as a model call: no transaction is open until the first write.

        Args:
            context: the run's context, with ``response`` set.

        Returns:
            An async context manager, or None when the provider writes nothing that needs one.
        """
        return None

    # -- helpers for subclasses ------------------------------------------------------------

    def search_messages(self, context: SessionContext) -> list[Message]:
        """The messages to search with: everything sent so far, through ``search_input_filter``
        (by default only the caller's own messages)."""
        return list(self.search_input_filter(context.get_messages(include_input=True)))

    def storable_messages(self, context: SessionContext) -> list[Message]:
        """The messages to store after a run: request messages through ``store_input_filter``,
        then response messages through ``store_response_filter``; empty if the run failed."""
        if context.exception is not None:
            return []
        request = list(self.store_input_filter(context.request_messages))
        response = list(self.store_response_filter(context.response_messages))
        return request + response

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source_id={self.source_id!r})"


__all__ = [
    "CHAT_HISTORY",
    "CONTEXT_PROVIDER",
    "EXTERNAL",
    "ContextProvider",
    "MessageFilter",
    "SessionContext",
]
