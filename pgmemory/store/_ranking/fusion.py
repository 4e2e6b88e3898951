"""The hybrid ranking: the similarity, keyword and newest-first pools fused into ``top``, by
reciprocal ranks or by scaled scores, optionally lending each row its neighbours' scores.
"""

from __future__ import annotations

from pgmemory.store._ranking.scope import LIVE, scope_and_window
from pgmemory.store.models import CONVERSATION_KEY
from pgmemory.store.modes import FUSIONS

# The hybrid statement's last ranking step (see search_memories): reciprocal-rank fusion ...
_RANK_FUSION = """top AS (
    SELECT id, user_id, CAST(sum(weight / (:rrf_k + rank)) AS real) AS score
    FROM (
        SELECT id, user_id, rank, CAST(:vector_weight AS float8) AS weight FROM by_vector
        UNION ALL
        SELECT id, user_id, rank, CAST(:text_weight AS float8) FROM by_text
        UNION ALL
        SELECT id, user_id, rank, CAST(:recency_weight AS float8) FROM by_time
    ) AS ranked
    GROUP BY id, user_id
    HAVING sum(weight / (:rrf_k + rank)) > 0
    ORDER BY score DESC, id
    LIMIT :limit
)"""

# ... or score fusion: every scope row's scaled similarity (and recency), every keyword match's
# scaled BM25, summed per row, for the rows in the union of the pools (a ranking with weight 0
# adds no rows). One linear pass, as the rank fusion's: no join that a generic plan (whose
# estimates say one row per CTE) could turn into a rescan per scope row. Unlike ranks,
# normalised scores keep how far ahead the best match is.
_SPREAD = """spread AS MATERIALIZED (
    SELECT min(distance) AS dmin, max(distance) AS dmax,
           min(created_at) AS tmin, max(created_at) AS tmax,
           (SELECT max(relevance) FROM bm25) AS rmax
    FROM candidates
)"""
_SCORE_PARTS = (
    _SPREAD
    + """,
fused AS (
    SELECT id, user_id, sum(part) AS score, bool_or(pooled) AS pooled
    FROM (
        SELECT c.id, c.user_id, false AS pooled,
               CAST(:vector_weight AS float8)
                   * COALESCE((s.dmax - c.distance) / NULLIF(s.dmax - s.dmin, 0), 1)
               + CAST(:recency_weight AS float8)
                   * COALESCE(CAST(EXTRACT(EPOCH FROM c.created_at - s.tmin) AS float8)
                              / NULLIF(CAST(EXTRACT(EPOCH FROM s.tmax - s.tmin) AS float8), 0),
                              1) AS part
        FROM candidates AS c CROSS JOIN spread AS s
        UNION ALL
        SELECT b.id, b.user_id, false,
               CAST(:text_weight AS float8) * COALESCE(b.relevance / NULLIF(s.rmax, 0), 0)
        FROM bm25 AS b CROSS JOIN spread AS s
        UNION ALL
        SELECT id, user_id, true, 0 FROM by_vector WHERE CAST(:vector_weight AS float8) > 0
        UNION ALL
        SELECT id, user_id, true, 0 FROM by_text WHERE CAST(:text_weight AS float8) > 0
        UNION ALL
        SELECT id, user_id, true, 0 FROM by_time WHERE CAST(:recency_weight AS float8) > 0
    ) AS parts
    GROUP BY id, user_id
    HAVING bool_or(pooled)
)"""
)

_SCORE_FUSION = (
    _SCORE_PARTS
    + """,
top AS (
    SELECT id, user_id, CAST(score AS real) AS score
    FROM fused
    ORDER BY score DESC, id
    LIMIT :limit
)"""
)


