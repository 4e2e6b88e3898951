"""The chat-history memory provider: every turn stored with embeddings, recalled by scope.

After each successful run the provider stores the run's request messages (default: the
caller's own) and response messages in PostgreSQL, in one transaction, tagged with the
session's *storage scope*. Before each run (``before_ai_invoke``) it recalls memories of the
*search scope* and injects them as one extra user message; or (``on_demand_function_calling``)
it gives the model a ``Search`` tool instead.

Beyond plain similarity (which cannot find "the last order" from "order me a meal"), recall
by default also ranks by keywords and recency and always shows the most recent messages of
the search scope, labelled with their time, so "different from last time" can be honoured.

The scopes are derived from what the application binds (the state initializer) on every run;
a session whose recorded scopes differ is refused (:mod:`pgmemory.memory.binding`). The
provider creates its collection on first use, with the store's embedder's size and model.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Annotated, Any

from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.memory.binding import bind_state
from pgmemory.memory.chat_history_options import (
    DEFAULT_TOOL_DESCRIPTION,
    ChatHistoryMemoryProviderOptions,
    redact_all,
)
from pgmemory.memory.rendering import DEFAULT_CONTEXT_PROMPT, FittedRecall, fit_recall, render
from pgmemory.runtime.messages import Message
from pgmemory.runtime.providers import ContextProvider, SessionContext
from pgmemory.runtime.session import AgentSession
from pgmemory.runtime.tools import Tool, tool
from pgmemory.store.records import CollectionInfo, Memory, MemoryRecord, MemoryScope, RecallTrace
from pgmemory.store.store import MemoryStore
from pgmemory.text.terms import terms

logger = logging.getLogger(__name__)


class ChatHistoryMemoryProvider(ContextProvider):
    """Stores every turn in PostgreSQL with embeddings and recalls related ones by scope.

    Security: recalled memories are untrusted text placed in the model's context (they are
    quoted and labelled as data); stored messages are personal data (erase them with
    ``store.delete(collection, scope=...)``); the on-demand query is model-generated and only
    ever used as a parameter. Logs carry counts at INFO and redacted detail at DEBUG.

    Args:
        store: the store holding the memories.
        collection_name: the collection they are stored in; created on first use (with the
            store's embedder's size and model) when it does not exist.
        state_initializer: ``state_initializer(session)`` returns a
            :class:`ChatHistoryMemoryProvider.State` (storage scope, and a search scope that
            defaults to it) from what the application bound to the session, e.g. the user id
            it set in ``session.state["user_id"]`` from its authentication (fail clearly when
            it is missing). It runs on every run: the scopes are never taken from the session
            dict, which may come back from a client. The result is recorded, JSON-native, in
            ``session.state`` under the provider's state key; a session whose record differs
            is refused with :class:`~pgmemory.errors.ScopeError` before anything is read or
            written.
        options: every other setting
            (:class:`~pgmemory.memory.chat_history_options.ChatHistoryMemoryProviderOptions`).
        source_id: the provider's id (default: the class name); also the state key unless
            ``options.state_key`` is set.

    Raises:
        InvalidInputError: ``state_initializer`` is not callable.
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
            """JSON-native form, as kept in ``session.state``."""
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
        state_initializer: Callable[[AgentSession], ChatHistoryMemoryProvider.State],
        options: ChatHistoryMemoryProviderOptions | None = None,
        source_id: str | None = None,
    ) -> None:
        options = options or ChatHistoryMemoryProviderOptions()
        super().__init__(
            source_id or type(self).__name__,
            # A second instance in one agent needs only its own source_id.
            state_key=options.state_key or source_id or type(self).__name__,
            search_input_filter=options.search_input_message_filter,
            store_input_filter=options.storage_input_message_filter,
            store_response_filter=options.storage_output_message_filter,
        )
        if not callable(state_initializer):
            raise InvalidInputError(
                f"state_initializer is {state_initializer!r}; pass a callable(session) -> "
                "ChatHistoryMemoryProvider.State"
            )
        self.store = store
        self.collection_name = collection_name
        self.options = options
        self._state_initializer = state_initializer
        #: The collection's catalogue entry once this provider made sure it exists.
        self._collection: CollectionInfo | None = None

    # --- state -----------------------------------------------------------------------------

    def get_state(self, session: AgentSession, state: dict[str, Any] | None = None) -> State:
        """The session's scopes, derived now from what the application binds, and recorded.

        Args:
            session: the session; the scopes are recorded in ``session.state[self.state_key]``.
            state: not read (the scopes are derived, never read back); accepted for callers of
                the two-argument form.

        Raises:
            InvalidInputError: the state initializer returned something other than a State.
            ScopeError: the storage scope sets no dimension; the search scope sets none and
                ``allow_unscoped_search`` is off; or the session's recorded scopes differ from
                the derived ones.
        """
        derived = self._derived_state(session)
        bind_state(session.state, self, derived)
        return self.State.from_dict(derived)

    def _derived_state(self, session: AgentSession) -> dict[str, Any]:
        """The state initializer's scopes for the session, checked, JSON-native."""
        value = self._state_initializer(session)
        if not isinstance(value, self.State):
            raise InvalidInputError(
                f"state_initializer returned a {type(value).__name__}; return "
                "ChatHistoryMemoryProvider.State(storage_scope=..., search_scope=...)"
            )
        if value.storage_scope.is_empty:
            raise ScopeError(
                "the storage scope sets no dimension: tag memories with at least a user_id or "
                "session_id in the state initializer"
            )
        if value.effective_search_scope.is_empty and not self.options.allow_unscoped_search:
            raise ScopeError(
                "the search scope sets no dimension, so recall would search everybody's "
                "memories; set user_id (or another id), or pass "
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
            # catalogue reads the new entry back on another connection).
            creation = self.store.create_collection(self.collection_name)
            self._collection = await asyncio.create_task(creation, context=contextvars.Context())
        return self._collection

    # --- hooks -----------------------------------------------------------------------------

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Recall now (``before_ai_invoke``) or add the search tool (on demand)."""
        scopes = self.get_state(session)
        await self.collection()
        if self.options.search_time == "on_demand_function_calling":
            context.extend_tools(self, self._search_tool(scopes, session))
            return
        # The store cleans and truncates a query as it does stored text: no message is too long
        # or too odd to recall with.
        query = "\n".join(m.text for m in self.search_messages(context) if m.text.strip()).strip()
        shown = await self._recall(
            scopes, session, query or None, heading=self.options.context_prompt
        )
        if not shown.memories and not shown.recent:
            return
        recalled = [m for m, _ in shown.memories] + shown.recent
        origins = sorted(
            {
                m.scope.session_id
                for m in recalled
                if m.scope.session_id and m.scope.session_id != session.session_id
            }
        )
        message = Message(
            "user",
            shown.text,
            origin_session_ids=origins,
            metadata={"pgmemory.memory_ids": [str(m.id) for m in recalled]},
        )
        context.extend_messages(self, message)

    async def after_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Store the run's messages in one transaction (nothing when the run failed)."""
        if context.exception is not None:
            return
        scopes = self.get_state(session)
        await self.collection()
        limit = self.store.settings.max_text_chars
        storable = self.storable_messages(context)
        # The on-demand Search tool's calls and results are recalled memories: storing them
        # would feed memory back into memory (and copy other scopes' rows into this one).
        own_calls = (
            {
                call.call_id
                for message in storable
                for call in message.function_calls
                if call.name == self.options.function_tool_name
            }
            if self.options.search_time == "on_demand_function_calling"
            else set()
        )
        records = []
        for message in storable:
            content = render(message, skip_call_ids=own_calls)
            if not content.strip():
                continue
            if len(content) > limit:
                content = content[: limit - 1] + "…"
            records.append(
                MemoryRecord(
                    content=content,
                    scope=scopes.storage_scope,
                    role=message.role,
                    author_name=message.author_name,
                    message_id=message.message_id,
                    source_type=message.source_type,
                    source_id=message.source_id,
                    created_at=message.created_at,
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

    def unit_of_work(self, context: SessionContext) -> AbstractAsyncContextManager[object]:
        """The store's shared transaction: the turn is stored together with the other
        providers' writes to the same store, or not at all."""
        return self.store.shared_transaction()

    # --- recall ----------------------------------------------------------------------------

    async def _recall(
        self, scopes: State, session: AgentSession, query: str | None, *, heading: str | None
    ) -> FittedRecall:
        """Similar memories (with scores) and the most recent ones, deduplicated, fitted to
        ``max_context_tokens`` under ``heading``; what is shown is audited."""
        scope = scopes.effective_search_scope
        opts = self.options
        allow = opts.allow_unscoped_search
        recent = await self._recent_turns(scope) if opts.recent_turns else []
        memories: list[tuple[Memory, float]] = []
        if query:
            shown = {m.id for m in recent}
            kept_terms: list[set[str]] = [set(terms(m.content)) for m in recent]
            # Over-fetch, then drop what is already shown and near-duplicates (a user who says
            # the same thing every session would otherwise fill every slot); fetch more while
            # duplicates crowd out the results.
            fetch = (opts.max_results + len(recent)) * 4
            seen: set[object] = set()
            while True:
                hits = await self.store.search(
                    self.collection_name,
                    scope,
                    query=query,
                    limit=fetch,
                    mode=opts.recall_mode,
                    weights=opts.weights,
                    allow_unscoped=allow,
                    audit=False,
                )
                for hit in hits:
                    if hit.memory.id in shown or hit.memory.id in seen:
                        continue
                    seen.add(hit.memory.id)
                    candidate = set(terms(hit.memory.content))
                    threshold = opts.near_duplicate_threshold
                    if any(_overlap(candidate, other) >= threshold for other in kept_terms):
                        continue
                    memories.append((hit.memory, hit.score))
                    kept_terms.append(candidate)
                    if len(memories) == opts.max_results:
                        break
                if len(memories) == opts.max_results or len(hits) < fetch or fetch >= 400:
                    break
                fetch *= 4
        # What does not fit the budget is not shown, so neither audited nor logged as recalled.
        fitted = fit_recall(memories, recent, heading=heading, max_tokens=opts.max_context_tokens)
        memories, recent = fitted.memories, fitted.recent
        sensitive = opts.enable_sensitive_telemetry_data
        await self.store.record_recall(
            self.collection_name,
            scope,
            memory_ids=[m.id for m, _ in memories] + [r.id for r in recent],
            scores=[s for _, s in memories] + [0.0] * len(recent),
            query=query,
            trace=RecallTrace(
                provider=self.source_id,
                mode=opts.search_time,
                session_id=session.session_id or "",
                include_query_text=sensitive,
            ),
        )
        logger.info(
            "%s recalled %d memories and %d recent messages for %s",
            self.source_id,
            len(memories),
            len(recent),
            self._loggable(scope.user_id or ""),
        )
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s query=%s results=%s recent=%s",
                self.source_id,
                self._loggable(query or ""),
                [self._loggable(m.content) for m, _ in memories],
                [self._loggable(m.content) for m in recent],
            )
        return fitted

    async def _recent_turns(self, scope: MemoryScope) -> list[Memory]:
        """The stored messages of the newest ``recent_turns`` turns of the scope, oldest first."""
        wanted = self.options.recent_turns
        page_size = 50
        rows: list[Memory] = []
        users = offset = 0
        while users < wanted:
            page = await self.store.list(
                self.collection_name,
                scope,
                limit=page_size,
                offset=offset,
                allow_unscoped=self.options.allow_unscoped_search,
            )
            for memory in page:
                rows.append(memory)
                if memory.role == "user":
                    users += 1
                    if users == wanted:
                        break
            # A turn of more than a page of tool calls is cut: recall must stay bounded.
            if len(page) < page_size or len(rows) >= page_size * wanted:
                break
            offset += page_size
        return rows[::-1]

    def _search_tool(self, scopes: State, session: AgentSession) -> Tool:
        """The on-demand tool, bound to this session's scopes for this run."""

        async def search(
            userQuestion: Annotated[str, "The question to search previous chat history for."],
        ) -> str:
            # The question is model-generated: it is only ever a bound parameter and embedded text.
            question = userQuestion.strip()
            shown = await self._recall(scopes, session, question or None, heading=None)
            if not shown.memories and not shown.recent:
                return "No related memories found."
            return shown.text

        return tool(
            search,
            name=self.options.function_tool_name,
            description=self.options.function_tool_description,
        )

    def _loggable(self, value: str) -> str:
        return (
            value if self.options.enable_sensitive_telemetry_data else self.options.redactor(value)
        )


def _overlap(a: set[str], b: set[str]) -> float:
    if not a or not b:
        return 1.0 if a == b else 0.0
    return len(a & b) / len(a | b)


__all__ = [
    "DEFAULT_CONTEXT_PROMPT",
    "DEFAULT_TOOL_DESCRIPTION",
    "ChatHistoryMemoryProvider",
    "ChatHistoryMemoryProviderOptions",
    "redact_all",
    "render",
]
