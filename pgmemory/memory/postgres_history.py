"""Chat history persisted in PostgreSQL (table ``pgmemory_chat_messages``) through a store.

One row per message, in order; a run's messages are appended in one transaction and a message
id already stored is skipped, so a retried save never duplicates. The rows are keyed by the
session id and the user id the application binds (``session.state["user_id"]``). Both are
derived on every run and recorded in the session's state, so a session restored with
``agent.deserialize_session()`` - even in a new process, with a new store object - continues
the same history, and a session whose record names another user or session is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.memory.binding import bind_state
from pgmemory.runtime.history import HistoryProvider
from pgmemory.runtime.messages import Message
from pgmemory.runtime.reducers import ChatReducer, ReducerTrigger

if TYPE_CHECKING:
    from pgmemory.runtime.providers import SessionContext
    from pgmemory.runtime.session import AgentSession
    from pgmemory.store.store import MemoryStore


class PostgresHistoryProvider(HistoryProvider):
    """A history provider on :class:`pgmemory.store.store.MemoryStore`.

    The history is kept per user: every run reads the user id the application bound to the
    session (``session.state[user_id_key]``, set from its authentication) and refuses to run
    without one, so no conversation is ever stored under an empty user id that
    ``erase_user`` could not find. The history's keys (session id, user id) are recorded in
    the session's state; a run whose record differs (another user, another session id) is
    refused with :class:`~pgmemory.errors.ScopeError` before anything is read or written.

    Args:
        store: the store holding the history.
        user_id_key: the entry of ``session.state`` holding the caller's user id (default
            ``"user_id"``). ``None`` declares a single-tenant application: rows are then kept
            without a user, keyed by the session id alone, and whoever knows a session id
            reads its history.
        page_size: how many rows each read fetches.
        **others: as for :class:`~pgmemory.runtime.history.HistoryProvider`; ``source_id``
            defaults to ``"postgres_history"``.

    Raises:
        InvalidInputError: the store lacks the history methods, ``page_size`` is below 1, or
            a reducer would run ``after_messages_added`` (the stored history is an audit
            record and is never rewritten).
    """

    def __init__(
        self,
        store: MemoryStore,
        source_id: str = "postgres_history",
        *,
        load_messages: bool = True,
        store_inputs: bool = True,
        store_outputs: bool = True,
        store_context_messages: bool = False,
        store_context_from: Sequence[str] | None = None,
        reducer: ChatReducer | None = None,
        reducer_trigger: ReducerTrigger = "before_messages_retrieved",
        user_id_key: str | None = "user_id",
        page_size: int = 500,
        state_key: str | None = None,
    ) -> None:
        super().__init__(
            source_id,
            load_messages=load_messages,
            store_inputs=store_inputs,
            store_outputs=store_outputs,
            store_context_messages=store_context_messages,
            store_context_from=store_context_from,
            reducer=reducer,
            reducer_trigger=reducer_trigger,
            state_key=state_key,
        )
        for method in ("append_history", "read_history"):
            if not hasattr(store, method):
                raise InvalidInputError(
                    f"store {store!r} has no {method}(); pass a pgmemory MemoryStore"
                )
        if not isinstance(page_size, int) or page_size < 1:
            raise InvalidInputError(f"page_size={page_size!r} must be an integer >= 1")
        if user_id_key is not None and (not isinstance(user_id_key, str) or not user_id_key):
            raise InvalidInputError(
                "user_id_key must name the session.state entry holding the user id, or be None "
                "for a single-tenant application"
            )
        self.store = store
        self.user_id_key = user_id_key
        self.page_size = page_size

    # -- keys --------------------------------------------------------------------------------

    def bind(self, session: AgentSession) -> dict[str, str]:
        """The history's keys for ``session``, derived now and recorded in its state.

        Returns:
            ``{"session_id": ..., "user_id": ...}`` (no ``user_id`` when ``user_id_key`` is
            None).

        Raises:
            ScopeError: the application bound no user id (``user_id_key`` set), or the
                session's recorded keys differ (another user, another session id).
            InvalidInputError: the bound user id is not a string.
        """
        keys = {"session_id": session.session_id}
        if self.user_id_key is not None:
            user_id = session.state.get(self.user_id_key)
            if user_id is not None and not isinstance(user_id, str):
                raise InvalidInputError(
                    f"{self!r}: session.state[{self.user_id_key!r}] is of type "
                    f"{type(user_id).__name__}; a user id must be a string"
                )
            if not user_id or not user_id.strip():
                raise ScopeError(
                    f"{self!r} keeps the history per user, but session.state"
                    f"[{self.user_id_key!r}] holds no user id; set it from the application's "
                    "authentication before every run (or construct the provider with "
                    "user_id_key=None for a single-tenant application)"
                )
            keys["user_id"] = user_id
        bind_state(session.state, self, keys)
        return keys

    def _key(self, session_id: str | None, state: dict[str, Any] | None) -> tuple[str, str]:
        """(history session id, user id) from the provider's state, as :meth:`bind` recorded it.

        Raises:
            ScopeError: the state holds no keys while the history is kept per user, or names
                another session than ``session_id``.
        """
        recorded: str | None = state.get("session_id") if state is not None else None
        if self.user_id_key is None:
            history_id = recorded or session_id
            if not history_id:
                raise InvalidInputError(f"{self!r} needs a session id or the session's state")
            user_id = ""
        else:
            bound = state.get("user_id") if state is not None else None
            if not recorded or not isinstance(bound, str) or not bound:
                raise ScopeError(
                    f"{self!r} keeps the history per user: pass the session's state as bound "
                    "by a run (state=session.state[provider.state_key]), or use "
                    "provider.messages(session)"
                )
            history_id, user_id = recorded, bound
        if session_id and str(history_id) != session_id:
            raise ScopeError(
                f"{self!r}: the state's recorded session id differs from the session id "
                "given; nothing was read or written"
            )
        return str(history_id), user_id

    def unit_of_work(self, context: SessionContext) -> AbstractAsyncContextManager[object]:
        """The store's shared transaction: the turn is appended together with the other
        providers' writes to the same store, or not at all."""
        return self.store.shared_transaction()

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: Any, state: dict[str, Any]
    ) -> None:
        """Bind the history's keys (:meth:`bind`), then load the history (see the base class)."""
        self.bind(session)
        await super().before_run(agent=agent, session=session, context=context, state=state)

    async def after_run(
        self, *, agent: Any, session: AgentSession, context: Any, state: dict[str, Any]
    ) -> None:
        """Bind the history's keys (:meth:`bind`), then save the run (see the base class)."""
        self.bind(session)
        await super().after_run(agent=agent, session=session, context=context, state=state)

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
            messages.extend(Message.from_dict(row.message) for row in rows)
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
        await self.store.append_history(
            history_id, [m.to_dict() for m in messages], user_id=user_id
        )

    # -- conveniences ------------------------------------------------------------------------

    async def messages(self, session: AgentSession) -> list[Message]:
        """The stored history of ``session`` (its keys bound first, see :meth:`bind`)."""
        return await self.get_messages(session.session_id, state=self.bind(session))

    async def clear(self, session: AgentSession) -> int:
        """Erase the stored history of ``session``; returns how many messages were deleted."""
        history_id, user_id = self._key(session.session_id, self.bind(session))
        return int(await self.store.delete_history(history_id, user_id=user_id))


__all__ = ["PostgresHistoryProvider"]
