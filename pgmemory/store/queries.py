"""Every SQL statement the store issues, each with a one-line purpose.

All statements are parameterised. The only text ever spliced into a statement is chosen from
the fixed fragments below (scope column predicates, the covering-index guard); nothing that a
caller passes becomes part of SQL text.
"""

from __future__ import annotations

from functools import lru_cache

from pgmemory.store.columns import (
    MEMORY_COLUMNS,
    POSITION,
    READ_COLUMNS,
    SENT_COLUMNS,
    STAGING_COLUMNS,
)
from pgmemory.store.models import COVERING_MAX_DIMENSIONS

# --- collections ---------------------------------------------------------------------------

#: Register a collection; an existing one is left as it is (the caller compares).
INSERT_COLLECTION = """
INSERT INTO pgmemory_collections (name, dimensions, embedding_model)
VALUES (:name, :dimensions, :embedding_model)
ON CONFLICT (name) DO NOTHING
"""

#: Read one collection's catalogue entry.
GET_COLLECTION = """
SELECT name, dimensions, embedding_model, created_at
FROM pgmemory_collections WHERE name = :name
"""

#: List the catalogue.
LIST_COLLECTIONS = """
SELECT name, dimensions, embedding_model, created_at FROM pgmemory_collections ORDER BY name
"""

#: Remove a collection's catalogue entry (its memories are deleted first, with audit).
DELETE_COLLECTION = "DELETE FROM pgmemory_collections WHERE name = :name"

# --- memories: writes ----------------------------------------------------------------------

# The column lists below are derived from pgmemory.store.columns, where each column is defined.
_INSERT_COLUMNS = ", ".join(c.name for c in MEMORY_COLUMNS)
_SENT_VALUES = ", ".join(STAGING_COLUMNS)
_SENT_ARRAYS = ",\n        ".join(f"CAST(:{c.batch} AS {c.value_type}[])" for c in SENT_COLUMNS)
_STAGING_DEFINITION = ",\n    ".join(f"{c.value_name} {c.value_type}" for c in SENT_COLUMNS)
#: A message is stored once per collection and scope (the partial unique index).
_SKIP_STORED_MESSAGES = """ON CONFLICT (collection, user_id, application_id, agent_id, session_id, message_id)
        WHERE message_id IS NOT NULL DO NOTHING"""

#: What a write or delete returns for its audit rows.
_AUDITED = "id, user_id, collection, application_id, agent_id, session_id, content_sha256"


#: The audit's content hash: keyed with the user's secret (created on first use), so it cannot
#: confirm a guessed text once erasure has destroyed the secret (migration 0006).
_KEYED_CONTENT = "pgmemory_keyed_sha256(user_id, content_sha256)"


def _audited(change: str, operation: str) -> str:
    """``change`` (an INSERT or DELETE of memories) plus one audit row per changed memory, in
    the same statement: the audit row exists exactly when the change commits. The statement
    returns the changed memories' ids."""
    return f"""
WITH changed AS ({change}
    RETURNING {_AUDITED}
)
INSERT INTO pgmemory_memory_audit
    (user_id, operation, memory_id, collection, application_id, agent_id, session_id,
     content_sha256, actor)
SELECT user_id, '{operation}', id, collection, application_id, agent_id, session_id,
       {_KEYED_CONTENT}, :actor
FROM changed
RETURNING memory_id
"""


def _insert_memories(source: str, alias: str, *, where: str = "", ordered: bool = True) -> str:
    """INSERT the rows of ``source`` (which names its values ``alias``), skipping stored messages.

    Rows go in in the order of the message key (the unique index's columns, compared bytewise
    as Python compares str), then by position: two transactions writing the same messages
    then claim them in the same order, so one waits for the other instead of both waiting for
    each other (a deadlock). ``writes.add`` sorts its chunks the same way. Unless ``ordered`` is
    off: for rows without a message id (``where``), which cannot conflict.
    """
    values = ",\n           ".join(c.stored_from(alias) for c in MEMORY_COLUMNS)
    order = ", ".join(
        [f'{alias}.{c} COLLATE "C"' for c in MESSAGE_KEY] + [f"{alias}.{POSITION.value_name}"]
    )
    clauses = [f"FROM {source}"]
    if where:
        clauses.append(f"WHERE {where}")
    if ordered:
        clauses.append(f"ORDER BY {order}")
    clauses.append(_SKIP_STORED_MESSAGES)
    body = "\n    ".join(clauses)
    return f"""
    INSERT INTO pgmemory_memories ({_INSERT_COLUMNS})
    SELECT {values}
    {body}"""


#: The unique message key within a collection, in the order rows are inserted by.
MESSAGE_KEY = ("user_id", "application_id", "agent_id", "session_id", "message_id")

#: Insert a batch given as parallel arrays, in message-key order, auditing each row, in one
#: statement; a record whose message id the collection already holds in the scope is skipped.
INSERT_MEMORIES = _audited(
    _insert_memories(
        f"""unnest(
        {_SENT_ARRAYS}
    ) AS r({_SENT_VALUES})""",
        "r",
    ),
    "insert",
)

#: A bulk import may run longer than the interactive statement timeout (this transaction only).
NO_STATEMENT_TIMEOUT = "SET LOCAL statement_timeout = 0"

#: Staging table for binary COPY imports; dropped at commit.
CREATE_STAGING = f"""
CREATE TEMPORARY TABLE pgmemory_import (
    {_STAGING_DEFINITION}
) ON COMMIT DROP
"""

#: Binary COPY into the staging table.
COPY_STAGING = f"COPY pgmemory_import ({_SENT_VALUES}) FROM STDIN (FORMAT BINARY)"

#: Move the staged rows that carry a message id into the collection, in message-key order,
#: auditing each row, in one statement (skipping messages already stored, as above).
INSERT_FROM_STAGING = _audited(
    _insert_memories("pgmemory_import AS s", "s", where="s.message_id IS NOT NULL"), "insert"
)

#: Move the staged rows without a message id (they cannot conflict: no sort), auditing each.
INSERT_FROM_STAGING_UNKEYED = _audited(
    _insert_memories("pgmemory_import AS s", "s", where="s.message_id IS NULL", ordered=False),
    "insert",
)

# --- memories: scoped statements -----------------------------------------------------------
# A scope's set dimensions become `m.<col> = :<col>` (the columns are NOT NULL, so a B-tree
# serves them); unset dimensions are not filtered. The variants are built once per shape.

_SCOPE_PREDICATE = {
    "application_id": "m.application_id = :application_id",
    "agent_id": "m.agent_id = :agent_id",
    "user_id": "m.user_id = :user_id",
    "session_id": "m.session_id = :session_id",
}
_LIVE = "(m.expires_at IS NULL OR m.expires_at > now())"
_READ_COLUMNS = ", ".join(f"m.{c.name}" for c in READ_COLUMNS)


def _scope_where(dimensions: tuple[str, ...]) -> str:
    predicates = ["m.collection = :collection"]
    predicates += [_SCOPE_PREDICATE[d] for d in dimensions]  # KeyError for anything else
    return "\n      AND ".join(predicates)


