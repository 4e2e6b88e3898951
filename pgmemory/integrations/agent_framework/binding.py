"""User binding: a provider's scopes come from what the application binds, never from the
session dict a client may have sent back.

Every pgmemory provider takes ``user_id=``: the user's id as a non-empty string (a provider
made per request), or a resolver ``callable(session) -> str`` called on every run (reading
the application's own request context, e.g. what its authentication middleware set). There
is no fallback: a missing or blank user id is a :class:`~pgmemory.errors.ScopeError` naming
the fix.

A session's state travels through clients (``session.to_dict()`` /
``AgentSession.from_dict()``), so whatever a provider finds there is untrusted. Each run the
provider derives its scopes afresh from the bound user id and keeps them in its provider-scoped
state only as a record. When the record disagrees with what is derived now, :func:`bind_state`
refuses the run before anything is read or written: either the session state was altered, or it
belongs to another user.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from agent_framework import AgentSession

from pgmemory.errors import InvalidInputError, ScopeError

#: What ``user_id=`` accepts: the id itself, or a resolver called with the session every run.
UserId: TypeAlias = str | Callable[[AgentSession], str]

_ABSENT = object()


def check_user_id(user_id: object) -> UserId:
    """``user_id`` if it is a non-empty string or a callable, else a clear error.

    Raises:
        ScopeError: it is missing, blank or of another type; the message names the fix.
    """
    if callable(user_id):
        return user_id
    if isinstance(user_id, str) and user_id.strip():
        return user_id
    kind = "nothing" if user_id is None else f"a blank string or {type(user_id).__name__}"
    raise ScopeError(
        f"user_id is {kind}; pass the signed-in user's id (user_id='alice'), or a resolver "
        "called with the session on every run (user_id=lambda session: current_user.get()). "
        "pgmemory never falls back to a shared or client-sent id."
    )


def resolve_user_id(user_id: UserId, session: AgentSession, provider: object) -> str:
    """The user id bound for this run: ``user_id`` itself, or what its resolver returns.

    Raises:
        ScopeError: the resolver returned something other than a non-empty string.
    """
    value = user_id(session) if callable(user_id) else user_id
    if not isinstance(value, str) or not value.strip():
        kind = "nothing" if value is None else f"a blank string or {type(value).__name__}"
        raise ScopeError(
            f"{provider!r}: the user_id resolver returned {kind} for this session; it must "
            "return the signed-in user's id (a non-empty string) on every run. Nothing was "
            "read or written."
        )
    return value


def provider_state(session: AgentSession, provider: Any) -> dict[str, Any]:
    """The provider-scoped state of ``session`` (the dict the framework passes as ``state``).

    Raises:
        ScopeError: the session's entry is not a dict (see :func:`check_state`).
    """
    return check_state(session.state.setdefault(provider.source_id, {}), provider)


def check_state(state: object, provider: Any) -> dict[str, Any]:
    """``state`` if it is a dict: the provider's entry of ``session.state`` (what the framework
    passes the hooks as ``state``, taken from a session a client may have sent back).

    Raises:
        ScopeError: it is of another type; the message names the provider, the entry's key and
            its type, never its value.
    """
    if not isinstance(state, dict):
        raise ScopeError(
            f"{provider!r}: session.state[{provider.source_id!r}] is a "
            f"{type(state).__name__}, not the provider's record (a dict); the session state "
            "was altered. Nothing was read or written: start a new session, or restore one "
            "from what AgentSession.to_dict() returned."
        )
    return state


def bind_state(state: dict[str, Any], provider: Any, derived: Mapping[str, Any]) -> None:
    """Check the provider's record in ``state`` against ``derived``, then record ``derived``.

    Args:
        state: the provider-scoped state (the hooks' ``state`` argument, checked to be a dict:
            see :func:`check_state`). An empty dict is no record yet.
        provider: the provider, named in the error.
        derived: the JSON-native record the provider derived for this run from what the
            application binds; every one of its fields must equal the record's.

    Raises:
        ScopeError: ``state`` is not a dict, or a field of the record differs from
            ``derived``. The message names the provider and the field, never the values.
    """
    state = check_state(state, provider)
    if state:
        for field, value in derived.items():
            if state.get(field, _ABSENT) != value:
                raise ScopeError(
                    f"{provider!r}: the session's recorded {field!r} differs from what the "
                    "application binds for this session (its user_id); the session state "
                    "was altered or belongs to another user. Nothing was read or written. To "
                    "move a session to another user on purpose, start a new session."
                )
    # In place, so the framework's ``state`` argument (this very dict) holds the record.
    state.clear()
    state.update(copy.deepcopy(dict(derived)))


def check_own_state_key(provider: Any, agent: Any) -> None:
    """Refuse a run in which another of ``agent``'s context providers has ``provider``'s
    ``source_id``.

    The framework keys each provider's state in ``session.state`` by its ``source_id``
    (documented as unique per agent, but not checked): two providers with one would share one
    entry, each overwriting or refusing the other's record, and the turn's writes are
    coordinated by it too. Called by every pgmemory provider's hooks, where the framework hands
    over the agent (``agent.context_providers``: the agent's providers, in order).

    Raises:
        InvalidInputError: another provider (of any kind), or the same one listed twice, has
            this ``source_id``; the message names both by position and class, and the key.
    """
    providers = list(getattr(agent, "context_providers", None) or ())
    key = provider.source_id
    clashing = [i for i, other in enumerate(providers) if getattr(other, "source_id", None) == key]
    if len(clashing) < 2:
        return
    named = " and ".join(
        f"context_providers[{i}] ({type(providers[i]).__name__})" for i in clashing
    )
    twice = len({id(providers[i]) for i in clashing}) < len(clashing)
    raise InvalidInputError(
        f"{named} have the same source_id {key!r}, the key of a provider's state in "
        "session.state, so they would share one entry"
        + (" (one provider listed twice: list it once)" if twice else "")
        + "; give each provider its own source_id=. Nothing was read or written."
    )


def check_callable(value: object, what: str, fix: str) -> None:
    """Raise :class:`InvalidInputError` naming ``what`` unless ``value`` is callable."""
    if value is not None and not callable(value):
        raise InvalidInputError(f"{what} is {value!r}; pass {fix}")


__all__ = [
    "UserId",
    "bind_state",
    "check_own_state_key",
    "check_state",
    "check_user_id",
    "provider_state",
    "resolve_user_id",
]
