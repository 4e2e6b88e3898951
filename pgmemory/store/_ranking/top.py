"""A mode's ranking up to ``top`` (its best ``:limit`` rows and their score), and the hits read
back from it: the part the search and the recall statements share.
"""

from __future__ import annotations

from pgmemory.store._ranking.candidates import FirstPass, vector_candidates
from pgmemory.store._ranking.fusion import hybrid_ranking
from pgmemory.store._ranking.keywords import keyword_ranking
from pgmemory.store._ranking.scope import READ_LIST, read_back_scoped
from pgmemory.store.modes import SEARCH_MODES


def mode_ranking(
    dimensions: tuple[str, ...],
    *,
    covering: bool,
    mode: str,
    fusion: str,
    neighbours: bool,
    ann_dimensions: int | None,
    windowed: bool,
    shortlist: FirstPass | None = None,
    distributed: bool = False,
) -> str:
    """The CTEs of a mode's ranking, up to ``top`` (the best ``:limit`` rows and their score);
    shared by :func:`~pgmemory.store._ranking.search.search_memories` and :func:`~pgmemory.store._ranking.recall.recall_memories` (``distributed``: for a
    table Citus distributes, see :func:`keyword_ranking`)."""
    if neighbours and (mode != "hybrid" or fusion != "score"):
        raise ValueError("neighbours are part of mode='hybrid' with fusion='score' only")
    if ann_dimensions is not None and mode != "vector":
        raise ValueError("the approximate path serves mode='vector' only")
    if shortlist is not None and (mode != "vector" or ann_dimensions is not None):
        raise ValueError("the two-phase path serves mode='vector' on the exact path only")
    if mode not in SEARCH_MODES:
        raise ValueError(f"unknown search mode {mode!r}; expected one of {SEARCH_MODES}")
    candidates = vector_candidates(
        dimensions,
        covering=covering,
        windowed=windowed,
        conversation=neighbours,
        materialized=mode != "vector",
        ann_dimensions=ann_dimensions,
        shortlist=shortlist,
    )
    keywords = keyword_ranking(
        dimensions,
        windowed=windowed,
        scope_from_candidates=mode == "hybrid",
        distributed=distributed,
    )
    if mode == "vector":
        ranked = f"""{candidates},
top AS (
    SELECT id, user_id, CAST(1 - distance AS real) AS score
    FROM candidates ORDER BY distance, id LIMIT :limit
)"""
    elif mode == "text":
        ranked = f"""{keywords},
top AS (
    SELECT id, user_id, CAST(relevance AS real) AS score FROM by_text ORDER BY rank LIMIT :limit
)"""
    else:
        ranked = hybrid_ranking(
            dimensions,
            candidates,
            keywords,
            fusion=fusion,
            neighbours=neighbours,
            windowed=windowed,
        )
    return ranked


def read_hits(dimensions: tuple[str, ...], *, columns: tuple[str, ...] = ()) -> str:
    """The ``hits`` CTE: the ranked rows read back whole (plus ``columns`` of the memory
    row), at least ``:min_score``.

    The rows are read back by :func:`read_back_scoped`; when the scope names a user, it repeats
    ``m.user_id = :user_id``: a filter on the ranking's own columns alone does not tell Citus
    which shard the read-back reads, so without it every user's search ran on every shard.
    """
    extra = "".join(f", m.{c}" for c in columns)
    return f"""hits AS (
    SELECT {READ_LIST}{extra}, top.score
    FROM top
    {read_back_scoped("top", READ_LIST + extra, dimensions)}
    WHERE top.score >= :min_score
)"""
