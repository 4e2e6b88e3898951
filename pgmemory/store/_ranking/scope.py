"""A scope as SQL: the filter every scoped statement shares, and reading ranked rows back.

A scope's set dimensions become ``m.<col> = :<col>`` (the columns are NOT NULL, so a B-tree
serves them); unset dimensions are not filtered. Ranked rows are read back from
pgmemory_memories one primary-key probe each (:func:`read_back`).
"""

from __future__ import annotations

from pgmemory.store.columns import READ_COLUMNS

_SCOPE_PREDICATE = {
    "application_id": "m.application_id = :application_id",
    "agent_id": "m.agent_id = :agent_id",
    "user_id": "m.user_id = :user_id",
    "session_id": "m.session_id = :session_id",
}
LIVE = "(m.expires_at IS NULL OR m.expires_at > now())"
READ_LIST = ", ".join(f"m.{c.name}" for c in READ_COLUMNS)


def scope_where(dimensions: tuple[str, ...]) -> str:
    predicates = ["m.collection = :collection"]
    predicates += [_SCOPE_PREDICATE[d] for d in dimensions]  # KeyError for anything else
    return "\n      AND ".join(predicates)


def read_back(alias: str, columns: str, *, routed: bool, name: str = "m") -> str:
    """``CROSS JOIN LATERAL (...) AS m`` (or ``AS name``): ``alias``'s rows (by their ``id``
    and ``user_id``) read back from pgmemory_memories with ``columns`` (of ``m``), one
    primary-key probe each.

    The probe is a LATERAL subquery with ``OFFSET 0`` so that no plan turns it into a join:
    with ``routed`` it repeats ``m.user_id = :user_id`` (Citus routes by it), and as a join a
    generic plan (whose estimates say one row per CTE) may serve that filter from an index on
    the user's rows and scan all of them once per row read back (measured: a top-3 search of a
    3,400-row scope spent 0.6 ms of its 2.4 that way; docs/performance.md, "Generic plans on
    a tenant mix").
    """
    user = "\n          AND m.user_id = :user_id" if routed else ""
    return f"""CROSS JOIN LATERAL (
        SELECT {columns}
        FROM pgmemory_memories AS m
        WHERE m.id = {alias}.id AND m.user_id = {alias}.user_id{user}
        OFFSET 0
    ) AS {name}"""


def read_back_scoped(alias: str, columns: str, dimensions: tuple[str, ...]) -> str:
    """:func:`read_back` in a user scope; without a user, a plain join (its only index
    conditions are the outer row's, and Citus cannot push a correlated subquery with OFFSET
    down to every shard)."""
    if "user_id" in dimensions:
        return read_back(alias, columns, routed=True)
    return f"JOIN pgmemory_memories AS m ON m.id = {alias}.id AND m.user_id = {alias}.user_id"


def scope_and_window(dimensions: tuple[str, ...], *, windowed: bool) -> tuple[str, str]:
    """The scope's predicate and its time window (``''`` without ``windowed``)."""
    window = "\n      AND m.created_at >= :since AND m.created_at < :until" if windowed else ""
    return scope_where(dimensions), window