# ... and with neighbours: each row also gets :neighbour_weight times the better fused score
# of the rows just before and after it in its conversation (same user, application, agent and
# session, in created_at order), and the pooled rows' neighbours are ranked too. Only the rows
# within two places of a pooled row take part (``reach``: a shown row is pooled or next to
# one, and its neighbours' scores are needed), found by :func:`_conversation_links` (in a
# large scope by two probes of the conversation index per pooled row); the fusion and the
# window then run over those few rows, not every scope row. A shown row's neighbours are in
# ``reach``, so ``lag`` and ``lead`` over it give the same rows as over the whole scope.
def _score_fusion_neighbours(dimensions: tuple[str, ...], *, windowed: bool) -> str:
    """Score fusion with neighbours (see above), up to ``top``."""
    return (
        _SPREAD
        + """,
pooled AS MATERIALIZED (
    SELECT id FROM by_vector WHERE CAST(:vector_weight AS float8) > 0
    UNION
    SELECT id FROM by_text WHERE CAST(:text_weight AS float8) > 0
    UNION
    SELECT id FROM by_time WHERE CAST(:recency_weight AS float8) > 0
),
"""
        + _conversation_links(dimensions, windowed=windowed)
        + """,
reach AS MATERIALIZED (
    SELECT c.*, l.shown
    FROM candidates AS c
    JOIN (SELECT id, bool_or(step <= 1) AS shown FROM linked GROUP BY id) AS l ON l.id = c.id
),
fused AS (
    SELECT id, user_id, sum(part) AS score, bool_or(shown) AS shown,
           max(application_id) AS application_id, max(agent_id) AS agent_id,
           max(session_id) AS session_id, max(created_at) AS created_at
    FROM (
        SELECT c.id, c.user_id, c.shown,
               CAST(:vector_weight AS float8)
                   * COALESCE((s.dmax - c.distance) / NULLIF(s.dmax - s.dmin, 0), 1)
               + CAST(:recency_weight AS float8)
                   * COALESCE(CAST(EXTRACT(EPOCH FROM c.created_at - s.tmin) AS float8)
                              / NULLIF(CAST(EXTRACT(EPOCH FROM s.tmax - s.tmin) AS float8), 0),
                              1) AS part,
               c.application_id, c.agent_id, c.session_id, c.created_at
        FROM reach AS c CROSS JOIN spread AS s
        UNION ALL
        SELECT b.id, b.user_id, false,
               CAST(:text_weight AS float8) * COALESCE(b.relevance / NULLIF(s.rmax, 0), 0),
               NULL, NULL, NULL, CAST(NULL AS timestamptz)
        FROM bm25 AS b CROSS JOIN spread AS s
        WHERE b.id IN (SELECT id FROM reach)
    ) AS parts
    GROUP BY id, user_id
),
near AS (
    SELECT id, user_id, score, shown,
           lag(score) OVER conversation AS score_before,
           lead(score) OVER conversation AS score_after
    FROM fused
    WINDOW conversation AS (
        PARTITION BY user_id, application_id, agent_id, session_id ORDER BY created_at, id
    )
),
top AS (
    SELECT id, user_id,
           CAST(score + CAST(:neighbour_weight AS float8)
                        * COALESCE(GREATEST(score_before, score_after), 0) AS real) AS score
    FROM near
    WHERE shown
    ORDER BY score DESC, id
    LIMIT :limit
)"""
    )


#: A hybrid search's scope of more live rows than this finds the pooled rows' neighbours by
#: probes of the conversation index (two per pooled row, about 5 µs each); up to this many,
#: by a window over every scope row, which costs less there (docs/performance.md).
NEIGHBOUR_PROBES_FROM = 800


