"""Chat history persisted in PostgreSQL (table ``pgmemory_chat_messages``): an agent-framework
``HistoryProvider``.

One row per message, in order; a run's messages are appended in the turn's one transaction
(:mod:`~pgmemory.integrations.agent_framework.turn`) and a message id already stored is
skipped, so a retried save never duplicates. The rows are keyed by the session id and the user
id the application binds (``user_id=``). Both are derived on every run and recorded in the
provider's state, so a session restored with ``AgentSession.from_dict()`` - even in a new
process, with a new store object - continues the same history, and a session whose record
names another user or session is refused.

A row holds the framework's ``Message.to_dict()`` plus a ``text`` key for SQL readers and the
audit page. Rows written by pgmemory before 0.3 (its own message format) read back as
framework messages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from agent_framework import (
    AgentSession,
    CompactionProvider,
    Content,
    HistoryProvider,
    Message,
    SessionContext,
)

from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.integrations.agent_framework.binding import (
    UserId,
    bind_state,
    check_user_id,
    provider_state,
    resolve_user_id,
)
from pgmemory.integrations.agent_framework.messages import ATTRIBUTION, CREATED_AT, ensure_identity
from pgmemory.integrations.agent_framework.turn import TurnWriter, after_run_together, check_run
from pgmemory.store.store import MemoryStore
from pgmemory.text.clean import readable_json

#: Where a stored message keeps the attribution it had when it was saved (the framework's
#: ``_attribution`` is left out, so that loading stamps it as this history's).
STORED_ATTRIBUTION = "pgmemory.attribution"
_MESSAGE_KEYS = ("role", "contents", "author_name", "message_id", "additional_properties")


class PostgresHistoryProvider(HistoryProvider, TurnWriter):
    """Chat history in PostgreSQL, one row per message, kept per user and session.

    Every run resolves the bound user id (``user_id=``) and refuses to run without one, so no
    conversation is ever stored under an empty user id that ``erase_user`` could not find. The
    history's keys (session id, user id) are recorded in the provider's state; a run whose
    record differs (another user, another session id) is refused with
    :class:`~pgmemory.errors.ScopeError` before anything is read or written.

    Reduction: the loaded history may be reduced before it reaches the model with the
    framework's ``CompactionProvider(before_strategy=...)`` listed right after this provider
    (``TruncationStrategy``, ``SummarizationStrategy``, ...). Reduction after messages are added
    (``CompactionProvider(after_strategy=..., history_source_id=<this provider>)``) is refused
    with :class:`~pgmemory.errors.InvalidInputError`: the framework's after-run compaction
    rewrites history kept in session state, and what this provider stores is an audit record
    that is never rewritten.

    Args:
        store: the store holding the history.
        source_id: the provider's id (default ``"postgres_history"``), also the key of its
            state in ``session.state``: no other provider of the agent may have it (a run is
            refused with :class:`~pgmemory.errors.InvalidInputError`).
        user_id: the signed-in user's id, or a resolver ``callable(session) -> str`` called on
            every run. Required; there is no fallback.
        load_messages: feed the stored history to the model before each run.
        store_inputs: save the caller's input messages after each run.
        store_outputs: save the agent's response messages after each run.
        store_context_messages: also save the messages other providers added (e.g. recalled
            memories), for audit.
        store_context_from: limit ``store_context_messages`` to these providers' source ids.
        page_size: how many rows each read fetches.

    Raises:
        ScopeError: ``user_id`` is missing or blank.
        InvalidInputError: the store lacks the history methods, or ``page_size`` is below 1.
    """

    def __init__(
        self,
        store: MemoryStore,
        source_id: str = "postgres_history",
        *,
        user_id: UserId,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_outputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: Sequence[str] | None = None,
        page_size: int = 500,
    ) -> None:
        super().__init__(
            source_id,
            load_messages=load_messages,
            store_inputs=store_inputs,
            store_context_messages=store_context_messages,
            store_context_from=set(store_context_from) if store_context_from is not None else None,
            store_outputs=store_outputs,
        )
        for method in ("append_history", "read_history"):
            if not hasattr(store, method):
                raise InvalidInputError(
                    f"store {store!r} has no {method}(); pass a pgmemory MemoryStore"
                )
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise InvalidInputError(f"page_size={page_size!r} must be an integer >= 1")
        self._user_id = check_user_id(user_id)
        self.store = store
        self.page_size = page_size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(source_id={self.source_id!r})"

    # -- keys --------------------------------------------------------------------------------

    def bind(self, session: AgentSession, state: dict[str, Any] | None = None) -> dict[str, str]:
        """The history's keys for ``session``, derived now and recorded in its state.

        Returns:
            ``{"session_id": ..., "user_id": ...}``.

        Raises:
            ScopeError: no user id is bound, or the session's recorded keys differ (another
                user, another session id).
        """
        keys = {
            "session_id": session.session_id,
            "user_id": resolve_user_id(self._user_id, session, self),
        }
        bind_state(provider_state(session, self) if state is None else state, self, keys)
        return keys

    def _key(self, session_id: str | None, state: dict[str, Any] | None) -> tuple[str, str]:
        """(history session id, user id) from the provider's state, as :meth:`bind` recorded it.

        Raises:
            ScopeError: the state holds no keys, or names another session than ``session_id``.
        """
        recorded = state.get("session_id") if state is not None else None
        bound = state.get("user_id") if state is not None else None
        if not isinstance(recorded, str) or not isinstance(bound, str) or not bound:
            raise ScopeError(
                f"{self!r} keeps the history per user: pass the provider state bound by a run "
                "(state=session.state[provider.source_id]), or use provider.messages(session)"
            )
        if session_id and recorded != session_id:
            raise ScopeError(
                f"{self!r}: the state's recorded session id differs from the session id "
                "given; nothing was read or written"
            )
        return recorded, bound

    # -- hooks -------------------------------------------------------------------------------

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Check the run (:func:`~pgmemory.integrations.agent_framework.turn.check_run`), bind
        the history's keys (:meth:`bind`), then load the history."""
        inputs = check_run(self, agent=agent, context=context)
        self._refuse_after_run_compaction(agent)
        self.bind(session, state)
        for message in inputs:
            ensure_identity(message)
        await super().before_run(agent=agent, session=session, context=context, state=state)

    async def after_run(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Save the run, in the turn's one transaction with the other pgmemory providers'
        writes (the framework calls this only after a successful model call)."""
        await after_run_together(self, agent=agent, session=session, context=context, state=state)

    def unit_of_work(self, context: SessionContext) -> AbstractAsyncContextManager[object]:
        """The store's shared transaction: the turn is appended together with the other
        providers' writes to the same store, or not at all."""
        return self.store.shared_transaction(deferred=True)

    async def write_turn(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Bind the keys, then save what the framework's ``HistoryProvider`` chooses to store."""
        self.bind(session, state)
        await super().after_run(agent=agent, session=session, context=context, state=state)

    def _refuse_after_run_compaction(self, agent: Any) -> None:
        for provider in getattr(agent, "context_providers", None) or ():
            if (
                isinstance(provider, CompactionProvider)
                and provider.after_strategy is not None
                and provider.history_source_id == self.source_id
            ):
                raise InvalidInputError(
                    f"{provider.source_id!r} would compact {self.source_id!r} after each run, "
                    "but the PostgreSQL history is an audit record and is never rewritten; use "
                    "CompactionProvider(before_strategy=...) listed after the history provider, "
                    "which reduces what the model is sent"
                )

    # -- storage -----------------------------------------------------------------------------

    async def get_messages(
        self, session_id: str | None, *, state: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Message]:
        """Every stored message of the session, oldest first (read page by page)."""
        history_id, user_id = self._key(session_id, state)
        messages: list[Message] = []
        after = 0
        while True:
            rows = await self.store.read_history(
                history_id, user_id=user_id, after_seq=after, limit=self.page_size
            )
            messages.extend(from_row(row.message) for row in rows)
            if len(rows) < self.page_size:
                return messages
            after = rows[-1].seq

    async def save_messages(
        self,
        session_id: str | None,
        messages: Sequence[Message],
        *,
        state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Append the messages in one transaction (ids already stored are skipped)."""
        if not messages:
            return
        history_id, user_id = self._key(session_id, state)
        await self.store.append_history(history_id, [to_row(m) for m in messages], user_id=user_id)

    # -- conveniences ------------------------------------------------------------------------

    async def messages(self, session: AgentSession) -> list[Message]:
        """The stored history of ``session`` (its keys bound first, see :meth:`bind`)."""
        return await self.get_messages(session.session_id, state=self._bound(session))

    async def clear(self, session: AgentSession) -> int:
        """Erase the stored history of ``session``; returns how many messages were deleted."""
        history_id, user_id = self._key(session.session_id, self._bound(session))
        return int(await self.store.delete_history(history_id, user_id=user_id))

    def _bound(self, session: AgentSession) -> dict[str, Any]:
        self.bind(session)
        return provider_state(session, self)


def to_row(message: Message) -> dict[str, Any]:
    """A framework message as a history row: ``Message.to_dict()`` with an id, a ``text`` key
    for SQL readers, its attribution kept aside (:data:`STORED_ATTRIBUTION`), and its tool
    results as readable UTF-8 JSON (the framework's text of a non-str result is ASCII-escaped:
    :func:`pgmemory.text.clean.readable_json`; rows stored before keep their escaped text,
    the same JSON value)."""
    ensure_identity(message)
    row = message.to_dict()
    row["contents"] = [_readable_result(content) for content in row.get("contents") or ()]
    properties = dict(row.get("additional_properties") or {})
    stamp = properties.pop(ATTRIBUTION, None)
    if stamp is not None:
        properties[STORED_ATTRIBUTION] = stamp
    row["additional_properties"] = properties
    row["text"] = message.text
    return row


def _readable_result(content: Any) -> Any:
    """A content's dict, a function result's text (``result``, its text ``items``) readable."""
    if not isinstance(content, dict) or content.get("type") != "function_result":
        return content
    content = dict(content)
    if isinstance(content.get("result"), str):
        content["result"] = readable_json(content["result"])
    items = content.get("items")
    if isinstance(items, list):
        content["items"] = [
            {**item, "text": readable_json(item["text"])}
            if isinstance(item, dict)
            and item.get("type") == "text"
            and isinstance(item.get("text"), str)
            else item
            for item in items
        ]
    return content


def from_row(row: Mapping[str, Any]) -> Message:
    """A history row as a framework message (rows of pgmemory's own format before 0.3 too)."""
    if row.get("type") == "message":
        return Message.from_dict({k: row[k] for k in ("type", *_MESSAGE_KEYS) if k in row})
    return _from_legacy_row(row)


def _from_legacy_row(row: Mapping[str, Any]) -> Message:
    """A row written by pgmemory's own runtime (before 0.3) as a framework message."""
    contents: list[Content] = []
    for item in row.get("contents") or [{"type": "text", "text": row.get("text") or ""}]:
        kind = item.get("type")
        if kind == "text":
            contents.append(Content.from_text(str(item.get("text", ""))))
        elif kind == "function_call":
            contents.append(
                Content.from_function_call(
                    str(item["call_id"]), str(item["name"]), arguments=item.get("arguments")
                )
            )
        elif kind == "function_result":
            error = item.get("error")
            result = f"Error: {error}" if error is not None else item.get("result")
            contents.append(Content.from_function_result(str(item["call_id"]), result=result))
    metadata = row.get("metadata") or {}
    carried = metadata.get("agent_framework") or {}  # the old integration's extra contents
    contents.extend(Content.from_dict(data) for data in carried.get("contents", ()))
    properties = dict(carried.get("properties") or {})
    if row.get("created_at"):
        properties[CREATED_AT] = row["created_at"]
    return Message(
        str(row["role"]),
        contents,
        author_name=row.get("author_name"),
        message_id=row.get("message_id"),
        additional_properties=properties,
    )


__all__ = ["STORED_ATTRIBUTION", "PostgresHistoryProvider", "from_row", "to_row"]
