-- explained_signals(vector, score)
explained AS (
    SELECT x.id, x.user_id, x.score,
           CAST(x.similarity AS float8) AS similarity, CAST(x.keywords AS float8) AS keywords,
           CAST(x.recency AS float8) AS recency, CAST(x.neighbour AS float8) AS neighbour,
           CASE WHEN COALESCE(CAST(x.neighbour AS float8), 0) > COALESCE(x.similarity, 0) + COALESCE(x.keywords, 0) + COALESCE(x.recency, 0) THEN 'neighbour' ELSE 'match' END AS reason
    FROM (
        SELECT h.id, h.user_id, h.score, h.score AS similarity, CAST(NULL AS float8) AS keywords, CAST(NULL AS float8) AS recency, CAST(NULL AS float8) AS neighbour
        FROM hits AS h
    ) AS x
)

-- explained_signals(text, score)
explained AS (
    SELECT x.id, x.user_id, x.score,
           CAST(x.similarity AS float8) AS similarity, CAST(x.keywords AS float8) AS keywords,
           CAST(x.recency AS float8) AS recency, CAST(x.neighbour AS float8) AS neighbour,
           CASE WHEN COALESCE(CAST(x.neighbour AS float8), 0) > COALESCE(x.similarity, 0) + COALESCE(x.keywords, 0) + COALESCE(x.recency, 0) THEN 'neighbour' ELSE 'match' END AS reason
    FROM (
        SELECT h.id, h.user_id, h.score, CAST(NULL AS float8) AS similarity, h.score AS keywords, CAST(NULL AS float8) AS recency, CAST(NULL AS float8) AS neighbour
        FROM hits AS h
    ) AS x
)

-- explained_signals(hybrid, rank)
explained AS (
    SELECT x.id, x.user_id, x.score,
           CAST(x.similarity AS float8) AS similarity, CAST(x.keywords AS float8) AS keywords,
           CAST(x.recency AS float8) AS recency, CAST(x.neighbour AS float8) AS neighbour,
           CASE WHEN COALESCE(CAST(x.neighbour AS float8), 0) > COALESCE(x.similarity, 0) + COALESCE(x.keywords, 0) + COALESCE(x.recency, 0) THEN 'neighbour' ELSE 'match' END AS reason
    FROM (
        SELECT h.id, h.user_id, h.score, COALESCE(CAST(:vector_weight AS float8) / (:rrf_k + v.rank), 0) AS similarity,
           COALESCE(CAST(:text_weight AS float8) / (:rrf_k + t.rank), 0) AS keywords,
           COALESCE(CAST(:recency_weight AS float8) / (:rrf_k + r.rank), 0) AS recency,
           0 AS neighbour
        FROM hits AS h
    LEFT JOIN by_vector AS v ON v.id = h.id AND v.user_id = h.user_id
    LEFT JOIN by_text AS t ON t.id = h.id AND t.user_id = h.user_id
    LEFT JOIN by_time AS r ON r.id = h.id AND r.user_id = h.user_id
    ) AS x
)

-- explained_signals(hybrid, score)
relevance_map AS MATERIALIZED (
    SELECT jsonb_object_agg(CAST(b.id AS text), b.relevance) AS relevance FROM bm25 AS b
    WHERE (b.id, b.user_id) IN (SELECT h.id, h.user_id FROM hits AS h)
),
explained AS (
    SELECT x.id, x.user_id, x.score,
           CAST(x.similarity AS float8) AS similarity, CAST(x.keywords AS float8) AS keywords,
           CAST(x.recency AS float8) AS recency, CAST(GREATEST(x.score - (COALESCE(x.similarity, 0) + COALESCE(x.keywords, 0) + COALESCE(x.recency, 0)), 0) AS float8) AS neighbour,
           CASE WHEN COALESCE(CAST(GREATEST(x.score - (COALESCE(x.similarity, 0) + COALESCE(x.keywords, 0) + COALESCE(x.recency, 0)), 0) AS float8), 0) > COALESCE(x.similarity, 0) + COALESCE(x.keywords, 0) + COALESCE(x.recency, 0) THEN 'neighbour' ELSE 'match' END AS reason
    FROM (
        SELECT h.id, h.user_id, h.score, CAST(:vector_weight AS float8)
               * COALESCE((s.dmax - (h.embedding <=> :query)) / NULLIF(s.dmax - s.dmin, 0), 1)
               AS similarity,
           CAST(:text_weight AS float8)
               * COALESCE(CAST(k.relevance ->> CAST(h.id AS text) AS float8)
                          / NULLIF(s.rmax, 0), 0) AS keywords,
           CAST(:recency_weight AS float8)
               * COALESCE(CAST(EXTRACT(EPOCH FROM h.created_at - s.tmin) AS float8)
                          / NULLIF(CAST(EXTRACT(EPOCH FROM s.tmax - s.tmin) AS float8), 0),
                          1) AS recency,
           CAST(NULL AS float8) AS neighbour
        FROM hits AS h CROSS JOIN spread AS s CROSS JOIN relevance_map AS k
    ) AS x
)

