"""The keyword side of a ranking: BM25 of the query's terms over the scope (``by_text``),
exact or, in a large user scope, from a bounded pool.
"""

from __future__ import annotations

from pgmemory.store._ranking.scope import LIVE, read_back, scope_and_window

#: The query's keywords as a tsquery, for the keyword test of a scope without a user.
_QUERY_TSQUERY = "(SELECT websearch_to_tsquery('simple', :terms))"


#: A user scope of more live rows than this ranks its keyword matches from a bounded pool
#: (:func:`keyword_ranking`); up to this many, BM25 is exact over every matching row.
KEYWORD_BOUND_FROM = 2_000
#: In a bounded keyword ranking, the rows read per query term (and a term found in fewer of
#: the scope's rows than this is one of its rare terms).
KEYWORD_TERM_ROWS = 800

#: A user scope's query keys: each query term keyed by its collection and user (migration 0018)
#: as the scoped term index holds them, worked out once.
_QUERY_KEYS = """(SELECT pgmemory_scope_terms(:collection, :user_id, to_tsvector(
                 'simple', array_to_string(CAST(:term_list AS text[]), ' '))))"""

#: A query term (``{term}``, a lexeme) as a one-term tsquery: quoted as tsquery input quotes
#: an operand (a backslash, chr(92), or a quote escaped), so the lexeme is taken whole, never
#: parsed (no backslash in the statement's text: it reads the same whatever
#: ``standard_conforming_strings`` says).
_PROBE = """CAST('''' || replace(replace({term}, chr(92), chr(92) || chr(92)), '''', '''''')
                 || '''' AS tsquery)"""

#: How often a query term (its ``probe``) occurs in ``{vector}``, without unnesting the vector
#: (``unnest`` of a tsvector costs ~4 µs a row: it builds each lexeme's position and weight
#: arrays). ``ts_rank`` of one term with every weight 1 is H(tf) / ζ(2), H(n) = Σ 1/j² for
#: j ≤ n (PostgreSQL's ``calc_rank_or``); since 1 / (ζ(2) - H(n)) = n + 1/2 + O(1/n), the
#: count is recovered exactly up to 255, the most positions ``to_tsvector`` keeps of a lexeme
#: (tests/store/test_keywords.py). Stored vectors always carry positions.
_TERM_FREQUENCY = """round(1 / (1.64493406685
                          * (1 - CAST(ts_rank('{{1,1,1,1}}', {vector}, {probe}) AS float8)))
                     - 0.5)"""

#: A row's vector cut to the query's terms (the lexemes of ``query_terms``, which the term
#: index's reads use too): theirs marked with weight A, then kept by weight (stored vectors
#: carry the default weight D).
_HITS = """ts_filter(
               setweight(m.search_vector, 'A', (SELECT array_agg(q.term) FROM query_terms AS q)),
               '{a}') AS hits"""

#: Each query term found in each of ``tested``'s rows (``hits``: :data:`_HITS`), with its
#: frequency there: the row's own query terms, so the work is a row's matches, not every
#: query term tested against every row (a 500-term query over a large scope's pool).
_TESTED_PAIRS = f"""SELECT q.term, m.id, m.user_id, m.dl,
           {_TERM_FREQUENCY.format(vector="m.hits", probe="q.probe")} AS tf
    FROM tested AS m
    CROSS JOIN LATERAL unnest(tsvector_to_array(m.hits)) AS h(term)
    JOIN query_terms AS q ON q.term = h.term"""


