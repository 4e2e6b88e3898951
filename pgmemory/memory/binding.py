"""Tenant binding: a provider's scopes come from what the application binds, never from the
session dict a client may have sent back.

A session's state travels through clients (``session.to_dict()`` / ``deserialize_session``),
so whatever a provider finds there is untrusted. Each run, the memory providers derive their
scopes and keys afresh from what the application bound (the state initializer, the user id in
``session.state``) and keep them in the session only as a record. When the record disagrees
with what is derived now, :func:`bind_state` refuses the run before anything is read or
written: either the session state was altered, or it belongs to another user.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pgmemory.errors import ScopeError

if TYPE_CHECKING:
    from pgmemory.runtime.providers import ContextProvider

_ABSENT = object()


def bind_state(
    state: dict[str, Any], provider: ContextProvider, derived: Mapping[str, Any]
) -> None:
    """Check the provider's record in ``state`` against ``derived``, then record ``derived``.

    Args:
        state: the session's state (``session.state``); the provider's record lives under
            ``provider.state_key``. An absent record, or an empty dict, is no record yet.
        provider: the provider, named in the error.
        derived: the JSON-native state the provider derived for this run from what the
            application binds; every one of its fields must equal the record's.

    Raises:
        ScopeError: the record is not a mapping, or one of its fields differs from
            ``derived``. The message names the provider and the field, never the values.
    """
    key = provider.state_key
    recorded = state.get(key, _ABSENT)
    if recorded is not _ABSENT and recorded != {}:
        if not isinstance(recorded, Mapping):
            raise ScopeError(
                f"{provider!r}: session.state[{key!r}] is a {type(recorded).__name__}, not the "
                "provider's record; the session state was altered. Nothing was read or written."
            )
        for field, value in derived.items():
            if recorded.get(field, _ABSENT) != value:
                raise ScopeError(
                    f"{provider!r}: session.state[{key!r}][{field!r}] differs from what the "
                    "application binds for this session (its state initializer or user id); "
                    "the session state was altered or belongs to another user. Nothing was "
                    "read or written. To move a session to another scope on purpose, delete "
                    f"session.state[{key!r}] first."
                )
    value = copy.deepcopy(dict(derived))
    if isinstance(recorded, dict):
        # In place, so the hook's ``state`` argument (this very dict) shows the record.
        recorded.clear()
        recorded.update(value)
    else:
        state[key] = value


__all__ = ["bind_state"]
