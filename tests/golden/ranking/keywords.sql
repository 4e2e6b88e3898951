-- keyword_ranking(('user_id',), from candidates=False, distributed=False)
scope_n AS MATERIALIZED (SELECT count(*) AS n FROM pgmemory_memories AS m WHERE m.collection = :collection
      AND m.user_id = :user_id AND (m.expires_at IS NULL OR m.expires_at > now())),
query_terms AS MATERIALIZED (
    SELECT k.key, substr(k.key, 9) AS term, CAST('''' || replace(replace(substr(k.key, 9), chr(92), chr(92) || chr(92)), '''', '''''')
                 || '''' AS tsquery) AS probe
    FROM unnest((SELECT pgmemory_scope_terms(:collection, :user_id, to_tsvector(
                 'simple', array_to_string(CAST(:term_list AS text[]), ' '))))) AS k(key)
),
posting AS MATERIALIZED (
    SELECT q.term, r.id, r.user_id
    FROM query_terms AS q CROSS JOIN LATERAL (
        SELECT m.id, m.user_id
        FROM (
        SELECT m.id, m.user_id, m.collection, m.application_id, m.agent_id, m.session_id, m.created_at, m.expires_at, m.search_vector
        FROM pgmemory_memories AS m
        WHERE pgmemory_scope_terms(m.collection, m.user_id, m.search_vector) && ARRAY[q.key]
        OFFSET 0
    ) AS m
        WHERE m.collection = :collection
      AND m.user_id = :user_id
          AND (m.expires_at IS NULL OR m.expires_at > now())
        LIMIT 800
    ) AS r
    WHERE (SELECT n FROM scope_n) > 2000
),
term_rows AS MATERIALIZED (
    SELECT term, count(*) AS n FROM posting GROUP BY term
),
rare_ids AS MATERIALIZED (
    SELECT DISTINCT p.id, p.user_id
    FROM posting AS p JOIN term_rows AS t USING (term)
    WHERE t.n < 800
),
pool_ids AS MATERIALIZED (
    SELECT id, user_id FROM rare_ids
    UNION
    SELECT id, user_id FROM posting WHERE (SELECT count(*) FROM rare_ids) < :pool
),
tested AS MATERIALIZED (
    SELECT m.id, m.user_id, m.dl, m.hits
    FROM pool_ids AS p
    CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, CAST(length(m.search_vector) AS float8) AS dl, ts_filter(
               setweight(m.search_vector, 'A', (SELECT array_agg(q.term) FROM query_terms AS q)),
               '{a}') AS hits
        FROM pgmemory_memories AS m
        WHERE m.id = p.id AND m.user_id = p.user_id
          AND m.user_id = :user_id
        OFFSET 0
    ) AS m
),
pairs AS MATERIALIZED (
    SELECT q.term, r.id, r.user_id, r.dl, r.tf
    FROM query_terms AS q CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, CAST(length(m.search_vector) AS float8) AS dl, round(1 / (1.64493406685
                          * (1 - CAST(ts_rank('{1,1,1,1}', m.search_vector, q.probe) AS float8)))
                     - 0.5) AS tf
        FROM (
        SELECT m.id, m.user_id, m.collection, m.application_id, m.agent_id, m.session_id, m.created_at, m.expires_at, m.search_vector
        FROM pgmemory_memories AS m
        WHERE pgmemory_scope_terms(m.collection, m.user_id, m.search_vector) && ARRAY[q.key]
        OFFSET 0
    ) AS m
        WHERE m.collection = :collection
      AND m.user_id = :user_id
          AND (m.expires_at IS NULL OR m.expires_at > now())
    ) AS r
    WHERE NOT (SELECT n FROM scope_n) > 2000
    UNION ALL
    SELECT q.term, m.id, m.user_id, m.dl,
           round(1 / (1.64493406685
                          * (1 - CAST(ts_rank('{1,1,1,1}', m.hits, q.probe) AS float8)))
                     - 0.5) AS tf
    FROM tested AS m
    CROSS JOIN LATERAL unnest(tsvector_to_array(m.hits)) AS h(term)
    JOIN query_terms AS q ON q.term = h.term
),
ranked AS MATERIALIZED (
    SELECT count(*) AS rows, CAST(avg(dl) AS float8) AS avgdl
    FROM (SELECT DISTINCT id, user_id, dl FROM pairs) AS r
),
doc_freq AS (
    SELECT d.term,
           CAST(CASE WHEN t.n IS NULL OR t.n < 800 THEN d.rows
                     ELSE GREATEST(800, d.rows * (SELECT n FROM scope_n)
                                          / GREATEST((SELECT rows FROM ranked), 1))
                END AS float8) AS df
    FROM (SELECT term, count(*) AS rows FROM pairs GROUP BY term) AS d
    LEFT JOIN term_rows AS t ON t.term = d.term
),
idf AS MATERIALIZED (
    SELECT f.term, ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5)) AS idf
    FROM doc_freq AS f CROSS JOIN (SELECT CAST(n AS float8) AS n FROM scope_n) AS c
),
length_norm AS (
    SELECT 1.2 * 0.75 / avgdl AS per_term FROM ranked
),
bm25 AS (
    SELECT p.id, p.user_id,
           sum(i.idf * p.tf * 2.2 / (p.tf + 0.3 + l.per_term * p.dl)) AS relevance
    FROM pairs AS p JOIN idf AS i USING (term) CROSS JOIN length_norm AS l
    GROUP BY p.id, p.user_id
),
by_text AS (
    SELECT id, user_id, relevance, row_number() OVER (ORDER BY relevance DESC, id) AS rank
    FROM bm25
    ORDER BY relevance DESC, id
    LIMIT :pool
)