#: A condition that is always true and lets the statement's transaction commit without waiting
#: for the disk flush (``synchronous_commit`` off, local to the transaction): for statements that
#: write nothing but recall-audit rows (memories always commit synchronously). Being part of
#: the statement, it costs no round trip of its own.
_RELAX_COMMIT = "set_config('synchronous_commit', 'off', true) IS NOT NULL"

#: Search modes: cosine similarity only, keyword match only, or both fused (with recency).
SEARCH_MODES = ("vector", "text", "hybrid")


#: Hybrid fusions: normalised scores summed ("score", the default) or reciprocal ranks ("rank").
FUSIONS = ("score", "rank")

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
_SCORE_PARTS = """spread AS MATERIALIZED (
    SELECT min(distance) AS dmin, max(distance) AS dmax,
           min(created_at) AS tmin, max(created_at) AS tmax,
           (SELECT max(relevance) FROM bm25) AS rmax
    FROM candidates
),
fused AS (
    SELECT id, user_id, sum(part) AS score, bool_or(pooled) AS pooled{keys}
    FROM (
        SELECT c.id, c.user_id, false AS pooled,
               CAST(:vector_weight AS float8)
                   * COALESCE((s.dmax - c.distance) / NULLIF(s.dmax - s.dmin, 0), 1)
               + CAST(:recency_weight AS float8)
                   * COALESCE(CAST(EXTRACT(EPOCH FROM c.created_at - s.tmin) AS float8)
                              / NULLIF(CAST(EXTRACT(EPOCH FROM s.tmax - s.tmin) AS float8), 0),
                              1) AS part{columns}
        FROM candidates AS c CROSS JOIN spread AS s
        UNION ALL
        SELECT b.id, b.user_id, false,
               CAST(:text_weight AS float8) * COALESCE(b.relevance / NULLIF(s.rmax, 0), 0){nulls}
        FROM bm25 AS b CROSS JOIN spread AS s
        UNION ALL
        SELECT id, user_id, true, 0{nulls} FROM by_vector WHERE CAST(:vector_weight AS float8) > 0
        UNION ALL
        SELECT id, user_id, true, 0{nulls} FROM by_text WHERE CAST(:text_weight AS float8) > 0
        UNION ALL
        SELECT id, user_id, true, 0{nulls} FROM by_time WHERE CAST(:recency_weight AS float8) > 0
    ) AS parts
    GROUP BY id, user_id{having}
)"""

#: The columns that say which conversation a memory belongs to, and its place in it.
_CONVERSATION = ("application_id", "agent_id", "session_id", "created_at")

_SCORE_FUSION = (
    _SCORE_PARTS.format(keys="", columns="", nulls="", having="\n    HAVING bool_or(pooled)")
    + """,
top AS (
    SELECT id, user_id, CAST(score AS real) AS score
    FROM fused
    ORDER BY score DESC, id
    LIMIT :limit
)"""
)

# ... and with neighbours: each row also gets :neighbour_weight times the better fused score
# of the rows just before and after it in its conversation (the window over every scope row,
# partitioned by user, application, agent and session, in created_at order), and the pooled
# rows' neighbours join the candidates. Every scope row is in ``fused`` (through
# ``candidates``), so the window sees the whole conversation, and nothing outside the scope.
_SCORE_FUSION_NEIGHBOURS = (
    _SCORE_PARTS.format(
        keys="".join(f",\n           max({c}) AS {c}" for c in _CONVERSATION),
        columns=",\n               " + ", ".join(f"c.{c}" for c in _CONVERSATION),
        nulls=", NULL, NULL, NULL, CAST(NULL AS timestamptz)",
        having="",
    )
    + """,
near AS (
    SELECT id, user_id, score, pooled,
           lag(score) OVER conversation AS score_before,
           lead(score) OVER conversation AS score_after,
           lag(pooled) OVER conversation AS pooled_before,
           lead(pooled) OVER conversation AS pooled_after
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
    WHERE pooled OR pooled_before OR pooled_after
    ORDER BY score DESC, id
    LIMIT :limit
)"""
)


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
    relax_commit: bool = False,
    windowed: bool = False,
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
    statement names no time bound at all: a prepared statement runs a generic plan after five
    runs, and a generic plan prices ``created_at >= $n AND created_at < $m`` as selective, so
    it took the (user, created_at) index and fetched every scope row from the heap (about
    4–6 µs per row instead of the covering scan's 1–1.5).
    Unless ``audit`` is off, the same statement appends the recall audit row; with
    ``relax_commit`` it also lets its transaction commit without waiting for the disk flush
    (:data:`_RELAX_COMMIT`, so a search in autocommit is one statement).

    ``ann_dimensions`` (vector mode only) switches to the approximate path for large scopes:
    the candidates come from the collection's HNSW index (an expression index on
    ``embedding::vector(D)``, see :func:`ann_index_ddl`) with the scope filter applied inside
    the index scan, ``:ann_candidates`` of them (run with ANN_SETTINGS: iterative scan, so the
    scan keeps walking until enough rows pass the filter), then re-ranked exactly.
    """
    where = _scope_where(dimensions)
    guard = f"\n      AND vector_dims(m.embedding) <= {COVERING_MAX_DIMENSIONS}" if covering else ""
    window = "\n      AND m.created_at >= :since AND m.created_at < :until" if windowed else ""
    if neighbours and (mode != "hybrid" or fusion != "score"):
        raise ValueError("neighbours are part of mode='hybrid' with fusion='score' only")
    # the conversation of each row, for the neighbours' window (key columns of the covering
    # index, so the scan stays index-only)
    conversation = ", m.application_id, m.agent_id, m.session_id" if neighbours else ""
    materialized = "" if mode == "vector" else "MATERIALIZED "
    candidates = f"""candidates AS {materialized}(
    SELECT m.id, m.user_id, m.created_at{conversation}, (m.embedding <=> :query) + 0 AS distance
    FROM pgmemory_memories AS m
    WHERE {where}{guard}
      AND {_LIVE}{window}
)"""
    # Keyword ranking: BM25 (k1 1.2, b 0.75) over the scope. The rows matching any query term
    # come through the GIN index; document frequencies are counted among them (a row without
    # a term never matches it), N is the scope's size, and a row's length is its number of
    # distinct terms, against the average over the matching rows.
    scope_size = (
        "SELECT count(*) AS n FROM candidates"
        if mode == "hybrid"
        else f"SELECT count(*) AS n FROM pgmemory_memories AS m WHERE {where} AND {_LIVE}{window}"
    )
    by_text = f"""matched AS MATERIALIZED (
    SELECT m.id, m.user_id, m.search_vector, length(m.search_vector) AS dl
    FROM pgmemory_memories AS m
    WHERE {where}
      AND m.search_vector @@ websearch_to_tsquery('simple', :terms)
      AND {_LIVE}{window}
),
term_hits AS (
    SELECT d.id, d.user_id, d.dl, t.lexeme,
           CAST(COALESCE(cardinality(t.positions), 1) AS float8) AS tf
    FROM matched AS d CROSS JOIN LATERAL unnest(d.search_vector) AS t
    WHERE t.lexeme = ANY(CAST(:term_list AS text[]))
),
doc_freq AS (
    SELECT lexeme, CAST(count(*) AS float8) AS df FROM term_hits GROUP BY lexeme
),
corpus AS (
    SELECT CAST(({scope_size}) AS float8) AS n,
           (SELECT CAST(avg(dl) AS float8) FROM matched) AS avgdl
),
bm25 AS (
    SELECT h.id, h.user_id,
           sum(ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5))
               * h.tf * 2.2 / (h.tf + 1.2 * (0.25 + 0.75 * h.dl / c.avgdl))) AS relevance
    FROM term_hits AS h JOIN doc_freq AS f USING (lexeme) CROSS JOIN corpus AS c
    GROUP BY h.id, h.user_id
),
by_text AS (
    SELECT id, user_id, relevance, row_number() OVER (ORDER BY relevance DESC, id) AS rank
    FROM bm25
    ORDER BY rank
    LIMIT :pool
)"""
    if ann_dimensions is not None:
        if mode != "vector":
            raise ValueError("the approximate path serves mode='vector' only")
        typed = f"vector({int(ann_dimensions)})"
        candidates = f"""candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at,
           CAST(m.embedding AS {typed}) <=> CAST(:query AS {typed}) AS distance
    FROM pgmemory_memories AS m
    WHERE {where}
      AND {_LIVE}{window}
    ORDER BY CAST(m.embedding AS {typed}) <=> CAST(:query AS {typed})
    LIMIT :ann_candidates
)"""
    if mode == "vector":
        ranked = f"""{candidates},