def _term_rows(term_key: str, where: str, *, distributed: bool) -> tuple[str, str]:
    """The FROM and the WHERE's scope part for a user scope's rows matching ``term_key`` (a
    test of ``pgmemory_scope_terms`` that the scoped term index answers): the rows from that
    index alone, in a subquery with ``OFFSET 0``, the scope filtered above it; on Citus
    (``distributed``), whose routing needs ``m.user_id = :user_id`` on the table itself and
    whose plans know the values, the filter beside the key test (see :func:`keyword_ranking`)."""
    if distributed:
        return "pgmemory_memories AS m", f"{where}\n      AND {term_key}"
    columns = "m.id, m.user_id, m.collection, m.application_id, m.agent_id, m.session_id"
    return (
        f"""(
        SELECT {columns}, m.created_at, m.expires_at, m.search_vector
        FROM pgmemory_memories AS m
        WHERE {term_key}
        OFFSET 0
    ) AS m""",
        where,
    )


def keyword_ranking(
    dimensions: tuple[str, ...],
    *,
    windowed: bool,
    scope_from_candidates: bool,
    distributed: bool = False,
) -> str:
    """The ``by_text`` CTEs: BM25 (k1 1.2, b 0.75) of the query's terms (``:term_list``)
    over the scope, best ``:pool`` rows.

    BM25 is summed over ``pairs``: each query term found in a ranked row, with the row's
    length (its number of distinct terms) and the term's frequency in it
    (:data:`_TERM_FREQUENCY`). Document frequencies are counted among the pairs (a row without
    a term never matches it), N is the scope's size (counted from ``candidates`` when the
    statement has them), and the average length is over the ranked rows.

    In a user scope the pairs come from the scoped term index (``pgmemory_scope_terms``,
    migration 0018: its posting lists hold one collection's rows of one user, so the search
    reads no other user's matches), one read per query term: a row is read once for each
    query term it holds, and nothing of its vector is unnested. In a scope without a user,
    the scope's rows matching ``:terms`` (by ``@@``) are each cut to the query's terms and
    paired with the ones they hold (:data:`_TESTED_PAIRS`).

    A user scope of more than KEYWORD_BOUND_FROM live rows is ranked from a bounded pool
    instead, so that a recall does not read every row holding a common word: each query term's
    first KEYWORD_TERM_ROWS matching rows are read (``posting``); a term with fewer is rare,
    its rows and count exact. The pool is every row holding a rare term, and, when those are
    fewer than ``:pool``, the rows read for the common terms too; the pooled rows are paired
    with the query terms they hold as above. A common term's document frequency is estimated
    from its share of the pool (at least KEYWORD_TERM_ROWS), and the rows holding only common
    terms that were not read are not ranked by keywords. Measured against the exact ranking:
    docs/performance.md.

    In a user scope the matching rows come from the term index alone, the scope filtered
    above them (:func:`_term_rows`): with the scope's filter beside the key test, a generic
    plan, estimating a user's rows from the table's average, read the user's rows through an
    index on ``(collection, user_id)`` and worked out every row's term keys instead
    (``bench/store/generic_plans.py``: a keyword search of a 3,000-row user among 12,000 rows
    35.5 -> 3.4 ms under a generic plan).
    """
    where, window = scope_and_window(dimensions, windowed=windowed)
    scope_size = (
        "SELECT count(*) AS n FROM candidates"
        if scope_from_candidates
        else f"SELECT count(*) AS n FROM pgmemory_memories AS m WHERE {where} AND {LIVE}{window}"
    )
    length = "CAST(length(m.search_vector) AS float8) AS dl"
    if "user_id" not in dimensions:
        matched = f"""scope_n AS MATERIALIZED ({scope_size}),
query_terms AS MATERIALIZED (
    SELECT t.term, {_PROBE.format(term="t.term")} AS probe
    FROM unnest(tsvector_to_array(to_tsvector(
             'simple', array_to_string(CAST(:term_list AS text[]), ' ')))) AS t(term)
),
tested AS MATERIALIZED (
    SELECT m.id, m.user_id, {length}, {_HITS}
    FROM pgmemory_memories AS m
    WHERE {where}
      AND m.search_vector @@ {_QUERY_TSQUERY}
      AND {LIVE}{window}
),
pairs AS MATERIALIZED (
    {_TESTED_PAIRS}
),"""
        doc_freq = """doc_freq AS (
    SELECT term, CAST(count(*) AS float8) AS df FROM pairs GROUP BY term
),"""
    else:
        cap = KEYWORD_TERM_ROWS
        bounded = f"(SELECT n FROM scope_n) > {KEYWORD_BOUND_FROM}"
        keyed = "pgmemory_scope_terms(m.collection, m.user_id, m.search_vector) && ARRAY[q.key]"
        source, scoped = _term_rows(keyed, where, distributed=distributed)
        tf = _TERM_FREQUENCY.format(vector="m.search_vector", probe="q.probe")
        # Exactly one of the two parts of ``pairs`` runs (a one-time filter on the scope's
        # size): every row holding each query term, read per term; or the bounded pool's rows,
        # each paired with the query terms it holds. Every read repeats
        # ``m.user_id = :user_id`` (Citus routes by it).
        matched = f"""scope_n AS MATERIALIZED ({scope_size}),
query_terms AS MATERIALIZED (
    SELECT k.key, substr(k.key, 9) AS term, {_PROBE.format(term="substr(k.key, 9)")} AS probe
    FROM unnest({_QUERY_KEYS}) AS k(key)
),
posting AS MATERIALIZED (
    SELECT q.term, r.id, r.user_id
    FROM query_terms AS q CROSS JOIN LATERAL (
        SELECT m.id, m.user_id
        FROM {source}
        WHERE {scoped}
          AND {LIVE}{window}
        LIMIT {cap}
    ) AS r
    WHERE {bounded}
),
term_rows AS MATERIALIZED (
    SELECT term, count(*) AS n FROM posting GROUP BY term
),
rare_ids AS MATERIALIZED (
    SELECT DISTINCT p.id, p.user_id
    FROM posting AS p JOIN term_rows AS t USING (term)
    WHERE t.n < {cap}
),
pool_ids AS MATERIALIZED (
    SELECT id, user_id FROM rare_ids
    UNION
    SELECT id, user_id FROM posting WHERE (SELECT count(*) FROM rare_ids) < :pool
),
tested AS MATERIALIZED (
    SELECT m.id, m.user_id, m.dl, m.hits
    FROM pool_ids AS p
    {read_back("p", f"m.id, m.user_id, {length}, {_HITS}", routed=True)}
),
pairs AS MATERIALIZED (
    SELECT q.term, r.id, r.user_id, r.dl, r.tf
    FROM query_terms AS q CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, {length}, {tf} AS tf
        FROM {source}
        WHERE {scoped}
          AND {LIVE}{window}
    ) AS r
    WHERE NOT {bounded}
    UNION ALL
    {_TESTED_PAIRS}
),"""
        # A rare term's frequency is its count; a common one's, estimated from the pool.
        doc_freq = f"""doc_freq AS (
    SELECT d.term,
           CAST(CASE WHEN t.n IS NULL OR t.n < {cap} THEN d.rows
                     ELSE GREATEST({cap}, d.rows * (SELECT n FROM scope_n)
                                          / GREATEST((SELECT rows FROM ranked), 1))
                END AS float8) AS df
    FROM (SELECT term, count(*) AS rows FROM pairs GROUP BY term) AS d
    LEFT JOIN term_rows AS t ON t.term = d.term
),"""
    # A pair's share: idf * tf * (k1 + 1) / (tf + k1 * (1 - b) + k1 * b * dl / avgdl), with
    # k1 = 1.2 and b = 0.75: 2.2, 0.3, and ``per_term`` = 0.9 / avgdl, worked out once.
    return f"""{matched}
ranked AS MATERIALIZED (
    SELECT count(*) AS rows, CAST(avg(dl) AS float8) AS avgdl
    FROM (SELECT DISTINCT id, user_id, dl FROM pairs) AS r
),
{doc_freq}
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
)"""