def _conversation_links(dimensions: tuple[str, ...], *, windowed: bool) -> str:
    """The ``linked`` CTE: each pooled row (step 0) and the two live scope rows before and the
    two after it in its conversation (steps 1 and 2; the window's rows only, when
    ``windowed``). A row near several pooled rows is linked to each.

    In a scope of up to NEIGHBOUR_PROBES_FROM rows (``scope_n``, the hybrid statement's count
    of its candidates) they come from a window over every candidate; in a larger one, from two
    probes of ``ix_pgmemory_memories_conversation`` per pooled row (migration 0021: its keys
    are the conversation's ids hashed (``CONVERSATION_KEY``), ``created_at`` and ``id``, so a
    probe reads its two entries and stops; the ids themselves are checked on the rows). The
    statement holds both; a one-time filter on the scope's size runs one.
    """
    where, window = scope_and_window(dimensions, windowed=windowed)

    def probe(before: bool) -> str:
        cmp, order = ("<", "DESC") if before else (">", "ASC")
        return f"""unnest(ARRAY(
        SELECT m.id
        FROM pgmemory_memories AS m
        WHERE {where}
          AND {CONVERSATION_KEY} = p.conversation
          AND (m.created_at, m.id) {cmp} (p.created_at, p.id)
          AND m.user_id = p.user_id AND m.session_id = p.session_id
          AND m.agent_id = p.agent_id AND m.application_id = p.application_id
          AND {LIVE}{window}
        ORDER BY m.created_at {order}, m.id {order}
        LIMIT 2
    )) WITH ORDINALITY"""

    probes = f"(SELECT n FROM scope_n) > {NEIGHBOUR_PROBES_FROM}"
    lags = ", ".join(
        f"{step}(c.id{offset}) OVER conversation AS {name}"
        for step, offset, name in (
            ("lag", ", 2", "before_2"),
            ("lag", "", "before_1"),
            ("lead", "", "after_1"),
            ("lead", ", 2", "after_2"),
        )
    )
    return f"""pooled_rows AS MATERIALIZED (
    SELECT c.id, c.user_id, c.application_id, c.agent_id, c.session_id, c.created_at,
           {CONVERSATION_KEY} AS conversation
    FROM candidates AS c
    WHERE c.id IN (SELECT id FROM pooled)
),
linked AS MATERIALIZED (
    SELECT id, 0 AS step FROM pooled
    UNION ALL
    SELECT w.id,
           CASE WHEN w.before_1 IN (SELECT id FROM pooled) OR w.after_1 IN (SELECT id FROM pooled)
                THEN 1 ELSE 2 END
    FROM (
        SELECT c.id, {lags}
        FROM candidates AS c
        WHERE NOT {probes}
        WINDOW conversation AS (
            PARTITION BY c.user_id, c.session_id, c.agent_id, c.application_id
            ORDER BY c.created_at, c.id
        )
    ) AS w
    WHERE w.before_1 IN (SELECT id FROM pooled) OR w.after_1 IN (SELECT id FROM pooled)
       OR w.before_2 IN (SELECT id FROM pooled) OR w.after_2 IN (SELECT id FROM pooled)
    UNION ALL
    SELECT n.id, n.step
    FROM pooled_rows AS p CROSS JOIN LATERAL {probe(True)} AS n(id, step)
    WHERE {probes}
    UNION ALL
    SELECT n.id, n.step
    FROM pooled_rows AS p CROSS JOIN LATERAL {probe(False)} AS n(id, step)
    WHERE {probes}
)"""


def hybrid_ranking(
    dimensions: tuple[str, ...],
    candidates: str,
    keywords: str,
    *,
    fusion: str,
    neighbours: bool,
    windowed: bool,
) -> str:
    """``hybrid``'s CTEs: the similarity, keyword and newest-first pools fused into ``top``."""
    if fusion not in FUSIONS:
        raise ValueError(f"unknown fusion {fusion!r}; expected one of {FUSIONS}")
    fused = (
        _RANK_FUSION
        if fusion == "rank"
        else _score_fusion_neighbours(dimensions, windowed=windowed)
        if neighbours
        else _SCORE_FUSION
    )
    return f"""{candidates},
by_vector AS (
    SELECT id, user_id, row_number() OVER (ORDER BY distance, id) AS rank
    FROM candidates ORDER BY distance, id LIMIT :pool
),
{keywords},
by_time AS (
    SELECT id, user_id, row_number() OVER (ORDER BY created_at DESC, id DESC) AS rank
    FROM candidates ORDER BY created_at DESC, id DESC LIMIT :pool
),
{fused}"""
