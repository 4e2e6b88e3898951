"""Why a hit ranks: what each signal (similarity, keywords, recency, neighbour) contributed
to its score, as the ``explained`` CTE.
"""

from __future__ import annotations

#: A signal the mode does not have.
_NONE = "CAST(NULL AS float8)"

#: A ranked row's neighbour share beyond which it is shown as a "neighbour" (of a match)
#: rather than a "match": most of its score was lent by an adjacent message.
_REASON = "CASE WHEN {n} > {own} THEN 'neighbour' ELSE 'match' END"


def explained_signals(*, mode: str, fusion: str) -> str:
    """The ``explained`` CTE: per hit, what each signal contributed to its score, and why it
    ranks (``match``, or ``neighbour`` when most of its score is its neighbour's share).

    Score fusion recomputes each hit's scaled, weighted similarity, keyword and recency parts
    from its row and the ranking's own stages (``spread``, ``bm25``; ``hits`` must carry
    ``embedding``); the neighbour share is what the score holds beyond them. Rank fusion
    gives each ranking's reciprocal-rank share. Vector and text mode have one signal, the
    score itself.
    """
    before = ""
    if mode == "vector":
        parts = (
            f"h.score AS similarity, {_NONE} AS keywords, {_NONE} AS recency, {_NONE} AS neighbour"
        )
        source = "hits AS h"
    elif mode == "text":
        parts = (
            f"{_NONE} AS similarity, h.score AS keywords, {_NONE} AS recency, {_NONE} AS neighbour"
        )
        source = "hits AS h"
    elif fusion == "rank":
        parts = """COALESCE(CAST(:vector_weight AS float8) / (:rrf_k + v.rank), 0) AS similarity,
           COALESCE(CAST(:text_weight AS float8) / (:rrf_k + t.rank), 0) AS keywords,
           COALESCE(CAST(:recency_weight AS float8) / (:rrf_k + r.rank), 0) AS recency,
           0 AS neighbour"""
        source = """hits AS h
    LEFT JOIN by_vector AS v ON v.id = h.id AND v.user_id = h.user_id
    LEFT JOIN by_text AS t ON t.id = h.id AND t.user_id = h.user_id
    LEFT JOIN by_time AS r ON r.id = h.id AND r.user_id = h.user_id"""
    else:
        # From the hit's own row (its distance to :query is the candidates' exact distance)
        # and the ranking's one-row stages: no join over the scope's rows.
        parts = """CAST(:vector_weight AS float8)
               * COALESCE((s.dmax - (h.embedding <=> :query)) / NULLIF(s.dmax - s.dmin, 0), 1)
               AS similarity,
           CAST(:text_weight AS float8)
               * COALESCE(CAST(k.relevance ->> CAST(h.id AS text) AS float8)
                          / NULLIF(s.rmax, 0), 0) AS keywords,
           CAST(:recency_weight AS float8)
               * COALESCE(CAST(EXTRACT(EPOCH FROM h.created_at - s.tmin) AS float8)
                          / NULLIF(CAST(EXTRACT(EPOCH FROM s.tmax - s.tmin) AS float8), 0),
                          1) AS recency,
           CAST(NULL AS float8) AS neighbour"""
        source = """hits AS h CROSS JOIN spread AS s CROSS JOIN relevance_map AS k"""
        # The hits' BM25 by id, built once (a join of the hits with ``bm25`` is a nested loop
        # over every match under the one-row estimates of CTEs); only the hits' own entries
        # (a hashed lookup per match): a map of every match cost a 1,000-message recall ~5 %.
        before = """relevance_map AS MATERIALIZED (
    SELECT jsonb_object_agg(CAST(b.id AS text), b.relevance) AS relevance FROM bm25 AS b
    WHERE (b.id, b.user_id) IN (SELECT h.id, h.user_id FROM hits AS h)
),
"""
    own = "COALESCE(x.similarity, 0) + COALESCE(x.keywords, 0) + COALESCE(x.recency, 0)"
    # Score fusion: the neighbour share is the score beyond the row's own parts (0 when the
    # rounding of the real score makes it negative).
    neighbour = (
        f"CAST(GREATEST(x.score - ({own}), 0) AS float8)"
        if mode == "hybrid" and fusion == "score"
        else "CAST(x.neighbour AS float8)"
    )
    return f"""{before}explained AS (
    SELECT x.id, x.user_id, x.score,
           CAST(x.similarity AS float8) AS similarity, CAST(x.keywords AS float8) AS keywords,
           CAST(x.recency AS float8) AS recency, {neighbour} AS neighbour,
           {_REASON.format(n=f"COALESCE({neighbour}, 0)", own=own)} AS reason
    FROM (
        SELECT h.id, h.user_id, h.score, {parts}
        FROM {source}
    ) AS x
)"""