top AS (
    SELECT id, user_id, CAST(1 - distance AS real) AS score
    FROM candidates ORDER BY distance, id LIMIT :limit
)"""
    elif mode == "text":
        ranked = f"""{by_text},
top AS (
    SELECT id, user_id, CAST(relevance AS real) AS score FROM by_text ORDER BY rank LIMIT :limit
)"""
    elif mode == "hybrid":
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; expected one of {FUSIONS}")
        ranked = f"""{candidates},
by_vector AS (
    SELECT id, user_id, row_number() OVER (ORDER BY distance, id) AS rank
    FROM candidates ORDER BY distance, id LIMIT :pool
),
{by_text},
by_time AS (
    SELECT id, user_id, row_number() OVER (ORDER BY created_at DESC, id DESC) AS rank
    FROM candidates ORDER BY created_at DESC, id DESC LIMIT :pool
),
{_RANK_FUSION if fusion == "rank" else _SCORE_FUSION_NEIGHBOURS if neighbours else _SCORE_FUSION}"""
    else:
        raise ValueError(f"unknown search mode {mode!r}; expected one of {SEARCH_MODES}")
    audit_cte = ""
    if audit:
        # One group (no GROUP BY), so this HAVING runs exactly once, with or without hits.
        relax = f"\n    HAVING {_RELAX_COMMIT}" if relax_commit else ""
        audit_cte = f""",
audit AS (
    INSERT INTO pgmemory_recall_audit
        (user_id, collection, application_id, agent_id, session_id, provider, mode,
         requesting_session_id, query_sha256, query_text, memory_ids, scores)
    SELECT :audit_user_id, :collection, :audit_application_id, :audit_agent_id,
           :audit_session_id, :provider, :mode, :requesting_session_id,
           pgmemory_keyed_sha256(:audit_user_id, :query_sha256), :query_text,
           COALESCE(array_agg(h.id ORDER BY h.score DESC, h.id), '{{}}'),
           COALESCE(array_agg(h.score ORDER BY h.score DESC, h.id), '{{}}')
    FROM hits AS h{relax}
)"""
    return f"""
WITH {ranked},
hits AS (
    SELECT {_READ_COLUMNS}, top.score
    FROM top
    JOIN pgmemory_memories AS m ON m.id = top.id AND m.user_id = top.user_id
    WHERE top.score >= :min_score
){audit_cte}
SELECT * FROM hits ORDER BY score DESC, id
"""


@lru_cache(maxsize=64)
def list_memories(dimensions: tuple[str, ...], *, newest_first: bool) -> str:
    """Live memories of a scope in time order, paginated by limit/offset."""
    order = "DESC" if newest_first else "ASC"
    return f"""
SELECT {_READ_COLUMNS}
FROM pgmemory_memories AS m
WHERE {_scope_where(dimensions)}
  AND {_LIVE}
  AND m.created_at >= :since AND m.created_at < :until
ORDER BY m.created_at {order}, m.id {order}
LIMIT :limit OFFSET :offset
"""


@lru_cache(maxsize=64)
def count_memories(dimensions: tuple[str, ...]) -> str:
    """How many live memories a scope holds."""
    return f"""
SELECT count(*) FROM pgmemory_memories AS m
WHERE {_scope_where(dimensions)}
  AND {_LIVE}
"""


# --- memories: deletes ---------------------------------------------------------------------


@lru_cache(maxsize=64)
def delete_ids(dimensions: tuple[str, ...]) -> str:
    """Delete the memories with the given ids inside a scope, auditing each row: ids are unique
    per user only, so the scope is what keeps a delete from reaching another tenant's row."""
    return _audited(
        f"""
    DELETE FROM pgmemory_memories AS m
    WHERE {_scope_where(dimensions)}
      AND m.id = ANY(CAST(:ids AS uuid[]))""",
        "delete",
    )


#: Delete every expired memory (optionally of one collection), auditing each row.
DELETE_EXPIRED = _audited(
    """
    DELETE FROM pgmemory_memories
    WHERE expires_at IS NOT NULL AND expires_at <= :now
      AND (CAST(:collection AS text) IS NULL OR collection = :collection)""",
    "expire",
)


@lru_cache(maxsize=64)
def delete_scope(dimensions: tuple[str, ...]) -> str:
    """Erase every memory of a scope (expired ones too), auditing each row."""
    return _audited(
        f"""
    DELETE FROM pgmemory_memories AS m
    WHERE {_scope_where(dimensions)}""",
        "delete",
    )


# --- large scopes: the approximate (HNSW) path ---------------------------------------------
# One partial expression index per collection (the embedding column is untyped, a collection's
# size is fixed), named after a hash of the collection name; the DDL is built server-side
# with format() so the name and the literal are quoted by PostgreSQL.

#: The CREATE INDEX statement for a collection's HNSW index (to run in autocommit).
ANN_INDEX_DDL = """
SELECT format(
    'CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON pgmemory_memories '
    'USING hnsw ((CAST(embedding AS vector(%s))) vector_cosine_ops) '
    'WITH (m = %s, ef_construction = %s) WHERE collection = %L',
    'pgmemory_ann_' || left(md5(:collection), 16), CAST(:dimensions AS int),
    CAST(:m AS int), CAST(:ef_construction AS int), :collection)
"""

#: The DROP INDEX statement for a collection's HNSW index (to run in autocommit).
ANN_DROP_DDL = """
SELECT format('DROP INDEX CONCURRENTLY IF EXISTS %I', 'pgmemory_ann_' || left(md5(:collection), 16))
"""

#: Session settings for building an HNSW index: no statement timeout (a build takes minutes),
#: and optionally more memory (a build that fits in maintenance_work_mem is several times faster).
ANN_BUILD_SETTINGS = """
SELECT set_config('statement_timeout', '0', false),
       set_config('maintenance_work_mem', COALESCE(CAST(:maintenance_work_mem AS text),
                                                   current_setting('maintenance_work_mem')), false)
"""

