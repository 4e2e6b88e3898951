-- hybrid_ranking(user, rank, neighbours=False)
<candidates>,
by_vector AS (
    SELECT id, user_id, row_number() OVER (ORDER BY distance, id) AS rank
    FROM candidates ORDER BY distance, id LIMIT :pool
),
<keywords>,
by_time AS (
    SELECT id, user_id, row_number() OVER (ORDER BY created_at DESC, id DESC) AS rank
    FROM candidates ORDER BY created_at DESC, id DESC LIMIT :pool
),
top AS (
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
)

-- hybrid_ranking(user, score, neighbours=False)
<candidates>,
by_vector AS (
    SELECT id, user_id, row_number() OVER (ORDER BY distance, id) AS rank
    FROM candidates ORDER BY distance, id LIMIT :pool
),
<keywords>,
by_time AS (
    SELECT id, user_id, row_number() OVER (ORDER BY created_at DESC, id DESC) AS rank
    FROM candidates ORDER BY created_at DESC, id DESC LIMIT :pool
),
spread AS MATERIALIZED (
    SELECT min(distance) AS dmin, max(distance) AS dmax,
           min(created_at) AS tmin, max(created_at) AS tmax,
           (SELECT max(relevance) FROM bm25) AS rmax
    FROM candidates
),
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
),
top AS (
    SELECT id, user_id, CAST(score AS real) AS score
    FROM fused
    ORDER BY score DESC, id
    LIMIT :limit
)

-- hybrid_ranking(user, score, neighbours=True)
<candidates>,
by_vector AS (
    SELECT id, user_id, row_number() OVER (ORDER BY distance, id) AS rank
    FROM candidates ORDER BY distance, id LIMIT :pool
),
<keywords>,
by_time AS (
    SELECT id, user_id, row_number() OVER (ORDER BY created_at DESC, id DESC) AS rank
    FROM candidates ORDER BY created_at DESC, id DESC LIMIT :pool
),
spread AS MATERIALIZED (
    SELECT min(distance) AS dmin, max(distance) AS dmax,
           min(created_at) AS tmin, max(created_at) AS tmax,
           (SELECT max(relevance) FROM bm25) AS rmax
    FROM candidates
),
pooled AS MATERIALIZED (
    SELECT id FROM by_vector WHERE CAST(:vector_weight AS float8) > 0
    UNION
    SELECT id FROM by_text WHERE CAST(:text_weight AS float8) > 0
    UNION
    SELECT id FROM by_time WHERE CAST(:recency_weight AS float8) > 0
),
pooled_rows AS MATERIALIZED (
    SELECT c.id, c.user_id, c.application_id, c.agent_id, c.session_id, c.created_at,
           hashtextextended((((((user_id || '/'::text) || session_id) || '/'::text) || agent_id) || '/'::text) || application_id, 0::bigint) AS conversation
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
        SELECT c.id, lag(c.id, 2) OVER conversation AS before_2, lag(c.id) OVER conversation AS before_1, lead(c.id) OVER conversation AS after_1, lead(c.id, 2) OVER conversation AS after_2
        FROM candidates AS c
        WHERE NOT (SELECT n FROM scope_n) > 800
        WINDOW conversation AS (
            PARTITION BY c.user_id, c.session_id, c.agent_id, c.application_id
            ORDER BY c.created_at, c.id
        )
    ) AS w
    WHERE w.before_1 IN (SELECT id FROM pooled) OR w.after_1 IN (SELECT id FROM pooled)
       OR w.before_2 IN (SELECT id FROM pooled) OR w.after_2 IN (SELECT id FROM pooled)
    UNION ALL
    SELECT n.id, n.step
    FROM pooled_rows AS p CROSS JOIN LATERAL unnest(ARRAY(
        SELECT m.id
        FROM pgmemory_memories AS m
        WHERE m.collection = :collection
      AND m.user_id = :user_id
          AND hashtextextended((((((user_id || '/'::text) || session_id) || '/'::text) || agent_id) || '/'::text) || application_id, 0::bigint) = p.conversation
          AND (m.created_at, m.id) < (p.created_at, p.id)
          AND m.user_id = p.user_id AND m.session_id = p.session_id
          AND m.agent_id = p.agent_id AND m.application_id = p.application_id
          AND (m.expires_at IS NULL OR m.expires_at > now())
        ORDER BY m.created_at DESC, m.id DESC
        LIMIT 2
    )) WITH ORDINALITY AS n(id, step)
    WHERE (SELECT n FROM scope_n) > 800
    UNION ALL
    SELECT n.id, n.step
    FROM pooled_rows AS p CROSS JOIN LATERAL unnest(ARRAY(
        SELECT m.id
        FROM pgmemory_memories AS m
        WHERE m.collection = :collection
      AND m.user_id = :user_id
          AND hashtextextended((((((user_id || '/'::text) || session_id) || '/'::text) || agent_id) || '/'::text) || application_id, 0::bigint) = p.conversation
          AND (m.created_at, m.id) > (p.created_at, p.id)
          AND m.user_id = p.user_id AND m.session_id = p.session_id
          AND m.agent_id = p.agent_id AND m.application_id = p.application_id
          AND (m.expires_at IS NULL OR m.expires_at > now())
        ORDER BY m.created_at ASC, m.id ASC
        LIMIT 2
    )) WITH ORDINALITY AS n(id, step)
    WHERE (SELECT n FROM scope_n) > 800
),
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
)