-- keyword_ranking(('user_id',), from candidates=True, distributed=True)
scope_n AS MATERIALIZED (SELECT count(*) AS n FROM candidates),
query_terms AS MATERIALIZED (
    SELECT k.key, substr(k.key, 9) AS term, CAST('''' || replace(replace(substr(k.key, 9), chr(92), chr(92) || chr(92)), '''', '''''')
                 || '''' AS tsquery) AS probe
    FROM unnest((SELECT pgmemory_scope_terms(:collection, :user_id, to_tsvector(
                 'simple', array_to_string(CAST(:term_list AS text[]), ' '))))) AS k(key)
),
posting AS MATERIALIZED (
    SELECT q.term, r.id, r.user_id
    FROM query_terms AS q CROSS JOIN LATERAL (
        SELECT m.id, m.user_id
        FROM pgmemory_memories AS m
        WHERE m.collection = :collection
      AND m.user_id = :user_id
      AND pgmemory_scope_terms(m.collection, m.user_id, m.search_vector) && ARRAY[q.key]
          AND (m.expires_at IS NULL OR m.expires_at > now())
        LIMIT 800
    ) AS r
    WHERE (SELECT n FROM scope_n) > 2000
),
term_rows AS MATERIALIZED (
    SELECT term, count(*) AS n FROM posting GROUP BY term
),
rare_ids AS MATERIALIZED (
    SELECT DISTINCT p.id, p.user_id
    FROM posting AS p JOIN term_rows AS t USING (term)
    WHERE t.n < 800
),
pool_ids AS MATERIALIZED (
    SELECT id, user_id FROM rare_ids
    UNION
    SELECT id, user_id FROM posting WHERE (SELECT count(*) FROM rare_ids) < :pool
),
tested AS MATERIALIZED (
    SELECT m.id, m.user_id, m.dl, m.hits
    FROM pool_ids AS p
    CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, CAST(length(m.search_vector) AS float8) AS dl, ts_filter(
               setweight(m.search_vector, 'A', (SELECT array_agg(q.term) FROM query_terms AS q)),
               '{a}') AS hits
        FROM pgmemory_memories AS m
        WHERE m.id = p.id AND m.user_id = p.user_id
          AND m.user_id = :user_id
        OFFSET 0
    ) AS m
),
pairs AS MATERIALIZED (
    SELECT q.term, r.id, r.user_id, r.dl, r.tf
    FROM query_terms AS q CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, CAST(length(m.search_vector) AS float8) AS dl, round(1 / (1.64493406685
                          * (1 - CAST(ts_rank('{1,1,1,1}', m.search_vector, q.probe) AS float8)))
                     - 0.5) AS tf
        FROM pgmemory_memories AS m
        WHERE m.collection = :collection
      AND m.user_id = :user_id
      AND pgmemory_scope_terms(m.collection, m.user_id, m.search_vector) && ARRAY[q.key]
          AND (m.expires_at IS NULL OR m.expires_at > now())
    ) AS r
    WHERE NOT (SELECT n FROM scope_n) > 2000
    UNION ALL
    SELECT q.term, m.id, m.user_id, m.dl,
           round(1 / (1.64493406685
                          * (1 - CAST(ts_rank('{1,1,1,1}', m.hits, q.probe) AS float8)))
                     - 0.5) AS tf
    FROM tested AS m
    CROSS JOIN LATERAL unnest(tsvector_to_array(m.hits)) AS h(term)
    JOIN query_terms AS q ON q.term = h.term
),
ranked AS MATERIALIZED (
    SELECT count(*) AS rows, CAST(avg(dl) AS float8) AS avgdl
    FROM (SELECT DISTINCT id, user_id, dl FROM pairs) AS r
),
doc_freq AS (
    SELECT d.term,
           CAST(CASE WHEN t.n IS NULL OR t.n < 800 THEN d.rows
                     ELSE GREATEST(800, d.rows * (SELECT n FROM scope_n)
                                          / GREATEST((SELECT rows FROM ranked), 1))
                END AS float8) AS df
    FROM (SELECT term, count(*) AS rows FROM pairs GROUP BY term) AS d
    LEFT JOIN term_rows AS t ON t.term = d.term
),
idf AS MATERIALIZED (
    SELECT f.term, ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5)) AS idf
    FROM doc_freq AS f CROSS JOIN (SELECT CAST(n AS float8) AS n FROM scope_n) AS c
),
length_norm AS (
    SELECT 1.2 * 0.75 / avgdl AS per_term FROM ranked
),
bm25 AS (
    SELECT p.id, p.user_id,
           sum(i.idf * p.tf * 2.2 / (p.tf + 0.3 + l.per_term * p.dl)) AS relevance
    FROM pairs AS p JOIN idf AS i USING (term) CROSS JOIN length_norm AS l
    GROUP BY p.id, p.user_id
),
by_text AS (
    SELECT id, user_id, relevance, row_number() OVER (ORDER BY relevance DESC, id) AS rank
    FROM bm25
    ORDER BY relevance DESC, id
    LIMIT :pool
)