#: Back to the connection's own settings after a build.
ANN_BUILD_RESET = "RESET statement_timeout; RESET maintenance_work_mem"

#: Whether a collection's HNSW index exists and is valid (a failed concurrent build is not).
ANN_INDEX_VALID = """
SELECT i.indisvalid FROM pg_index AS i
WHERE i.indexrelid = to_regclass('pgmemory_ann_' || left(md5(:collection), 16))
"""

#: Settings of a transaction on the approximate path: iterative scan (keep walking the graph
#: until enough rows pass the scope filter), the search breadth, a custom plan (the partial
#: index matches only a literal collection, and a generic plan prices the scope at an average
#: size), and no sort-based plan for the candidates (sorting the scope's B-tree rows is the
#: exact path, which this statement exists to avoid on scopes known to be large).
ANN_SETTINGS = """
SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),
       set_config('hnsw.ef_search', CAST(:ef_search AS text), true),
       set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('enable_sort', 'off', true)
"""

#: The user scopes the approximate path serves: more than :min_rows rows, none of which can
#: expire (an expiry filter thins the index's candidates); rows without a user (``''``) are no
#: user scope. Refreshed with every recall probe.
_ANN_SCOPES = """
    SELECT user_id FROM pgmemory_memories
    WHERE collection = :collection AND user_id <> ''
    GROUP BY user_id HAVING count(*) > :min_rows AND count(expires_at) = 0"""

#: The users whose scope takes the approximate path (see _ANN_SCOPES).
ANN_LARGE_USERS = _ANN_SCOPES

#: Probe queries for the approximate path: stored vectors of the scopes it serves, largest first.
ANN_PROBE_SAMPLE = f"""
WITH big AS ({_ANN_SCOPES}
    ORDER BY count(*) DESC
    LIMIT :samples
)
SELECT picked.user_id, picked.embedding
FROM big CROSS JOIN LATERAL (
    SELECT m.user_id, m.embedding FROM pgmemory_memories AS m
    WHERE m.collection = :collection AND m.user_id = big.user_id
    ORDER BY random()
    LIMIT GREATEST(1, CAST(:samples AS int) / (SELECT count(*) FROM big))
) AS picked
LIMIT :samples
"""


# --- chat history --------------------------------------------------------------------------

#: Serialise appends to one session (two writers would otherwise pick the same seq).
LOCK_HISTORY = "SELECT pg_advisory_xact_lock(hashtextextended(:session_id, hashtext(:user_id)))"

#: Append messages after the session's last seq; a message id already stored is skipped.
APPEND_HISTORY = """
INSERT INTO pgmemory_chat_messages (user_id, session_id, seq, message_id, role, message)
SELECT :user_id, :session_id, base.last_seq + r.ord, r.message_id, r.role, r.message
FROM (
    SELECT COALESCE(max(seq), 0) AS last_seq FROM pgmemory_chat_messages
    WHERE user_id = :user_id AND session_id = :session_id
) AS base,
unnest(CAST(:message_ids AS text[]), CAST(:roles AS text[]), CAST(:messages AS jsonb[]))
    WITH ORDINALITY AS r(message_id, role, message, ord)
ON CONFLICT (user_id, session_id, message_id) DO NOTHING
"""

#: A page of a session's history in order.
READ_HISTORY = """
SELECT seq, message, created_at FROM pgmemory_chat_messages
WHERE user_id = :user_id AND session_id = :session_id AND seq > :after_seq
ORDER BY seq
LIMIT :limit
"""

#: How many messages a session's history holds.
COUNT_HISTORY = """
SELECT count(*) FROM pgmemory_chat_messages WHERE user_id = :user_id AND session_id = :session_id
"""

#: Erase a session's history.
DELETE_HISTORY = """
DELETE FROM pgmemory_chat_messages WHERE user_id = :user_id AND session_id = :session_id
"""


# --- facts ---------------------------------------------------------------------------------

#: A scope's facts in one namespace (locked when merging).
GET_FACTS = """
SELECT facts FROM pgmemory_facts
WHERE user_id = :user_id AND application_id = :application_id AND agent_id = :agent_id
  AND session_id = :session_id AND namespace = :namespace
"""
GET_FACTS_FOR_UPDATE = GET_FACTS + "FOR UPDATE"

#: Create a scope's facts row if missing, so the merge below can lock it.
ENSURE_FACTS = """
INSERT INTO pgmemory_facts (user_id, application_id, agent_id, session_id, namespace)
VALUES (:user_id, :application_id, :agent_id, :session_id, :namespace)
ON CONFLICT DO NOTHING
"""

#: Replace a scope's facts with the merged object.
UPDATE_FACTS = """
UPDATE pgmemory_facts SET facts = :facts, updated_at = now()
WHERE user_id = :user_id AND application_id = :application_id AND agent_id = :agent_id
  AND session_id = :session_id AND namespace = :namespace
"""

#: Record changed facts (old and new value per key).
AUDIT_FACTS = """
INSERT INTO pgmemory_fact_audit
    (user_id, application_id, agent_id, session_id, namespace, key, old_value, new_value, actor)
SELECT :user_id, :application_id, :agent_id, :session_id, :namespace, c.key, c.old_value,
       c.new_value, :actor
FROM unnest(CAST(:keys AS text[]), CAST(:old_values AS jsonb[]), CAST(:new_values AS jsonb[]))
    AS c(key, old_value, new_value)
"""

#: Erase a scope's facts in one namespace (or every namespace).
DELETE_FACTS = """
DELETE FROM pgmemory_facts
WHERE user_id = :user_id AND application_id = :application_id AND agent_id = :agent_id
  AND session_id = :session_id AND (CAST(:namespace AS text) IS NULL OR namespace = :namespace)
"""

# --- recall audit --------------------------------------------------------------------------


@lru_cache(maxsize=2)
def record_recall(*, relax_commit: bool) -> str:
    """Record a recall assembled by a caller (e.g. similar plus most recent memories); with
    ``relax_commit`` the statement lets its transaction commit without waiting for the disk
    flush, as :func:`search_memories` does (a SELECT without FROM: its WHERE runs once)."""
    where = f"\nWHERE {_RELAX_COMMIT}" if relax_commit else ""
    return f"""
INSERT INTO pgmemory_recall_audit
    (user_id, collection, application_id, agent_id, session_id, provider, mode,
     requesting_session_id, query_sha256, query_text, memory_ids, scores)
SELECT :user_id, :collection, :application_id, :agent_id, :session_id, :provider, :mode,
       :requesting_session_id, pgmemory_keyed_sha256(:user_id, :query_sha256), :query_text,
       CAST(:memory_ids AS uuid[]), CAST(:scores AS real[]){where}
"""


# --- erasure of a user ---------------------------------------------------------------------

#: Erase every memory of a user in every collection, auditing each row.
ERASE_USER_MEMORIES = _audited(
    """
    DELETE FROM pgmemory_memories WHERE user_id = :user_id""",
    "delete",
)

#: Erase every fact of a user (all namespaces and narrower scopes).
ERASE_USER_FACTS = "DELETE FROM pgmemory_facts WHERE user_id = :user_id"

