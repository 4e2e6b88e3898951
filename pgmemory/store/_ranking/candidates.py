"""The vector side of a ranking: the ``candidates`` CTE, the scope's rows with their exact
cosine distance to ``:query`` (every live row; the approximate index's nearest; or the
two-phase path's shortlist, re-ranked exactly).
"""

from __future__ import annotations

from typing import Literal

from pgmemory.store._ranking.scope import LIVE, read_back, scope_and_window
from pgmemory.store.models import COVERING_MAX_DIMENSIONS


def vector_candidates(
    dimensions: tuple[str, ...],
    *,
    covering: bool,
    windowed: bool,
    conversation: bool,
    materialized: bool,
    ann_dimensions: int | None,
    shortlist: FirstPass | None = None,
) -> str:
    """The ``candidates`` CTE: every live scope row with its exact cosine distance to
    ``:query``, or, on the approximate path, the approximate index's ``:ann_candidates`` nearest, or,
    with ``shortlist``, the :func:`_shortlist` rows with their exact distance."""
    where, window = scope_and_window(dimensions, windowed=windowed)
    if shortlist is not None:
        return _shortlist(dimensions, where + window, shortlist)
    if ann_dimensions is not None:
        typed = f"vector({int(ann_dimensions)})"
        return f"""candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at,
           CAST(m.embedding AS {typed}) <=> CAST(:query AS {typed}) AS distance
    FROM pgmemory_memories AS m
    WHERE {where}
      AND {LIVE}{window}
    ORDER BY CAST(m.embedding AS {typed}) <=> CAST(:query AS {typed})
    LIMIT :ann_candidates
)"""
    guard = f"\n      AND vector_dims(m.embedding) <= {COVERING_MAX_DIMENSIONS}" if covering else ""
    # each row's conversation, for its neighbours (:func:`_conversation_links`)
    keys = ", m.application_id, m.agent_id, m.session_id" if conversation else ""
    return f"""candidates AS {"MATERIALIZED " if materialized else ""}(
    SELECT m.id, m.user_id, m.created_at{keys}, (m.embedding <=> :query) + 0 AS distance
    FROM pgmemory_memories AS m
    WHERE {where}{guard}
      AND {LIVE}{window}
)"""


# A function of the parameters alone, in an expression a statement works out for every row,
# is written as a scalar subquery (an InitPlan, run once): a generic plan, as the store runs
# its prepared statements (connector.GENERIC_PLANS), folds nothing and calls it again for
# every row it reads (tests/store/test_plans.py).
#: The query vector's binary code, for the two-phase path's Hamming ranking (written inline,
#: the query was quantised again for every scope row, which made that pass slower than the
#: exact scan up to a few thousand rows: docs/performance.md).
_QUERY_CODE = "(SELECT binary_quantize(CAST(:query AS vector)))"
#: The query's unit vector in half precision, for the two-phase path's ``halves`` pass.
_QUERY_HALF = "(SELECT CAST(l2_normalize(CAST(:query AS vector)) AS halfvec))"


#: The two-phase path's first passes: what a large scope's rows are ranked by before the
#: exact re-rank (:mod:`pgmemory.store.shortlist` picks one per collection).
FirstPass = Literal["codes", "halves"]
#: Each first pass's order and the predicate that makes its index match: ``codes`` by the
#: Hamming distance of the binary codes (``embedding_code``, d / 8 bytes a row, migration
#: 0013), ``halves`` by the inner product of half-precision unit vectors (``embedding_half``,
#: 2 bytes a dimension, opt-in: pgmemory.admin.half_vectors; NULL above 1,024 dimensions,
#: which its partial index leaves out). Each is read index-only from its own index.
_FIRST_PASSES: dict[FirstPass, tuple[str, str]] = {
    "codes": (f"m.embedding_code <~> {_QUERY_CODE}", ""),
    "halves": (f"m.embedding_half <#> {_QUERY_HALF}", "\n      AND m.embedding_half IS NOT NULL"),
}


def _shortlist(dimensions: tuple[str, ...], where: str, first_pass: FirstPass) -> str:
    """The two-phase ``candidates``: the ``:shortlist`` live scope rows nearest to ``:query``
    by their ``first_pass`` (:data:`_FIRST_PASSES`), then those rows' exact cosine distance,
    read from their full vectors one primary-key lookup each (:func:`read_back`: no plan, a
    generic one included, whose estimates know nothing of ``:shortlist``, can turn it into a
    join that scans the scope's full vectors after all). The query's own code or half vector
    is a scalar subquery, worked out once.
    """
    order, guard = _FIRST_PASSES[first_pass]
    probe = read_back(
        "s",
        "m.id, m.user_id, m.created_at, (m.embedding <=> :query) + 0 AS distance",
        routed="user_id" in dimensions,
    )
    return f"""shortlist AS MATERIALIZED (
    SELECT m.id, m.user_id
    FROM pgmemory_memories AS m
    WHERE {where}{guard}
      AND {LIVE}
    ORDER BY {order}, m.id
    LIMIT :shortlist
),
candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at, m.distance
    FROM shortlist AS s
    {probe}
)"""
