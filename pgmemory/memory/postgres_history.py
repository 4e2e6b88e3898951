"""Chat history persisted in PostgreSQL (table ``pgmemory_chat_messages``) through a store.

One row per message, in order; a run's messages are appended in one transaction and a message
id already stored is skipped, so a retried save never duplicates. The rows are keyed by the
session id (and the caller's ``user_id``) recorded in the session's state on first use, so a
session restored with ``agent.deserialize_session()`` - even in a new process, with a new store
object - continues the same history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.history import HistoryProvider
from pgmemory.runtime.messages import Message
from pgmemory.runtime.reducers import ChatReducer, ReducerTrigger
from pgmemory.runtime.session import ProviderSessionState

if TYPE_CHECKING:
    from pgmemory.runtime.session import AgentSession
    from pgmemory.store.store import MemoryStore


class PostgresHistoryProvider(HistoryProvider):
    """A history provider on :class:`pgmemory.store.store.MemoryStore`.

    The history's keys (session id, user id) are recorded in the session's state on first
    use, through a :class:`~pgmemory.runtime.session.ProviderSessionState`.

    Args:
        store: the store holding the history.
        user_id_key: the entry of ``session.state`` holding the caller's user id (default
            ``"user_id"``; rows are then kept per user, which deletion and distribution by
            user rely on); ``None`` keeps rows without a user.
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
        self.store = store
        self.user_id_key = user_id_key
        self.page_size = page_size
        self._keys: ProviderSessionState[dict[str, str]] = ProviderSessionState(
            self._initial_keys, state_key=self.state_key, state_type=dict[str, str]
        )

    # -- keys --------------------------------------------------------------------------------

    def _key(self, session_id: str | None, state: dict[str, Any] | None) -> tuple[str, str]:
        """(history session id, user id), read from the provider's state, recorded on first use."""
        if state is None:
            if not session_id:
                raise InvalidInputError(
                    "PostgresHistoryProvider needs a session id or its session state"
                )
            return session_id, ""
        if "session_id" not in state:
            if not session_id:
                raise InvalidInputError("PostgresHistoryProvider needs a session id on first use")
            state["session_id"] = session_id
        return str(state["session_id"]), str(state.get("user_id", ""))

    def _initial_keys(self, session: AgentSession) -> dict[str, str]:
        """The keys recorded on first use: the caller's user id (if kept), the session id."""
        keys: dict[str, str] = {}
        if self.user_id_key is not None:
            user_id = session.state.get(self.user_id_key, "")
            if user_id is None:
                user_id = ""
            if not isinstance(user_id, str):
                raise InvalidInputError(
                    f"session.state[{self.user_id_key!r}] is {user_id!r}; a user id must be a string"
                )
            keys["user_id"] = user_id
        keys["session_id"] = session.session_id
        return keys

    async def before_run(
        self, *, agent: Any, session: AgentSession, context: Any, state: dict[str, Any]
    ) -> None:
        """Record the history's keys on first use, then load the history (see the base class)."""
        self._keys.get_or_initialize(session)
        await super().before_run(agent=agent, session=session, context=context, state=state)

    async def after_run(
        self, *, agent: Any, session: AgentSession, context: Any, state: dict[str, Any]
    ) -> None:
        """Record the history's keys if not yet done, then save the run (see the base class)."""
        self._keys.get_or_initialize(session)
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
        """The stored history of ``session``."""
        keys = self._keys.get_or_initialize(session)
        return await self.get_messages(session.session_id, state=keys)

    async def clear(self, session: AgentSession) -> int:
        """Erase the stored history of ``session``; returns how many messages were deleted."""
        keys = self._keys.get_or_initialize(session)
        history_id, user_id = self._key(session.session_id, keys)
        return int(await self.store.delete_history(history_id, user_id=user_id))


__all__ = ["PostgresHistoryProvider"]