#: Pseudonymise a user's audit rows, blank the personal values they kept, destroy the user's
#: secret and record the erasure (a SECURITY DEFINER function: the application role may not
#: change audit rows itself). Returns {"pseudonym", "pseudonymised": {table: rows}}.
ERASE_USER_AUDIT = "SELECT pgmemory_erase_user_audit(:user_id, :actor)"

#: Erase a user's chat history in every session.
ERASE_USER_HISTORY = "DELETE FROM pgmemory_chat_messages WHERE user_id = :user_id"


# --- browsing and retention (UI, CLI) ------------------------------------------------------
# Reads behind the operators' audit page and the retention sweep. Pages are bounded by
# :limit (the caller clamps it) and walk by keyset: ``(time, id) < (:before_at, :before_id)``
# for older rows, ``> (:after_at, :after_id)`` for newer ones (read ascending, then reversed).
# Every statement about one user filters ``user_id = :user_id`` on every table it reads.

#: Tables whose ``user_id`` leads an index, so their distinct users can be walked by skip scan.
_USER_SOURCES = (
    "pgmemory_recall_audit",
    "pgmemory_memory_audit",
    "pgmemory_chat_messages",
    "pgmemory_facts",
    "pgmemory_fact_audit",
)


def _skip_scan(name: str, table: str) -> str:
    """A recursive CTE yielding up to :limit distinct user ids of ``table`` after :after, one
    index probe each (a loose index scan), instead of reading every row of the table."""
    return f"""{name}(user_id, depth) AS (
    SELECT (SELECT min(t.user_id) FROM {table} AS t WHERE t.user_id > :after), 1
    UNION ALL
    SELECT (SELECT min(t.user_id) FROM {table} AS t WHERE t.user_id > s.user_id), s.depth + 1
    FROM {name} AS s WHERE s.user_id IS NOT NULL AND s.depth < :limit
)"""


def _build_user_page() -> str:
    # Memories: per collection, the (collection, user_id, created_at) index is walked instead.
    ctes = [
        """memory_users(collection, user_id, depth) AS (
    SELECT c.name,
           (SELECT min(m.user_id) FROM pgmemory_memories AS m
            WHERE m.collection = c.name AND m.user_id > :after), 1
    FROM pgmemory_collections AS c
    UNION ALL
    SELECT s.collection,
           (SELECT min(m.user_id) FROM pgmemory_memories AS m
            WHERE m.collection = s.collection AND m.user_id > s.user_id), s.depth + 1
    FROM memory_users AS s WHERE s.user_id IS NOT NULL AND s.depth < :limit
)"""
    ]
    ctes += [_skip_scan(f"users_{i}", table) for i, table in enumerate(_USER_SOURCES)]
    union = "\n    UNION ".join(
        ["SELECT user_id FROM memory_users"]
        + [f"SELECT user_id FROM users_{i}" for i in range(len(_USER_SOURCES))]
    )
    return f"""
WITH RECURSIVE {("," + chr(10)).join(ctes)}
SELECT user_id FROM (
    {union}
) AS found
WHERE user_id IS NOT NULL
ORDER BY user_id
LIMIT :limit
"""


#: One page of user ids (ascending, after :after; '' = "no user" is never listed) found in any
#: table: memories, either audit, chat history or facts. At most :limit index probes per source.
USER_PAGE = _build_user_page()

#: Memories per collection of each user on a page (the ids come from USER_PAGE).
USER_MEMORY_COUNTS = """
SELECT u.user_id, c.name AS collection, s.memories, s.last_at
FROM unnest(CAST(:user_ids AS text[])) AS u(user_id)
CROSS JOIN pgmemory_collections AS c
CROSS JOIN LATERAL (
    SELECT count(*) AS memories, max(m.created_at) AS last_at FROM pgmemory_memories AS m
    WHERE m.collection = c.name AND m.user_id = u.user_id
) AS s
WHERE s.memories > 0
ORDER BY u.user_id, c.name
"""

#: Recalls, chat messages and facts of each user on a page, with the latest time of each.
USER_ACTIVITY = """
SELECT u.user_id, r.recalls, r.last_recall_at, h.last_message_at, f.last_fact_at
FROM unnest(CAST(:user_ids AS text[])) AS u(user_id)
CROSS JOIN LATERAL (
    SELECT count(*) AS recalls, max(a.at) AS last_recall_at FROM pgmemory_recall_audit AS a
    WHERE a.user_id = u.user_id
) AS r
CROSS JOIN LATERAL (
    SELECT max(h.created_at) AS last_message_at FROM pgmemory_chat_messages AS h
    WHERE h.user_id = u.user_id
) AS h
CROSS JOIN LATERAL (
    SELECT max(f.updated_at) AS last_fact_at FROM pgmemory_facts AS f WHERE f.user_id = u.user_id
) AS f
"""

#: A user's memory scopes: each collection/application/agent/session with its row count.
USER_MEMORY_SCOPES = """
SELECT m.collection, m.application_id, m.agent_id, m.session_id, count(*) AS memories,
       min(m.created_at) AS first_at, max(m.created_at) AS last_at
FROM pgmemory_memories AS m
WHERE m.user_id = :user_id
GROUP BY m.collection, m.application_id, m.agent_id, m.session_id
ORDER BY max(m.created_at) DESC
LIMIT :limit
"""

#: A user's chat sessions, most recently active first, with their message counts.
USER_SESSIONS = """
SELECT h.session_id, count(*) AS messages, min(h.created_at) AS first_at,
       max(h.created_at) AS last_at
FROM pgmemory_chat_messages AS h
WHERE h.user_id = :user_id
GROUP BY h.session_id
ORDER BY max(h.created_at) DESC
LIMIT :limit
"""

_BROWSE_MEMORY_COLUMNS = """m.id, m.collection, m.application_id, m.agent_id, m.user_id,
       m.session_id, m.role, m.content, m.author_name, m.message_id, m.source_type, m.source_id,
       m.embedding_model, m.created_at, m.expires_at, m.metadata"""
#: Optional narrowing of a user's memories to one session (NULL = every session).
_SESSION_FILTER = "(CAST(:session_id AS text) IS NULL OR m.session_id = :session_id)"

#: A page of a user's memories in a collection (optionally one session), older than the
#: cursor, newest first; expired rows not yet reclaimed are included (they are still stored).
USER_MEMORIES_OLDER = f"""
SELECT {_BROWSE_MEMORY_COLUMNS}
FROM pgmemory_memories AS m
WHERE m.collection = :collection AND m.user_id = :user_id AND {_SESSION_FILTER}
  AND (m.created_at, m.id) < (:before_at, :before_id)
ORDER BY m.created_at DESC, m.id DESC
LIMIT :limit
"""

#: The page of a user's memories just newer than the cursor, oldest first (the caller reverses).
USER_MEMORIES_NEWER = f"""
SELECT {_BROWSE_MEMORY_COLUMNS}
FROM pgmemory_memories AS m
WHERE m.collection = :collection AND m.user_id = :user_id AND {_SESSION_FILTER}
  AND (m.created_at, m.id) > (:after_at, :after_id)
ORDER BY m.created_at ASC, m.id ASC
LIMIT :limit
"""

