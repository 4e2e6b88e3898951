-- budget_stages()
stage_a AS MATERIALIZED (
    SELECT y.*, CASE WHEN y.room >= y.need THEN y.need
                     WHEN y.room >= CAST(:min_cap AS bigint) THEN y.room END AS cap
    FROM (
        SELECT x.*, CAST((CAST(:half AS bigint) - CAST(:fixed AS bigint) - CAST(:related_cost AS bigint)) - sum(x.need + 1) OVER (ORDER BY x.ord) + x.need AS bigint)
               AS room
        FROM matches AS x
    ) AS y
),
used_a AS MATERIALIZED (
    SELECT count(cap) AS n, count(*) AS total,
           COALESCE(sum(cap + 1), 0)
               + CASE WHEN count(cap) > 0 THEN CAST(:related_cost AS bigint) ELSE 0 END AS used
    FROM stage_a
),
stage_b AS MATERIALIZED (
    SELECT y.*, CASE WHEN y.room >= y.need THEN y.need
                     WHEN y.room >= CAST(:min_cap AS bigint) THEN y.room END AS cap
    FROM (
        SELECT x.*, CAST((CAST(:max_tokens AS bigint) - CAST(:fixed AS bigint) - (SELECT used FROM used_a) - CAST(:recent_cost AS bigint)) - sum(x.need + 1) OVER (ORDER BY x.pos) + x.need AS bigint)
               AS room
        FROM recent AS x
        WHERE NOT x.seen
    ) AS y
),
used_b AS MATERIALIZED (
    SELECT count(cap) AS n, count(*) AS total,
           COALESCE(sum(cap + 1), 0)
               + CASE WHEN count(cap) > 0 THEN CAST(:recent_cost AS bigint) ELSE 0 END AS used
    FROM stage_b
),
stage_c AS MATERIALIZED (
    SELECT y.*, CASE WHEN y.room >= y.need THEN y.need
                     WHEN y.room >= CAST(:min_cap AS bigint) THEN y.room END AS cap
    FROM (
        SELECT x.*, CAST((CAST(:max_tokens AS bigint) - CAST(:fixed AS bigint) - (SELECT used FROM used_a) - (SELECT used FROM used_b) - CASE WHEN (SELECT n FROM used_a) = 0 THEN CAST(:related_cost AS bigint) ELSE 0 END) - sum(x.need + 1) OVER (ORDER BY x.ord) + x.need AS bigint)
               AS room
        FROM matches AS x
        WHERE x.ord > (SELECT n FROM used_a) AND (SELECT n = total FROM used_b)
    ) AS y
)

