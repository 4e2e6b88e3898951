"""The chat-history memory provider: every turn stored with embeddings, recalled by scope.

An agent-framework ``ContextProvider``. After each successful run it stores the run's request
messages (default: the caller's own) and response messages in PostgreSQL, in the turn's one
transaction (:mod:`pgmemory.integrations.agent_framework.turn`), tagged with the session's
*storage scope*. Before each run (``before_ai_invoke``) it recalls memories of the *search
scope* and injects them as one extra user message; or (``on_demand_function_calling``) it
gives the model a ``Search`` tool instead.

Beyond plain similarity (which cannot find "the last order" from "order me a meal"), recall
by default also ranks by keywords and recency and always shows the most recent messages of
the search scope, labelled with their time, so "different from last time" can be honoured.
Tool calls and tool results are stored (tagged) but not recalled unless
``include_tools_in_recall`` is set.

The scopes are derived from the bound user id on every run and recorded in the provider's
state; a session whose record differs is refused (:mod:`~pgmemory.integrations.agent_framework.binding`).
The provider creates its collection on first use, with the store's embedder's size and model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Annotated, Any

from agent_framework import AgentSession, ContextProvider, FunctionTool, Message, SessionContext

import pgmemory.telemetry as telemetry
from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.integrations.agent_framework.binding import (
    UserId,
    bind_state,
    check_callable,
    check_user_id,
    provider_state,
    resolve_user_id,
)
from pgmemory.integrations.agent_framework.chat_history_options import (
    DEFAULT_TOOL_DESCRIPTION,
    ChatHistoryMemoryProviderOptions,
    redact_all,
)
from pgmemory.integrations.agent_framework.messages import (
    MEMORY_IDS,
    created_at,
    ensure_identity,
    history_sources,
    source_id_of,
    source_type_of,
)
from pgmemory.integrations.agent_framework.rendering import (
    DEFAULT_CONTEXT_PROMPT,
    TOOL_KIND,
    render,
    tool_kind,
)
from pgmemory.integrations.agent_framework.turn import TurnWriter, after_run_together, check_run
from pgmemory.store.records import CollectionInfo, MemoryRecord, MemoryScope, Recall, RecallTrace
from pgmemory.store.requests import RecallRequest
from pgmemory.store.store import MemoryStore

logger = logging.getLogger(__name__)


class ChatHistoryMemoryProvider(ContextProvider, TurnWriter):
    """Stores every turn in PostgreSQL with embeddings and recalls related ones by scope.

    Security: recalled memories are untrusted text placed in the model's context (they are
    quoted and labelled as data); stored messages are personal data (erase them with
    ``store.delete(collection, scope=...)``); the on-demand query is model-generated and only
    ever used as a parameter. Logs carry counts at INFO and redacted detail at DEBUG.

    Args:
        store: the store holding the memories.
        collection_name: the collection they are stored in; created on first use (with the
            store's embedder's size and model) when it does not exist.
        user_id: the signed-in user's id, or a resolver ``callable(session) -> str`` called on
            every run (e.g. reading the application's request context). Required: there is no
            fallback, and nothing is taken from the session dict a client may send back.
        scopes: optional ``callable(user_id, session) -> ChatHistoryMemoryProvider.State`` for
            other scopes than the default (store per user and session, search per user). Its
            storage scope must carry the bound user id, and so must its search scope unless
            ``options.allow_unscoped_search`` is set.
        options: every other setting (:class:`~pgmemory.ChatHistoryMemoryProviderOptions`).
        source_id: the provider's id (default: the class name), also the key of its state in
            ``session.state``; a second instance in one agent needs only its own (a run whose
            agent has two providers with one is refused: ``InvalidInputError``).

    Raises:
        ScopeError: ``user_id`` is missing or blank.
        InvalidInputError: ``scopes`` is not callable.
    """

    @dataclass(frozen=True)
    class State:
        """Where new memories are written, and where recall looks."""

        storage_scope: MemoryScope
        search_scope: MemoryScope | None = None

        @property
        def effective_search_scope(self) -> MemoryScope:
            """The search scope, or the storage scope when none was given."""
            return self.search_scope if self.search_scope is not None else self.storage_scope

        def to_dict(self) -> dict[str, Any]:
            """JSON-native form, as recorded in the provider's state."""
            return {
                "storage_scope": self.storage_scope.to_dict(),
                "search_scope": None if self.search_scope is None else self.search_scope.to_dict(),
            }

        @classmethod
        def from_dict(cls, data: dict[str, Any]) -> ChatHistoryMemoryProvider.State:
            """Inverse of :meth:`to_dict`."""
            search = data.get("search_scope")
            return cls(
                storage_scope=MemoryScope.from_dict(data["storage_scope"]),
                search_scope=None if search is None else MemoryScope.from_dict(search),
            )

    def __init__(
        self,
        store: MemoryStore,
        collection_name: str,
        *,
        user_id: UserId,
        scopes: Callable[[str, AgentSession], ChatHistoryMemoryProvider.State] | None = None,
        options: ChatHistoryMemoryProviderOptions | None = None,
        source_id: str | None = None,
    ) -> None:
        super().__init__(source_id or type(self).__name__)
        self._user_id = check_user_id(user_id)
        check_callable(
            scopes, "scopes", "a callable(user_id, session) -> ChatHistoryMemoryProvider.State"
        )
        if options is not None and not isinstance(options, ChatHistoryMemoryProviderOptions):
            raise InvalidInputError(
                f"options is a {type(options).__name__}; pass ChatHistoryMemoryProviderOptions(...)"
            )
        self.store = store
        self.collection_name = collection_name
        self.options = options or ChatHistoryMemoryProviderOptions()
        self._scopes = scopes
        #: The collection's catalogue entry once this provider made sure it exists.
        self._collection: CollectionInfo | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source_id={self.source_id!r})"

    # --- state -----------------------------------------------------------------------------

    def get_state(self, session: AgentSession, state: dict[str, Any] | None = None) -> State:
        """The session's scopes, derived now from the bound user id, and recorded.

        Args:
            session: the session.
            state: the provider-scoped state (the hooks' ``state``; default: the session's
                entry under :attr:`source_id`). Only compared and recorded, never trusted.

        Raises:
            ScopeError: no user id is bound, the scopes do not carry it, the search scope sets
                no dimension and ``allow_unscoped_search`` is off, or the session's recorded
                scopes differ from the derived ones.
        """
        derived = self._derived_state(session)
        bind_state(provider_state(session, self) if state is None else state, self, derived)
        return self.State.from_dict(derived)

    def _derived_state(self, session: AgentSession) -> dict[str, Any]:
        """The session's scopes from the bound user id, checked, JSON-native."""
        user = resolve_user_id(self._user_id, session, self)
        if self._scopes is None:
            value = self.State(
                storage_scope=MemoryScope(user_id=user, session_id=session.session_id),
                search_scope=MemoryScope(user_id=user),
            )
        else:
            value = self._scopes(user, session)
            if not isinstance(value, self.State):
                raise InvalidInputError(
                    f"scopes returned a {type(value).__name__}; return "
                    "ChatHistoryMemoryProvider.State(storage_scope=..., search_scope=...)"
                )
        if value.storage_scope.user_id != user:
            raise ScopeError(
                f"{self!r}: the storage scope from scopes() does not carry the bound user id; "
                "set MemoryScope(user_id=user_id, ...) from the user_id argument it receives"
            )
        search = value.effective_search_scope
        if search.user_id != user and not self.options.allow_unscoped_search:
            raise ScopeError(
                f"{self!r}: the search scope from scopes() does not carry the bound user id, so "
                "recall would read other users' memories; set its user_id, or pass "
                "ChatHistoryMemoryProviderOptions(allow_unscoped_search=True)"
            )
        return value.to_dict()

    async def collection(self) -> CollectionInfo:
        """The provider's collection, created if missing (once per provider instance, with the
        store's embedder's size and model).

        Raises:
            CollectionError: the collection exists with another size or model than the
                store's embedder's.
        """
        if self._collection is None:
            # In a task of its own, with a context of its own, so that the creation commits at
            # once even when called inside a shared transaction (which it must not join: the
            # catalogue reads the new entry back on another connection); in the caller's trace.
            name = self.collection_name
            self._collection = await telemetry.apart(lambda: self.store.create_collection(name))
        return self._collection

    # --- hooks -----------------------------------------------------------------------------

    def search_messages(self, context: SessionContext) -> list[Message]:
        """The messages to search with: everything sent so far, through
        ``options.search_input_message_filter`` (default: the caller's own)."""
        chosen = self.options.search_input_message_filter(context.get_messages(include_input=True))
        return list(chosen)

    def storable_messages(self, context: SessionContext) -> list[Message]:
        """The messages to store: the request (loaded history, other providers' messages, the
        caller's input) through ``storage_input_message_filter``, then the response through
        ``storage_output_message_filter``; never this provider's own injected recall."""
        request = [
            m for m in context.get_messages(include_input=True) if source_id_of(m) != self.source_id
        ]
        response = list(context.response.messages) if context.response is not None else []
        return [
            *self.options.storage_input_message_filter(request),
            *self.options.storage_output_message_filter(response),
        ]

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Check the run (:func:`~pgmemory.integrations.agent_framework.turn.check_run`), then
        recall now (``before_ai_invoke``) or add the search tool (on demand)."""
        inputs = check_run(self, agent=agent, context=context)
        scopes = self.get_state(session, state)
        for message in inputs:
            ensure_identity(message)
        await self.collection()
        # What the model is sent anyway (the session's history, the input): never recalled.
        in_context = [
            m.message_id for m in context.get_messages(include_input=True) if m.message_id
        ]
        if self.options.search_time == "on_demand_function_calling":
            context.extend_tools(self.source_id, [self._search_tool(scopes, session, in_context)])
            return
        # The store cleans and truncates a query as it does stored text: no message is too long
        # or too odd to recall with.
        query = "\n".join(m.text for m in self.search_messages(context) if m.text.strip()).strip()
        scope = scopes.effective_search_scope
        shown = await self.store.recall(
            self.collection_name,
            scope,
            self._recall_request(
                session, query=query or None, heading=self.options.context_prompt, seen=in_context
            ),
        )
        self._log_recall(scope, query, shown)
        if not shown.items:
            return
        recalled = shown.memories
        origins = sorted(
            {
                m.scope.session_id
                for m in recalled
                if m.scope.session_id and m.scope.session_id != session.session_id
            }
        )
        message = Message(
            "user",
            [shown.text],
            additional_properties={MEMORY_IDS: [str(m.id) for m in recalled]},
        )
        context.extend_messages(self, [message], origin_session_ids=origins or None)

    async def after_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Store the run's messages, in the turn's one transaction with the other pgmemory
        providers' writes (the framework calls this only after a successful model call)."""
        await after_run_together(self, agent=agent, session=session, context=context, state=state)

    def unit_of_work(self, context: SessionContext) -> AbstractAsyncContextManager[object]:
        """The store's shared transaction: the turn is stored together with the other
        providers' writes to the same store, or not at all."""
        return self.store.shared_transaction(deferred=True)

    async def write_turn(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Store the run's messages (see :meth:`storable_messages`) under the storage scope."""
        scopes = self.get_state(session, state)
        await self.collection()
        limit = self.store.settings.max_text_chars
        storable = self.storable_messages(context)
        histories = history_sources(agent)
        # The on-demand Search tool's calls and results are recalled memories: storing them
        # would feed memory back into memory (and copy other scopes' rows into this one).
        own_calls = (
            {
                content.call_id
                for message in storable
                for content in message.contents
                if content.type == "function_call"
                and content.name == self.options.function_tool_name
                and content.call_id
            }
            if self.options.search_time == "on_demand_function_calling"
            else set()
        )
        records = []
        for message in storable:
            kind = tool_kind(message)
            if kind is not None and not self.options.store_tool_messages:
                continue
            content = render(message, skip_call_ids=own_calls)
            if not content.strip():
                continue
            if len(content) > limit:
                content = content[: limit - 1] + "…"
            ensure_identity(message)
            records.append(
                MemoryRecord(
                    content=content,
                    scope=scopes.storage_scope,
                    role=str(message.role),
                    author_name=message.author_name,
                    message_id=message.message_id,
                    source_type=source_type_of(message, histories),
                    source_id=source_id_of(message),
                    created_at=created_at(message),
                    metadata={TOOL_KIND: kind} if kind else {},
                )
            )
        if records:
            await self.store.add(self.collection_name, records, actor=self.source_id)
        logger.info(
            "%s stored %d messages for %s",
            self.source_id,
            len(records),
            self._loggable(scopes.storage_scope.user_id or ""),
        )

    # --- recall ----------------------------------------------------------------------------

    def _recall_request(
        self,
        session: AgentSession,
        *,
        query: str | None,
        heading: str | None,
        seen: Sequence[str],
    ) -> RecallRequest:
        """The store's one-statement recall (:meth:`MemoryStore.recall
        <pgmemory.store.store.MemoryStore.recall>`) as this provider's options choose it
        (:meth:`ChatHistoryMemoryProviderOptions.recall_request`), traced to this provider and
        ``session``; ``seen``: the message ids the model is sent anyway. The hook awaits the
        store's recall itself: no frame of the provider's between its hook and the store."""
        return self.options.recall_request(
            query=query,
            heading=heading,
            trace=RecallTrace(
                provider=self.source_id,
                session_id=session.session_id or "",
                include_query_text=self.options.enable_sensitive_telemetry_data,
            ),
            exclude_message_ids=seen,
        )

    def _log_recall(self, scope: MemoryScope, query: str | None, shown: Recall) -> None:
        """Log what a recall showed (ids and counts; texts only at DEBUG, through the
        provider's redaction)."""
        logger.info(
            "%s recalled %d memories (%d recent) for %s",
            self.source_id,
            len(shown.items),
            sum(item.reason == "recent" for item in shown.items),
            self._loggable(scope.user_id or ""),
        )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s query=%s shown=%s",
                self.source_id,
                self._loggable(query or ""),
                [(item.reason, self._loggable(item.memory.content)) for item in shown.items],
            )

    def _search_tool(
        self, scopes: State, session: AgentSession, seen: Sequence[str]
    ) -> FunctionTool:
        """The on-demand tool, bound to this session's scopes for this run (``seen``: the
        message ids the model is sent anyway)."""

        async def search(
            userQuestion: Annotated[str, "The question to search previous chat history for."],
        ) -> str:
            # The question is model-generated: it is only ever a bound parameter and embedded text.
            question = userQuestion.strip()
            scope = scopes.effective_search_scope
            shown = await self.store.recall(
                self.collection_name,
                scope,
                self._recall_request(session, query=question or None, heading=None, seen=seen),
            )
            self._log_recall(scope, question, shown)
            if not shown.items:
                return "No related memories found."
            return shown.text

        return FunctionTool(
            name=self.options.function_tool_name,
            description=self.options.function_tool_description,
            func=search,
        )

    def _loggable(self, value: str) -> str:
        return (
            value if self.options.enable_sensitive_telemetry_data else self.options.redactor(value)
        )


__all__ = [
    "DEFAULT_CONTEXT_PROMPT",
    "DEFAULT_TOOL_DESCRIPTION",
    "ChatHistoryMemoryProvider",
    "ChatHistoryMemoryProviderOptions",
    "redact_all",
]