#: One memory of a user (in any collection).
USER_MEMORY = f"""
SELECT {_BROWSE_MEMORY_COLUMNS}
FROM pgmemory_memories AS m
WHERE m.user_id = :user_id AND m.id = :memory_id
"""

_RECALL_COLUMNS = """a.id, a.at, a.collection, a.application_id, a.agent_id, a.session_id,
       a.provider, a.mode, a.requesting_session_id, a.query_sha256, a.query_text,
       cardinality(a.memory_ids) AS returned"""

#: A page of a user's recalls older than the cursor, newest first.
USER_RECALLS_OLDER = f"""
SELECT {_RECALL_COLUMNS}
FROM pgmemory_recall_audit AS a
WHERE a.user_id = :user_id AND (a.at, a.id) < (:before_at, :before_id)
ORDER BY a.at DESC, a.id DESC
LIMIT :limit
"""

#: The page of a user's recalls just newer than the cursor, oldest first (the caller reverses).
USER_RECALLS_NEWER = f"""
SELECT {_RECALL_COLUMNS}
FROM pgmemory_recall_audit AS a
WHERE a.user_id = :user_id AND (a.at, a.id) > (:after_at, :after_id)
ORDER BY a.at ASC, a.id ASC
LIMIT :limit
"""

#: One recall of a user.
USER_RECALL = f"""
SELECT {_RECALL_COLUMNS}
FROM pgmemory_recall_audit AS a
WHERE a.user_id = :user_id AND a.id = :recall_id
"""

#: What the given recalls of a user returned, in rank order (the first :per_recall of each),
#: joined to the memories (NULL columns: deleted since) and to the latest deletion or expiry
#: audited for each memory.
RECALLED_MEMORIES = """
SELECT a.id AS recall_id, r.rank, r.memory_id, r.score, m.collection, m.role, m.content,
       m.session_id, m.created_at, m.expires_at, d.at AS deleted_at, d.operation AS deleted_by
FROM pgmemory_recall_audit AS a
CROSS JOIN LATERAL unnest(a.memory_ids, a.scores) WITH ORDINALITY AS r(memory_id, score, rank)
LEFT JOIN pgmemory_memories AS m ON m.user_id = :user_id AND m.id = r.memory_id
LEFT JOIN LATERAL (
    SELECT x.at, x.operation FROM pgmemory_memory_audit AS x
    WHERE x.user_id = :user_id AND x.memory_id = r.memory_id
      AND x.operation IN ('delete', 'expire')
    ORDER BY x.at DESC, x.id DESC
    LIMIT 1
) AS d ON m.id IS NULL
WHERE a.user_id = :user_id AND a.id = ANY(CAST(:recall_ids AS bigint[])) AND r.rank <= :per_recall
ORDER BY a.id, r.rank
"""

#: The latest recalls of a user that returned a given memory (newest first).
RECALLS_OF_MEMORY = f"""
SELECT {_RECALL_COLUMNS}, s.score, s.rank
FROM pgmemory_recall_audit AS a
CROSS JOIN LATERAL (
    SELECT r.score, r.rank
    FROM unnest(a.memory_ids, a.scores) WITH ORDINALITY AS r(memory_id, score, rank)
    WHERE r.memory_id = :memory_id
    LIMIT 1
) AS s
WHERE a.user_id = :user_id AND :memory_id = ANY(a.memory_ids)
ORDER BY a.at DESC, a.id DESC
LIMIT :limit
"""

_MEMORY_AUDIT_COLUMNS = """x.id, x.at, x.txid, x.operation, x.memory_id, x.collection,
       x.application_id, x.agent_id, x.session_id, x.content_sha256, x.actor"""

#: A page of a user's memory write/delete audit older than the cursor, newest first.
USER_MEMORY_AUDIT_OLDER = f"""
SELECT {_MEMORY_AUDIT_COLUMNS}
FROM pgmemory_memory_audit AS x
WHERE x.user_id = :user_id AND (x.at, x.id) < (:before_at, :before_id)
ORDER BY x.at DESC, x.id DESC
LIMIT :limit
"""

#: The page of a user's memory audit just newer than the cursor, oldest first (reversed later).
USER_MEMORY_AUDIT_NEWER = f"""
SELECT {_MEMORY_AUDIT_COLUMNS}
FROM pgmemory_memory_audit AS x
WHERE x.user_id = :user_id AND (x.at, x.id) > (:after_at, :after_id)
ORDER BY x.at ASC, x.id ASC
LIMIT :limit
"""

#: The audit trail of one memory of a user, oldest first.
MEMORY_AUDIT_TRAIL = f"""
SELECT {_MEMORY_AUDIT_COLUMNS}
FROM pgmemory_memory_audit AS x
WHERE x.user_id = :user_id AND x.memory_id = :memory_id
ORDER BY x.at, x.id
LIMIT :limit
"""

#: A user's current facts, one row per scope and namespace.
USER_FACTS = """
SELECT f.application_id, f.agent_id, f.session_id, f.namespace, f.facts, f.updated_at
FROM pgmemory_facts AS f
WHERE f.user_id = :user_id
ORDER BY f.namespace, f.application_id, f.agent_id, f.session_id
LIMIT :limit
"""

_FACT_AUDIT_COLUMNS = """x.id, x.at, x.application_id, x.agent_id, x.session_id, x.namespace,
       x.key, x.old_value, x.new_value, x.actor"""

#: A page of a user's fact changes older than the cursor, newest first.
USER_FACT_AUDIT_OLDER = f"""
SELECT {_FACT_AUDIT_COLUMNS}
FROM pgmemory_fact_audit AS x
WHERE x.user_id = :user_id AND (x.at, x.id) < (:before_at, :before_id)
ORDER BY x.at DESC, x.id DESC
LIMIT :limit
"""

#: The page of a user's fact changes just newer than the cursor, oldest first (reversed later).
USER_FACT_AUDIT_NEWER = f"""
SELECT {_FACT_AUDIT_COLUMNS}
FROM pgmemory_fact_audit AS x
WHERE x.user_id = :user_id AND (x.at, x.id) > (:after_at, :after_id)
ORDER BY x.at ASC, x.id ASC
LIMIT :limit
"""

#: The page of a session's history just before :before_seq, newest first (the caller reverses).
READ_HISTORY_BEFORE = """
SELECT seq, message, created_at FROM pgmemory_chat_messages
WHERE user_id = :user_id AND session_id = :session_id AND seq < :before_seq
ORDER BY seq DESC
LIMIT :limit
"""

# Retention. A prune is recorded in pgmemory_fact_audit under an all-blank scope (no real
# fact can have one: facts need a scope) and the namespace below; the memory audit cannot hold
# it (its operation check admits only insert/delete/expire, and memory_id is required).

#: Namespace of the fact-audit rows that record audit prunes (kept by later prunes).
RETENTION_NAMESPACE = "pgmemory:retention"
#: Namespace of the fact-audit rows that record erasures (kept by prunes too; migration 0006
#: writes both names into its functions).
ERASURE_NAMESPACE = "pgmemory:erasure"

