"""The search statement: a mode's ranking, its hits and, unless off, their recall audit row."""

from __future__ import annotations

from functools import lru_cache

from pgmemory.store._engine.statement import builds, register
from pgmemory.store._ranking.audit import recall_audit
from pgmemory.store._ranking.candidates import FirstPass
from pgmemory.store._ranking.scope import READ_LIST
from pgmemory.store._ranking.signals import explained_signals
from pgmemory.store._ranking.top import mode_ranking, read_hits

# The search statement is composed of named parts, each one stage of the ranking: the scope's
# vector candidates (exact, or the approximate path's), the keyword ranking (BM25), the mode's
# ranking into ``top``, then the hits and, unless off, the recall audit row. A stage can change
# (another candidate stage for large scopes, another keyword side for recall) behind its name.


@builds(fan_out="a search of a scope without a user (session, agent or application)")
@lru_cache(maxsize=256)
def search_memories(
    dimensions: tuple[str, ...],
    *,
    covering: bool,
    audit: bool,
    mode: str = "vector",
    fusion: str = "score",
    neighbours: bool = False,
    ann_dimensions: int | None = None,
    shortlist: FirstPass | None = None,
    relax_commit: bool = False,
    guarded: bool = False,
    windowed: bool = False,
    explain: bool = False,
    distributed: bool = False,
) -> str:
    """Exact top-k of a scope by similarity, keywords, or a fusion of both (and recency).

    * ``vector``: cosine similarity to ``:query``; ``score`` is the similarity.
    * ``text``: keyword match of ``:terms`` (see pgmemory.text.terms), ranked by BM25
      within the scope; ``score`` is the BM25 value.
    * ``hybrid``: a fusion of the similarity ranking, the keyword ranking and the newest-first
      ranking, weighted by ``:vector_weight``, ``:text_weight`` and ``:recency_weight``; each
      ranking with a positive weight contributes its best ``:pool`` rows. ``fusion="score"``
      sums normalised scores over those rows: similarity min-max normalised over the scope
      (1 = the scope's most similar row, 0 = its least), BM25 divided by the scope's best
      (0 where no term matches), creation time min-max normalised (1 = newest); a single row
      or equal values count 1. ``fusion="rank"`` is reciprocal-rank fusion: each ranking gives
      its rows ``weight / (:rrf_k + rank)`` (rows outside a ranking's pool get nothing from
      it). ``score`` is the fused value. With ``neighbours`` (score fusion only) a row also
      gets ``:neighbour_weight`` times the better fused score of the rows just before and
      after it in its conversation (same user, application, agent and session, by
      ``created_at``), and the pooled rows' neighbours are ranked too.

    The exact distance is ``(embedding <=> :query) + 0``: an expression no index provides an
    order for, so no plan, custom or generic, can answer the ORDER BY with an approximate index
    scan that filters afterwards (which returns a fraction of the right rows when the scope is
    selective). In vector mode the candidates are inlined, so the top-k sort reads the scope's
    index scan directly (on a 19k-row scope 17% faster than materialising every row first); the
    other modes read them several times and materialise them. With ``covering`` the predicate
    matches the partial covering index, so that scan is index-only.
    With ``windowed`` the rows are those created in ``[:since, :until)``. Without it the
    statement names no time bound at all: pgmemory's connections run a prepared statement on
    its generic plan (:data:`pgmemory.store._engine.connector.GENERIC_PLANS`), and a generic plan
    prices ``created_at >= $n AND created_at < $m`` as selective, so it took the (user,
    created_at) index and fetched every scope row from the heap (about 4–6 µs per row instead
    of the covering scan's 1–1.5).
    Unless ``audit`` is off, the same statement appends the recall audit row; with
    ``relax_commit`` it also lets its transaction commit without waiting for the disk flush
    (:data:`~pgmemory.store._ranking.audit.RELAX_COMMIT`, so a search in autocommit is one statement); with ``guarded`` it
    takes the user's erasure lock itself (:data:`~pgmemory.store._ranking.audit.ERASURE_GUARD`). With ``explain``
    each hit also carries what each signal contributed to its score (:func:`explained_signals`: the
    columns ``similarity``, ``keywords``, ``recency``, ``neighbour``), and the audit row
    records them with each hit's reason.

    ``ann_dimensions`` (vector mode only) switches to the approximate path for large scopes:
    the candidates come from the collection's approximate index (HNSW or IVFFlat: an
    expression index on ``embedding::vector(D)``, see :data:`~pgmemory.store.queries.ANN_INDEX_DDL` and
    :data:`~pgmemory.store.queries.ANN_IVFFLAT_DDL`) with the scope filter applied inside the index scan,
    ``:ann_candidates`` of them (run with :data:`~pgmemory.store.queries.ANN_SETTINGS` or
    :data:`~pgmemory.store.queries.ANN_IVFFLAT_SETTINGS`: iterative scan, so the scan keeps reading until enough rows
    pass the filter), then re-ranked exactly.

    ``shortlist`` (vector mode only) is the two-phase path for large scopes: the scope's
    ``:shortlist`` rows nearest by that first pass (their binary codes, or their half-precision
    unit vectors), re-ranked by their exact cosine distance (:func:`~pgmemory.store._ranking.candidates._shortlist`);
    :mod:`pgmemory.store.shortlist` decides which scopes take it, through which pass, and how
    many rows it re-ranks.

    ``distributed``: the statement is for a table Citus distributes (the keyword side reads a
    term's rows beside the scope's filter, see :func:`~pgmemory.store._ranking.keywords.keyword_ranking`).
    """
    ranked = mode_ranking(
        dimensions,
        covering=covering,
        mode=mode,
        fusion=fusion,
        neighbours=neighbours,
        ann_dimensions=ann_dimensions,
        windowed=windowed,
        shortlist=shortlist,
        distributed=distributed,
    )
    if explain:
        audit_cte = (
            recall_audit(relax_commit=relax_commit, guarded=guarded, explained=True)
            if audit
            else ""
        )
        return f"""
WITH {ranked},
{read_hits(dimensions, columns=("embedding",))},
{explained_signals(mode=mode, fusion=fusion)}{audit_cte}
SELECT {READ_LIST.replace("m.", "h.")}, h.score,
       e.similarity, e.keywords, e.recency, e.neighbour, e.reason
FROM hits AS h JOIN explained AS e ON e.id = h.id AND e.user_id = h.user_id
ORDER BY h.score DESC, h.id
"""
    audit_cte = recall_audit(relax_commit=relax_commit, guarded=guarded) if audit else ""
    return f"""
WITH {ranked},
{read_hits(dimensions)}{audit_cte}
SELECT * FROM hits ORDER BY score DESC, id
"""


register(__name__, globals())