-- keyword_ranking(('session_id',), from candidates=True, distributed=False)
scope_n AS MATERIALIZED (SELECT count(*) AS n FROM candidates),
query_terms AS MATERIALIZED (
    SELECT t.term, CAST('''' || replace(replace(t.term, chr(92), chr(92) || chr(92)), '''', '''''')
                 || '''' AS tsquery) AS probe
    FROM unnest(tsvector_to_array(to_tsvector(
             'simple', array_to_string(CAST(:term_list AS text[]), ' ')))) AS t(term)
),
tested AS MATERIALIZED (
    SELECT m.id, m.user_id, CAST(length(m.search_vector) AS float8) AS dl, ts_filter(
               setweight(m.search_vector, 'A', (SELECT array_agg(q.term) FROM query_terms AS q)),
               '{a}') AS hits
    FROM pgmemory_memories AS m
    WHERE m.collection = :collection
      AND m.session_id = :session_id
      AND m.search_vector @@ (SELECT websearch_to_tsquery('simple', :terms))
      AND (m.expires_at IS NULL OR m.expires_at > now())
),
pairs AS MATERIALIZED (
    SELECT q.term, m.id, m.user_id, m.dl,
           round(1 / (1.64493406685
                          * (1 - CAST(ts_rank('{1,1,1,1}', m.hits, q.probe) AS float8)))
                     - 0.5) AS tf
    FROM tested AS m
    CROSS JOIN LATERAL unnest(tsvector_to_array(m.hits)) AS h(term)
    JOIN query_terms AS q ON q.term = h.term
),
ranked AS MATERIALIZED (
    SELECT count(*) AS rows, CAST(avg(dl) AS float8) AS avgdl
    FROM (SELECT DISTINCT id, user_id, dl FROM pairs) AS r
),
doc_freq AS (
    SELECT term, CAST(count(*) AS float8) AS df FROM pairs GROUP BY term
),
idf AS MATERIALIZED (
    SELECT f.term, ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5)) AS idf
    FROM doc_freq AS f CROSS JOIN (SELECT CAST(n AS float8) AS n FROM scope_n) AS c
),
length_norm AS (
    SELECT 1.2 * 0.75 / avgdl AS per_term FROM ranked
),
bm25 AS (
    SELECT p.id, p.user_id,
           sum(i.idf * p.tf * 2.2 / (p.tf + 0.3 + l.per_term * p.dl)) AS relevance
    FROM pairs AS p JOIN idf AS i USING (term) CROSS JOIN length_norm AS l
    GROUP BY p.id, p.user_id
),
by_text AS (
    SELECT id, user_id, relevance, row_number() OVER (ORDER BY relevance DESC, id) AS rank
    FROM bm25
    ORDER BY relevance DESC, id
    LIMIT :pool
)

