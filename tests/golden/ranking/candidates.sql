-- vector_candidates(('user_id',), covering=True, windowed=False)
candidates AS (
    SELECT m.id, m.user_id, m.created_at, (m.embedding <=> :query) + 0 AS distance
    FROM pgmemory_memories AS m
    WHERE m.collection = :collection
      AND m.user_id = :user_id
      AND vector_dims(m.embedding) <= 512
      AND (m.expires_at IS NULL OR m.expires_at > now())
)

-- vector_candidates(('session_id',), covering=False, windowed=True)
candidates AS (
    SELECT m.id, m.user_id, m.created_at, (m.embedding <=> :query) + 0 AS distance
    FROM pgmemory_memories AS m
    WHERE m.collection = :collection
      AND m.session_id = :session_id
      AND (m.expires_at IS NULL OR m.expires_at > now())
      AND m.created_at >= :since AND m.created_at < :until
)

-- vector_candidates(user, conversation, materialized)
candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at, m.application_id, m.agent_id, m.session_id, (m.embedding <=> :query) + 0 AS distance
    FROM pgmemory_memories AS m
    WHERE m.collection = :collection
      AND m.user_id = :user_id
      AND vector_dims(m.embedding) <= 512
      AND (m.expires_at IS NULL OR m.expires_at > now())
)

-- vector_candidates(user, ann 384)
candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at,
           CAST(m.embedding AS vector(384)) <=> CAST(:query AS vector(384)) AS distance
    FROM pgmemory_memories AS m
    WHERE m.collection = :collection
      AND m.user_id = :user_id
      AND (m.expires_at IS NULL OR m.expires_at > now())
    ORDER BY CAST(m.embedding AS vector(384)) <=> CAST(:query AS vector(384))
    LIMIT :ann_candidates
)

-- vector_candidates(user, shortlist codes)
shortlist AS MATERIALIZED (
    SELECT m.id, m.user_id
    FROM pgmemory_memories AS m
    WHERE m.collection = :collection
      AND m.user_id = :user_id
      AND (m.expires_at IS NULL OR m.expires_at > now())
    ORDER BY m.embedding_code <~> (SELECT binary_quantize(CAST(:query AS vector))), m.id
    LIMIT :shortlist
),
candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at, m.distance
    FROM shortlist AS s
    CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, m.created_at, (m.embedding <=> :query) + 0 AS distance
        FROM pgmemory_memories AS m
        WHERE m.id = s.id AND m.user_id = s.user_id
          AND m.user_id = :user_id
        OFFSET 0
    ) AS m
)

-- vector_candidates(user, shortlist halves)
shortlist AS MATERIALIZED (
    SELECT m.id, m.user_id
    FROM pgmemory_memories AS m
    WHERE m.collection = :collection
      AND m.user_id = :user_id
      AND m.embedding_half IS NOT NULL
      AND (m.expires_at IS NULL OR m.expires_at > now())
    ORDER BY m.embedding_half <#> (SELECT CAST(l2_normalize(CAST(:query AS vector)) AS halfvec)), m.id
    LIMIT :shortlist
),
candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at, m.distance
    FROM shortlist AS s
    CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, m.created_at, (m.embedding <=> :query) + 0 AS distance
        FROM pgmemory_memories AS m
        WHERE m.id = s.id AND m.user_id = s.user_id
          AND m.user_id = :user_id
        OFFSET 0
    ) AS m
)

