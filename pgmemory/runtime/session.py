"""Sessions (one conversation each) and the typed helper providers use to keep state in them.

An :class:`AgentSession` holds a ``session_id`` and a JSON-native ``state`` dict. Providers are
shared by every session, so anything per-session (history, memory scopes, ids) lives in
``session.state`` under the provider's state key. ``session.to_dict()`` and
``AgentSession.from_dict()`` (or ``agent.deserialize_session()``) round-trip it exactly, also
through ``json.dumps``/``json.loads``, so a restarted server can resume a conversation.
"""

from __future__ import annotations

import copy
import json
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, get_type_hints

from pydantic import TypeAdapter, ValidationError

from pgmemory.errors import InvalidInputError

T = TypeVar("T")

SESSION_FORMAT = "pgmemory.session/1"


def check_json_native(value: Any, *, where: str = "state") -> None:
    """Raise :class:`InvalidInputError` naming the first value that is not plain JSON data."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{where} holds {value!r}; JSON has no NaN or infinity")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_json_native(item, where=f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError(
                    f"{where} has the non-string key {key!r}; JSON object keys must be strings"
                )
            check_json_native(item, where=f"{where}[{key!r}]")
        return
    raise InvalidInputError(
        f"{where} holds a {type(value).__name__}; session state must be JSON-native "
        "(dict, list, str, int, float, bool, None) - convert it, e.g. with .model_dump(mode='json')"
    )


class AgentSession:
    """One conversation: an id and a JSON-native state bag.

    Put caller identities in the state (``session.state["user_id"] = "alice"``); providers keep
    their per-session data there too, each under its own key.
    """

    __slots__ = ("session_id", "state")

    def __init__(
        self, session_id: str | None = None, *, state: Mapping[str, Any] | None = None
    ) -> None:
        if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
            raise InvalidInputError(
                f"session_id {session_id!r} is blank; pass a non-empty string or None for a new UUID"
            )
        self.session_id: str = session_id or str(uuid.uuid4())
        self.state: dict[str, Any] = copy.deepcopy(dict(state or {}))

    def to_dict(self) -> dict[str, Any]:
        """JSON-native form; fails clearly if something put non-JSON data in the state."""
        check_json_native(self.state, where="session.state")
        return {
            "type": SESSION_FORMAT,
            "session_id": self.session_id,
            "state": copy.deepcopy(self.state),
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | str) -> AgentSession:
        """Rebuild a session from :meth:`to_dict` output (or its JSON text)."""
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"serialized session is not valid JSON: {exc}") from None
        if not isinstance(data, Mapping):
            raise InvalidInputError(
                f"a serialized session must be a mapping from session.to_dict(), got {type(data).__name__}"
            )
        kind = data.get("type", SESSION_FORMAT)
        if kind != SESSION_FORMAT:
            raise InvalidInputError(
                f"serialized session has type {kind!r}; expected {SESSION_FORMAT!r} "
                "(data from session.to_dict())"
            )
        if not data.get("session_id"):
            raise InvalidInputError(
                "serialized session has no 'session_id'; pass session.to_dict() output"
            )
        state = data.get("state") or {}
        if not isinstance(state, Mapping):
            raise InvalidInputError(
                f"serialized session 'state' must be a mapping, got {type(state).__name__}"
            )
        check_json_native(dict(state), where="session.state")
        return cls(str(data["session_id"]), state=state)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AgentSession):
            return NotImplemented
        return self.session_id == other.session_id and self.state == other.state

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AgentSession(session_id={self.session_id!r}, state_keys={sorted(self.state)})"


def _check_key(key: object, what: str = "state_key") -> str:
    if not isinstance(key, str) or not key.strip():
        raise InvalidInputError(
            f"{what} {key!r} is blank; pass a non-empty string such as the provider's class name"
        )
    return key


class ProviderSessionState(Generic[T]):
    """Typed per-session state of one provider, kept in ``session.state[state_key]``.

    ``initializer(session)`` builds the state when the session has none for this key yet (it is
    saved at once, so it runs once per session). ``state_key`` defaults to the class name of
    ``owner`` (the provider); two instances of one provider in one agent need distinct keys.

    ``state_type`` (a pydantic model, dataclass, TypedDict, dict, ...) is how the stored JSON is
    read back; it defaults to the initializer's return annotation. Values are stored JSON-native
    (pydantic's ``mode="json"``), so sessions serialize; without a type, plain JSON is kept.

    ``get_or_initialize`` returns a fresh object each time: change it, then :meth:`save` it.

    A provider may keep this state under its own ``state_key``: the agent puts an empty dict
    there before the provider's hooks run (the hooks' ``state`` argument), and an empty dict
    counts as no state yet; :meth:`save` fills that same dict, so the hooks' ``state`` shows it.
    """

    def __init__(
        self,
        initializer: Callable[[Any], T],
        *,
        state_key: str | None = None,
        owner: object | None = None,
        state_type: type[T] | Any | None = None,
    ) -> None:
        if not callable(initializer):
            raise InvalidInputError(
                f"initializer must be callable(session) -> state, got {initializer!r}"
            )
        if state_key is None:
            if owner is None:
                raise InvalidInputError(
                    "ProviderSessionState needs state_key=... or owner=<the provider> "
                    "(whose class name becomes the key)"
                )
            state_key = type(owner).__name__
        self.state_key: str = _check_key(state_key)
        self._initializer = initializer
        if state_type is None:
            try:
                state_type = get_type_hints(initializer).get("return")
            except Exception:
                state_type = None
        self.state_type = state_type
        self._adapter: TypeAdapter[Any] | None = (
            TypeAdapter(state_type) if state_type is not None else None
        )

    def _dump(self, value: T) -> Any:
        data = self._adapter.dump_python(value, mode="json") if self._adapter else value
        check_json_native(data, where=f"session.state[{self.state_key!r}]")
        return copy.deepcopy(data)

    def _load(self, data: Any) -> T:
        if self._adapter is None:
            plain: T = copy.deepcopy(data)
            return plain
        try:
            loaded: T = self._adapter.validate_python(copy.deepcopy(data))
            return loaded
        except ValidationError as exc:
            raise InvalidInputError(
                f"session.state[{self.state_key!r}] does not fit {self.state_type!r}: {exc}; "
                "was the session made by an agent with a different configuration?"
            ) from None

    def has_state(self, session: Any) -> bool:
        """Whether the session already holds state under this key (an empty dict is none)."""
        current = _state_of(session).get(self.state_key, _ABSENT)
        return current is not _ABSENT and current != {}

    def get_or_initialize(self, session: Any) -> T:
        """The session's state for this provider, initialised (and saved) if absent."""
        if not self.has_state(session):
            self.save(session, self._initializer(session))
        return self._load(_state_of(session)[self.state_key])

    def save(self, session: Any, value: T) -> None:
        """Store ``value`` in the session under this key (replacing what was there)."""
        state = _state_of(session)
        data = self._dump(value)
        current = state.get(self.state_key)
        if isinstance(current, dict) and isinstance(data, dict):
            # Update in place so a provider holding the dict (its ``state`` hook argument) sees it.
            current.clear()
            current.update(data)
        else:
            state[self.state_key] = data

    def clear(self, session: Any) -> None:
        """Forget this provider's state in the session (the initializer runs again next time)."""
        _state_of(session).pop(self.state_key, None)


_ABSENT = object()


def _state_of(session: Any) -> dict[str, Any]:
    if isinstance(session, AgentSession):
        return session.state
    if session is None:
        raise InvalidInputError("no session given; pass an AgentSession (agent.create_session())")
    state = getattr(session, "state", None)
    if not isinstance(state, dict):
        raise InvalidInputError(f"{session!r} has no dict 'state'; pass an AgentSession")
    return state


__all__ = ["AgentSession", "ProviderSessionState", "check_json_native"]