#: Delete the chosen audits' rows older than the cutoff (except the records of earlier prunes
#: and erasures) and record the prune: cutoff and counts as the new value, who asked as actor
#: (a SECURITY DEFINER function, like ERASE_USER_AUDIT). Returns {"cutoff", "deleted"}.
PRUNE_AUDIT = """
SELECT pgmemory_prune_audit(:cutoff, :recall_audit, :memory_audit, :fact_audit, :actor)
"""

#: The latest prune records, newest first.
LIST_PRUNES = """
SELECT x.id, x.at, x.new_value AS summary, x.actor
FROM pgmemory_fact_audit AS x
WHERE x.user_id = '' AND x.application_id = '' AND x.agent_id = '' AND x.session_id = ''
  AND x.namespace = :retention_namespace
ORDER BY x.at DESC, x.id DESC
LIMIT :limit
"""


# --- audit integrity (pgmemory audit verify) and the application role (pgmemory db roles) --
# Migration 0006 guards the audit tables with a trigger and two SECURITY DEFINER functions;
# these statements read that guard back. Table names come from AUDIT_TABLES only.

#: The audit tables the guard protects.
AUDIT_TABLES = ("pgmemory_memory_audit", "pgmemory_recall_audit", "pgmemory_fact_audit")
#: The table of per-user secrets keying audit hashes (no role but its owner may touch it).
SECRETS_TABLE = "pgmemory_user_secrets"
#: The functions the guard consists of; the first three run as their owner.
DEFINER_FUNCTIONS = (
    "pgmemory_keyed_sha256",
    "pgmemory_erase_user_audit",
    "pgmemory_prune_audit",
)
GUARD_FUNCTION = "pgmemory_audit_guard"
#: The guard's triggers on each audit table.
GUARD_TRIGGERS = ("pgmemory_audit_guard", "pgmemory_audit_no_truncate")

#: Row hashes are computed in UTC with shortest-exact floats (the guard function's settings).
HASH_TIME_ZONE = "SET LOCAL \"TimeZone\" = 'UTC'"
HASH_FLOAT_DIGITS = "SET LOCAL extra_float_digits = 1"

#: The non-internal triggers of the given tables: table, name, state ('D': disabled), function,
#: and type bits (row, before, insert, delete, update, truncate).
AUDIT_TRIGGERS = """
SELECT c.relname AS table_name, t.tgname AS trigger_name, t.tgenabled AS enabled,
       p.proname AS function_name, t.tgtype AS type_bits
FROM pg_trigger AS t
JOIN pg_class AS c ON c.oid = t.tgrelid
JOIN pg_proc AS p ON p.oid = t.tgfoid
WHERE c.oid = ANY(CAST(:tables AS regclass[])) AND NOT t.tgisinternal
"""

#: The guard's functions in the current schema: owner, SECURITY DEFINER, settings, whether
#: PUBLIC may execute them.
AUDIT_FUNCTIONS = """
SELECT p.proname AS name, pg_get_userbyid(p.proowner) AS owner, p.prosecdef AS definer,
       COALESCE(p.proconfig, '{}') AS config,
       EXISTS (SELECT 1 FROM aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) AS a
               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS public_execute
FROM pg_proc AS p
WHERE p.proname = ANY(CAST(:names AS text[])) AND p.pronamespace = CAST(current_schema() AS regnamespace)
"""

#: Owners of the given tables, and every privilege held on them by another role that would
#: let it change audit rows (UPDATE, DELETE, TRUNCATE, TRIGGER), or touch the secrets at all.
AUDIT_GRANTS = """
SELECT c.relname AS table_name, pg_get_userbyid(c.relowner) AS owner,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END AS grantee,
       a.privilege_type
FROM pg_class AS c
CROSS JOIN LATERAL aclexplode(COALESCE(c.relacl, acldefault('r', c.relowner))) AS a
WHERE c.oid = ANY(CAST(:tables AS regclass[]))
  AND a.grantee <> c.relowner
  AND (c.relname = :secrets OR a.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER'))
"""

#: The owners of the given tables.
TABLE_OWNERS = """
SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class AS c
WHERE c.oid = ANY(CAST(:tables AS regclass[]))
"""

#: Roles that may act as the given role (its members, directly or not) and are not superusers.
ROLE_MEMBERS = """
WITH RECURSIVE members AS (
    SELECT m.member FROM pg_auth_members AS m WHERE m.roleid = CAST(:role AS regrole)
    UNION
    SELECT m.member FROM pg_auth_members AS m JOIN members AS x ON m.roleid = x.member
)
SELECT r.rolname FROM members AS x JOIN pg_roles AS r ON r.oid = x.member ORDER BY r.rolname
"""

#: The superusers (they bypass every privilege and may disable triggers).
SUPERUSERS = "SELECT rolname FROM pg_roles WHERE rolsuper ORDER BY rolname"


@lru_cache(maxsize=8)
def audit_row_check(table: str) -> str:
    """Rows of an audit table, its highest id, and the rows whose ``row_sha256`` does not match
    their content (count and the first few ids): a full scan."""
    if table not in AUDIT_TABLES:
        raise ValueError(f"not an audit table: {table!r}")
    return f"""
SELECT count(*) AS rows, max(t.id) AS max_id,
       count(*) FILTER (WHERE t.row_sha256 IS DISTINCT FROM pgmemory_audit_row_sha256(to_jsonb(t)))
           AS mismatched,
       (array_agg(t.id ORDER BY t.id)
           FILTER (WHERE t.row_sha256 IS DISTINCT FROM pgmemory_audit_row_sha256(to_jsonb(t))))[1:5]
           AS examples
FROM {table} AS t
"""


@lru_cache(maxsize=8)
def audit_guard_probe(table: str) -> str:
    """A no-op UPDATE of the newest row of an audit table (run in a savepoint that is rolled
    back): the guard must refuse it."""
    if table not in AUDIT_TABLES:
        raise ValueError(f"not an audit table: {table!r}")
    return f"""
UPDATE {table} SET user_id = user_id WHERE id = (SELECT max(id) FROM {table}) RETURNING id
"""


#: Pseudonyms in the audits with no erasure record (rows pseudonymised outside erasure).
UNRECORDED_PSEUDONYMS = """
SELECT count(*) FROM (
    SELECT user_id FROM pgmemory_memory_audit WHERE left(user_id, 7) = 'erased:'
    UNION
    SELECT user_id FROM pgmemory_recall_audit WHERE left(user_id, 7) = 'erased:'
    UNION
    SELECT user_id FROM pgmemory_fact_audit WHERE left(user_id, 7) = 'erased:'
) AS u
WHERE NOT EXISTS (
    SELECT 1 FROM pgmemory_fact_audit AS r
    WHERE r.user_id = '' AND r.application_id = '' AND r.agent_id = '' AND r.session_id = ''
      AND r.namespace = :erasure_namespace AND r.new_value ->> 'pseudonym' = u.user_id
)
"""

# The application role. Role, database and schema names are DDL identifiers (never parameters):
# the role name is checked against ROLE_NAME_PATTERN and every name is quoted with the dialect's
# identifier quoting before it fills a {placeholder}; the password goes in only as the SCRAM
# verifier libpq computes from it, checked against PASSWORD_VERIFIER_PATTERN.

