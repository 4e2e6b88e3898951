"""Facts: one JSON object per scope and namespace (e.g. a user's name and allergies).

The key is the exact scope, all four dimensions (an unset one is ``''``), plus the namespace.
Every key that changes is audited with its old and new value, in the transaction that changes
it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pgmemory.errors import ScopeError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.jsonb import jsonb
from pgmemory.store.records import MemoryScope
from pgmemory.store.validation import (
    FACTS_INDEXES,
    check_index_entries,
    check_metadata,
    check_name,
    check_optional_name,
    describe,
)

logger = logging.getLogger(__name__)


async def get(db: Database, namespace: str, scope: MemoryScope) -> dict[str, Any]:
    """The facts stored for exactly this scope in ``namespace`` (empty when none)."""
    params = scope_key(namespace, scope)
    async with db.read(params["user_id"]) as conn:
        facts = (await conn.execute(clause(q.GET_FACTS), params)).scalar()
    return dict(facts or {})


async def merge(
    db: Database,
    namespace: str,
    scope: MemoryScope,
    updates: Mapping[str, Any],
    *,
    actor: str | None,
    sources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge ``updates`` into the scope's facts in ONE transaction (a None value removes the
    key); returns the merged facts.

    ``updates`` is cleaned like all JSON the store keeps (:mod:`pgmemory.text.clean`);
    ``sources``, what the values were derived from (e.g. ``{"message_ids": [...]}``), goes into
    every audit row of the change.
    """
    check_optional_name(actor, what="actor")
    clean = check_metadata(updates, what="fact updates")
    recorded = None if sources is None else jsonb(check_metadata(sources, what="fact sources"))
    params = scope_key(namespace, scope)
    async with db.write(users=(params["user_id"],)) as conn:
        await conn.execute(clause(q.ENSURE_FACTS), params)
        current = dict((await conn.execute(clause(q.GET_FACTS_FOR_UPDATE), params)).scalar() or {})
        merged = dict(current)
        changes: list[tuple[str, Any, Any]] = []
        for key, value in clean.items():
            old = current.get(key)
            if value is None:
                if key in merged:
                    del merged[key]
                    changes.append((key, old, None))
            elif old != value:
                merged[key] = value
                changes.append((key, old, value))
        if changes:
            await conn.execute(clause(q.UPDATE_FACTS), {**params, "facts": jsonb(merged)})
            await conn.execute(
                clause(q.AUDIT_FACTS),
                {
                    **params,
                    "actor": actor or "",
                    "sources": recorded,
                    "keys": [c[0] for c in changes],
                    "old_values": [None if c[1] is None else jsonb(c[1]) for c in changes],
                    "new_values": [None if c[2] is None else jsonb(c[2]) for c in changes],
                },
            )
    if changes:
        logger.info("changed %d facts in namespace %s", len(changes), namespace)
    return merged


async def delete(db: Database, scope: MemoryScope, *, namespace: str | None) -> int:
    """Erase the scope's facts in one namespace, or in all (None); returns the rows deleted."""
    params: dict[str, Any] = scope_key(namespace or "-", scope)
    params["namespace"] = namespace
    async with db.write(users=(params["user_id"],)) as conn:
        return int((await conn.execute(clause(q.DELETE_FACTS), params)).rowcount)


def scope_key(namespace: str, scope: MemoryScope) -> dict[str, Any]:
    """The key of a scope's facts row (and of its derivation jobs), checked: the four ids and the namespace must fit one
    index entry together (2,704 bytes of UTF-8)."""
    check_name(namespace, what="namespace")
    if not isinstance(scope, MemoryScope):
        raise ScopeError(f"facts need a non-empty MemoryScope, got {describe(scope)}")
    if scope.is_empty:
        raise ScopeError("facts need a non-empty MemoryScope: set user_id (or another dimension)")
    params = {**scope.column_values(), "namespace": namespace}
    check_index_entries(
        FACTS_INDEXES,
        params,
        where="facts",
        names={**{d: f"scope.{d}" for d in MemoryScope.DIMENSIONS}, "namespace": "namespace"},
    )
    return params