#: What a role name passed to ``pgmemory db roles`` may look like (lower case, no quoting needed).
ROLE_NAME_PATTERN = r"[a-z_][a-z0-9_]{0,62}"
#: A SCRAM-SHA-256 verifier (base64 parts): the only form a password reaches the server in.
PASSWORD_VERIFIER_PATTERN = (
    r"SCRAM-SHA-256\$[0-9]+:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+"
)

#: Whether the role exists and what it may do beyond its grants.
ROLE_ATTRIBUTES = """
SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls OR rolreplication AS powerful
FROM pg_roles WHERE rolname = :name
"""

#: The database and schema the store works in, and whether PUBLIC may create objects there.
ROLE_CONTEXT = """
SELECT current_database() AS database, current_schema() AS schema,
       EXISTS (SELECT 1 FROM pg_namespace AS n
               CROSS JOIN LATERAL aclexplode(COALESCE(n.nspacl, acldefault('n', n.nspowner))) AS a
               WHERE n.nspname = current_schema() AND a.grantee = 0
                 AND a.privilege_type = 'CREATE') AS public_create
"""

#: Create the application role: it may log in and nothing else beyond its grants.
CREATE_APP_ROLE = (
    "CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
    "PASSWORD '{verifier}'"
)
#: Reset an existing application role to the same attributes and a new password.
ALTER_APP_ROLE = (
    "ALTER ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
    "PASSWORD '{verifier}'"
)

_DATA_TABLES = "pgmemory_collections, pgmemory_memories, pgmemory_chat_messages, pgmemory_facts"
_AUDIT_TABLE_LIST = ", ".join(AUDIT_TABLES)

#: The application role's privileges, in order: first anything a re-run must take back.
APP_ROLE_GRANTS = (
    f"REVOKE UPDATE, DELETE, TRUNCATE, TRIGGER, REFERENCES ON {_AUDIT_TABLE_LIST} FROM {{role}}",
    f"REVOKE ALL ON {SECRETS_TABLE} FROM {{role}}",
    "REVOKE CREATE ON SCHEMA {schema} FROM {role}",
    "GRANT CONNECT, TEMPORARY ON DATABASE {database} TO {role}",
    "GRANT USAGE ON SCHEMA {schema} TO {role}",
    f"GRANT SELECT, INSERT, UPDATE, DELETE ON {_DATA_TABLES} TO {{role}}",
    f"GRANT SELECT, INSERT ON {_AUDIT_TABLE_LIST} TO {{role}}",
    "GRANT SELECT ON pgmemory_alembic_version TO {role}",
    "GRANT EXECUTE ON FUNCTION pgmemory_keyed_sha256(text, text), "
    "pgmemory_erase_user_audit(text, text), "
    "pgmemory_prune_audit(timestamptz, boolean, boolean, boolean, text) TO {role}",
)

# --- read replicas -------------------------------------------------------------------------

#: The primary's WAL insert position, read right after a write commits (read-your-writes).
WAL_POSITION = "SELECT pg_current_wal_insert_lsn()::text"

#: Whether a read replica still replays WAL, how far it has, and how many seconds it lags (0
#: when it has replayed all it received).
REPLICA_HEALTH = """
SELECT pg_is_in_recovery() AS standby,
       pg_last_wal_replay_lsn()::text AS replayed,
       CASE WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0.0
            ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0.0)::float8
       END AS lag_s
"""

#: How far a read replica has replayed the primary's WAL (NULL on a server that is no replica).
REPLAY_POSITION = "SELECT pg_last_wal_replay_lsn()::text"

# --- distribution over Citus (see pgmemory.store.routing) ----------------------------------

#: The database connected to (for messages).
CURRENT_DATABASE = "SELECT current_database()"

#: Whether the citus extension is installed in this database.
CITUS_INSTALLED = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"

#: How Citus manages a table already ('distributed', 'reference'; NULL: not at all).
CITUS_TABLE_TYPE = """
SELECT citus_table_type FROM citus_tables WHERE table_name = CAST(:table AS regclass)
"""

#: Make a table a reference table (copied to every node).
CITUS_REFERENCE_TABLE = "SELECT create_reference_table(CAST(:table AS regclass))"

#: Distribute a table by a column, co-located with another table ('default': Citus's choice).
CITUS_DISTRIBUTE_TABLE = """
SELECT create_distributed_table(CAST(:table AS regclass), :column, colocate_with => :colocate_with)
"""

# --- hash partitioning of the memories table by user (see pgmemory.store.partitioning) -------

#: What the memories table is now: its relkind ('r' plain, 'p' partitioned; NULL: no table).
MEMORIES_RELKIND = """
SELECT c.relkind::text FROM pg_class AS c WHERE c.oid = to_regclass('pgmemory_memories')
"""

#: Whether the memories table holds any row at all (partitioning is refused then).
MEMORIES_ANY_ROW = "SELECT EXISTS (SELECT 1 FROM pgmemory_memories)"

#: The partition count for PARTITION_MEMORIES, transaction-local (DDL takes no parameters).
SET_PARTITION_COUNT = "SELECT set_config('pgmemory.partitions', CAST(:partitions AS text), true)"

#: Turn the EMPTY memories table into one hash-partitioned by user_id into
#: current_setting('pgmemory.partitions') partitions, keeping every column, default, check,
#: storage setting, key, foreign key and index (by name). Run after SET_PARTITION_COUNT, in
#: one transaction; no '%' and no bind marker in it, so it runs as written.
PARTITION_MEMORIES = """
DO $$
DECLARE
    partitions int := current_setting('pgmemory.partitions')::int;
    indexes text[] := ARRAY(
        SELECT indexdef FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename = 'pgmemory_memories'
          AND indexname NOT IN (SELECT conname FROM pg_constraint
                                WHERE conrelid = 'pgmemory_memories'::regclass));
    keys text[] := ARRAY(
        SELECT 'ALTER TABLE pgmemory_memories ADD CONSTRAINT ' || quote_ident(conname) || ' '
               || pg_get_constraintdef(oid)
        FROM pg_constraint
        WHERE conrelid = 'pgmemory_memories'::regclass AND contype IN ('p', 'u', 'f')
        ORDER BY contype <> 'p', conname);
    statement text;
BEGIN
    ALTER TABLE pgmemory_memories RENAME TO pgmemory_memories_plain;
    CREATE TABLE pgmemory_memories (LIKE pgmemory_memories_plain
        INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMMENTS)
        PARTITION BY HASH (user_id);
    DROP TABLE pgmemory_memories_plain;
    FOR i IN 0 .. partitions - 1 LOOP
        EXECUTE 'CREATE TABLE ' || quote_ident('pgmemory_memories_p' || i)
             || ' PARTITION OF pgmemory_memories FOR VALUES WITH (MODULUS ' || partitions
             || ', REMAINDER ' || i || ')';
    END LOOP;
    FOREACH statement IN ARRAY keys LOOP EXECUTE statement; END LOOP;
    FOREACH statement IN ARRAY indexes LOOP EXECUTE statement; END LOOP;
END $$
"""

#: How many partitions the memories table has (0: not partitioned).
MEMORIES_PARTITIONS = """
SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('pgmemory_memories')
"""

#: Take the migration advisory lock for the current transaction.
MIGRATION_XACT_LOCK = "SELECT pg_advisory_xact_lock(:key)"
