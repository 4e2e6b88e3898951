"""Every SQL statement the store issues, each with a one-line purpose.

All statements are parameterised. The only text ever spliced into a statement is chosen from
the fixed fragments below (scope column predicates, the covering-index guard); nothing that a
caller passes becomes part of SQL text.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pgmemory.store._engine.deployment import Locking
from pgmemory.store._engine.statement import Statement, builds, register
from pgmemory.store.columns import (
    MEMORY_COLUMNS,
    POSITION,
    READ_COLUMNS,
    SENT_COLUMNS,
    STAGING_COLUMNS,
)
from pgmemory.store.models import CONVERSATION_KEY, COVERING_MAX_DIMENSIONS
from pgmemory.store.modes import FUSIONS, SEARCH_MODES

# --- collections ---------------------------------------------------------------------------

#: Register a collection; an existing one is left as it is (the caller compares).
INSERT_COLLECTION = Statement("""
INSERT INTO pgmemory_collections (name, dimensions, embedding_model)
VALUES (:name, :dimensions, :embedding_model)
ON CONFLICT (name) DO NOTHING
""")

#: Read one collection's catalogue entry.
GET_COLLECTION = Statement("""
SELECT name, dimensions, embedding_model, created_at
FROM pgmemory_collections WHERE name = :name
""")

#: List the catalogue.
LIST_COLLECTIONS = Statement("""
SELECT name, dimensions, embedding_model, created_at FROM pgmemory_collections ORDER BY name
""")

#: For a transaction that writes the catalogue (a reference table on Citus) after writing
#: per-user tables: Citus refuses that after a parallel multi-shard write, so the transaction
#: writes the shards one connection per node. On a server without Citus it only sets an unused
#: custom setting.
SEQUENTIAL_SHARD_WRITES = Statement("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")

#: Remove a collection's catalogue entry (its memories are deleted first, with audit).
DELETE_COLLECTION = Statement("DELETE FROM pgmemory_collections WHERE name = :name")

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
    returns the changed memories' ids.

    The keyed content hash is taken in a materialised step of its own (``keyed``), not in the
    audit INSERT's select list: Citus, planning a function call on the columns of a
    data-modifying CTE inside INSERT ... SELECT, passes it the wrong columns (wrong hashes
    silently, or an error); over a materialised step it passes the right ones.
    """
    return f"""
WITH changed AS ({change}
    RETURNING {_AUDITED}
),
keyed AS MATERIALIZED (
    SELECT id, user_id, collection, application_id, agent_id, session_id,
           {_KEYED_CONTENT} AS keyed_sha256
    FROM changed
)
INSERT INTO pgmemory_memory_audit
    (user_id, operation, memory_id, collection, application_id, agent_id, session_id,
     content_sha256, actor)
SELECT user_id, '{operation}', id, collection, application_id, agent_id, session_id,
       keyed_sha256, :actor
FROM keyed
RETURNING memory_id
"""


def _insert_memories(source: str, alias: str, *, where: str = "", keyed: bool = True) -> str:
    """INSERT the rows of ``source`` (which names its values ``alias``), skipping stored messages.

    Rows go in in the order of the message key (the unique index's columns, compared bytewise
    as Python compares str), then by position: two transactions writing the same messages
    then claim them in the same order, so one waits for the other instead of both waiting for
    each other (a deadlock). ``writes.add`` sorts its chunks the same way. Rows without a
    message id (``keyed`` off, ``where`` choosing them) cannot conflict; they go in by user,
    then position, so each user's index entries are written together (a 150,000-row import of
    2,000 users in input order 2,740-2,854 rows/s, by user 3,363-3,381: docs/performance.md).
    """
    values = ",\n           ".join(c.stored_from(alias) for c in MEMORY_COLUMNS)
    key = MESSAGE_KEY if keyed else ("user_id",)
    order = ", ".join(
        [f'{alias}.{c} COLLATE "C"' for c in key] + [f"{alias}.{POSITION.value_name}"]
    )
    clauses = [f"FROM {source}"]
    if where:
        clauses.append(f"WHERE {where}")
    clauses.append(f"ORDER BY {order}")
    clauses.append(_SKIP_STORED_MESSAGES)
    body = "\n    ".join(clauses)
    return f"""
    INSERT INTO pgmemory_memories ({_INSERT_COLUMNS})
    SELECT {values}
    {body}"""


#: The unique message key within a collection, in the order rows are inserted by.
MESSAGE_KEY = ("user_id", "application_id", "agent_id", "session_id", "message_id")

#: A batch given as parallel arrays (one per sent column), its rows named ``r``.
_SENT_BATCH = f"""unnest(
        {_SENT_ARRAYS}
    ) AS r({_SENT_VALUES})"""

#: Insert a batch given as parallel arrays, in message-key order, auditing each row, in one
#: statement; a record whose message id the collection already holds in the scope is skipped.
INSERT_MEMORIES = Statement(
    _audited(_insert_memories(_SENT_BATCH, "r"), "insert"),
    fan_out="one batch may hold several users' rows (INSERT ... SELECT from arrays): each row goes to its user's shard; a batch of one user's rows touches one shard",
)

#: The advisory-lock class of a user's erasure lock ('pgme'), a key space of its own (migration
#: 0022's functions name it as a number).
_ERASURE_LOCK_CLASS = 0x70676D65

#: INSERT_MEMORIES taking its users' erasure locks (shared, in the order of ``:lock_users``,
#: sorted) before its first row: the condition names no row, so it runs once, first (a
#: one-time filter). A memory insert reads nothing its snapshot could have missed (a stored
#: message id is found by the unique index, committed or not), so its snapshot may predate the
#: locks.
INSERT_MEMORIES_LOCKING = Statement(
    _audited(
        _insert_memories(
            _SENT_BATCH,
            "r",
            where=f"""(SELECT count(pg_advisory_xact_lock_shared({_ERASURE_LOCK_CLASS}, hashtext(u)))
           FROM unnest(CAST(:lock_users AS text[])) AS u) >= 0""",
        ),
        "insert",
    ),
    fan_out="INSERT_MEMORIES taking its locks itself: one server only",
)

#: A memory insert as the deployment runs it (:class:`~pgmemory.store._engine.deployment.Locking`).
MEMORY_INSERT = Locking(INSERT_MEMORIES_LOCKING, INSERT_MEMORIES, users_param="lock_users")

#: A bulk import may run longer than the interactive statement timeout (this transaction only).
NO_STATEMENT_TIMEOUT = Statement("SET LOCAL statement_timeout = 0")

#: How many rows the memories table held at its last analysis (the planner's estimate; 0 for
#: a table never analysed, and for Citus's coordinator table, whose rows are in its shards).
ANALYSED_ROWS = Statement(
    """
SELECT GREATEST(reltuples, 0) FROM pg_class WHERE oid = to_regclass('pgmemory_memories')
""",
    fan_out="after a bulk import: the table's row estimate from the catalog, no rows",
)

#: The memories table vacuumed and analysed after a bulk import: fresh planner statistics, and
#: the imported pages marked all-visible, so that the covering index's scans read them
#: index-only at once instead of fetching every new row from the heap until autovacuum's next
#: pass (for a role that may not vacuum the table, PostgreSQL warns and skips it). It never
#: waits for a lock (an index build or another vacuum holding the table: autovacuum will come
#: by later). It cannot run in a transaction: :meth:`~pgmemory.store._engine.database.Database.ddl`.
VACUUM_ANALYZE_MEMORIES = Statement(
    "VACUUM (ANALYZE, SKIP_LOCKED) pgmemory_memories",
    fan_out="after a bulk import: the table vacuumed and its statistics refreshed, on every shard",
)

#: Staging table for binary COPY imports; dropped at commit.
CREATE_STAGING = Statement(f"""
CREATE TEMPORARY TABLE pgmemory_import (
    {_STAGING_DEFINITION}
) ON COMMIT DROP
""")

#: Binary COPY into the staging table.
COPY_STAGING = Statement(f"COPY pgmemory_import ({_SENT_VALUES}) FROM STDIN (FORMAT BINARY)")

#: Move the staged rows that carry a message id into the collection, in message-key order,
#: auditing each row, in one statement (skipping messages already stored, as above).
INSERT_FROM_STAGING = Statement(
    _audited(
        _insert_memories("pgmemory_import AS s", "s", where="s.message_id IS NOT NULL"), "insert"
    ),
    fan_out="bulk import from the local staging table: rows of any users",
)

#: Move the staged rows without a message id (they cannot conflict), by user, auditing each.
INSERT_FROM_STAGING_UNKEYED = Statement(
    _audited(
        _insert_memories("pgmemory_import AS s", "s", where="s.message_id IS NULL", keyed=False),
        "insert",
    ),
    fan_out="bulk import from the local staging table: rows of any users",
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

#: A condition that is true or raises: it takes the audited user's erasure lock (shared) and
#: refuses (SQLSTATE 40001) if an erasure of the user committed after the statement's snapshot
#: and before the lock was held (their audit secret's stamp, read by the statement, differs
#: from a fresh read: migration 0022). An audited read guarded so needs no lock statement
#: before it, on a server whose isolation is READ COMMITTED
#: (:attr:`pgmemory.store._engine.database.Database.guards_reads`).
_ERASURE_GUARD = "pgmemory_erasure_guard(:audit_user_id, pgmemory_erasure_stamp(:audit_user_id))"


def _audit_having(*, relax_commit: bool, guarded: bool) -> str:
    """The HAVING of an audit row's one-row step (no GROUP BY: it runs exactly once, with or
    without hits): :data:`_ERASURE_GUARD` when ``guarded``, :data:`_RELAX_COMMIT` when
    ``relax_commit``."""
    conditions = [c for c, on in ((_ERASURE_GUARD, guarded), (_RELAX_COMMIT, relax_commit)) if on]
    return f"\n    HAVING {' AND '.join(conditions)}" if conditions else ""


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
    where, window = _scope_filter(dimensions, windowed=windowed)

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
          AND {_LIVE}{window}
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


def _read_back(alias: str, columns: str, *, routed: bool, name: str = "m") -> str:
    """``CROSS JOIN LATERAL (...) AS m`` (or ``AS name``): ``alias``'s rows (by their ``id``
    and ``user_id``) read back from pgmemory_memories with ``columns`` (of ``m``), one
    primary-key probe each.

    The probe is a LATERAL subquery with ``OFFSET 0`` so that no plan turns it into a join:
    with ``routed`` it repeats ``m.user_id = :user_id`` (Citus routes by it), and as a join a
    generic plan (whose estimates say one row per CTE) may serve that filter from an index on
    the user's rows and scan all of them once per row read back (measured: a top-3 search of a
    3,400-row scope spent 0.6 ms of its 2.4 that way; docs/performance.md, "Generic plans on
    a tenant mix").
    """
    user = "\n          AND m.user_id = :user_id" if routed else ""
    return f"""CROSS JOIN LATERAL (
        SELECT {columns}
        FROM pgmemory_memories AS m
        WHERE m.id = {alias}.id AND m.user_id = {alias}.user_id{user}
        OFFSET 0
    ) AS {name}"""


def _scope_read_back(alias: str, columns: str, dimensions: tuple[str, ...]) -> str:
    """:func:`_read_back` in a user scope; without a user, a plain join (its only index
    conditions are the outer row's, and Citus cannot push a correlated subquery with OFFSET
    down to every shard)."""
    if "user_id" in dimensions:
        return _read_back(alias, columns, routed=True)
    return f"JOIN pgmemory_memories AS m ON m.id = {alias}.id AND m.user_id = {alias}.user_id"


# The search statement is composed of named parts, each one stage of the ranking: the scope's
# vector candidates (exact, or the approximate path's), the keyword ranking (BM25), the mode's
# ranking into ``top``, then the hits and, unless off, the recall audit row. A stage can change
# (another candidate stage for large scopes, another keyword side for recall) behind its name.


def _scope_filter(dimensions: tuple[str, ...], *, windowed: bool) -> tuple[str, str]:
    """The scope's predicate and its time window (``''`` without ``windowed``)."""
    window = "\n      AND m.created_at >= :since AND m.created_at < :until" if windowed else ""
    return _scope_where(dimensions), window


def _vector_candidates(
    dimensions: tuple[str, ...],
    *,
    covering: bool,
    windowed: bool,
    conversation: bool,
    materialized: bool,
    ann_dimensions: int | None,
    shortlist: FirstPass | None = None,
) -> str:
    """The ``candidates`` CTE: every live scope row with its exact cosine distance to
    ``:query``, or, on the approximate path, the approximate index's ``:ann_candidates`` nearest, or,
    with ``shortlist``, the :func:`_shortlist` rows with their exact distance."""
    where, window = _scope_filter(dimensions, windowed=windowed)
    if shortlist is not None:
        return _shortlist(dimensions, where + window, shortlist)
    if ann_dimensions is not None:
        typed = f"vector({int(ann_dimensions)})"
        return f"""candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at,
           CAST(m.embedding AS {typed}) <=> CAST(:query AS {typed}) AS distance
    FROM pgmemory_memories AS m
    WHERE {where}
      AND {_LIVE}{window}
    ORDER BY CAST(m.embedding AS {typed}) <=> CAST(:query AS {typed})
    LIMIT :ann_candidates
)"""
    guard = f"\n      AND vector_dims(m.embedding) <= {COVERING_MAX_DIMENSIONS}" if covering else ""
    # each row's conversation, for its neighbours (:func:`_conversation_links`)
    keys = ", m.application_id, m.agent_id, m.session_id" if conversation else ""
    return f"""candidates AS {"MATERIALIZED " if materialized else ""}(
    SELECT m.id, m.user_id, m.created_at{keys}, (m.embedding <=> :query) + 0 AS distance
    FROM pgmemory_memories AS m
    WHERE {where}{guard}
      AND {_LIVE}{window}
)"""


# A function of the parameters alone, in an expression a statement works out for every row,
# is written as a scalar subquery (an InitPlan, run once): a generic plan, as the store runs
# its prepared statements (connector.GENERIC_PLANS), folds nothing and calls it again for
# every row it reads (tests/store/test_plans.py).
#: The query vector's binary code, for the two-phase path's Hamming ranking (written inline,
#: the query was quantised again for every scope row, which made that pass slower than the
#: exact scan up to a few thousand rows: docs/performance.md).
_QUERY_CODE = "(SELECT binary_quantize(CAST(:query AS vector)))"
#: The query's unit vector in half precision, for the two-phase path's ``halves`` pass.
_QUERY_HALF = "(SELECT CAST(l2_normalize(CAST(:query AS vector)) AS halfvec))"
#: The query's keywords as a tsquery, for the keyword test of a scope without a user.
_QUERY_TSQUERY = "(SELECT websearch_to_tsquery('simple', :terms))"

#: The two-phase path's first passes: what a large scope's rows are ranked by before the
#: exact re-rank (:mod:`pgmemory.store.shortlist` picks one per collection).
FirstPass = Literal["codes", "halves"]
#: Each first pass's order and the predicate that makes its index match: ``codes`` by the
#: Hamming distance of the binary codes (``embedding_code``, d / 8 bytes a row, migration
#: 0013), ``halves`` by the inner product of half-precision unit vectors (``embedding_half``,
#: 2 bytes a dimension, opt-in: pgmemory.admin.half_vectors; NULL above 1,024 dimensions,
#: which its partial index leaves out). Each is read index-only from its own index.
_FIRST_PASSES: dict[FirstPass, tuple[str, str]] = {
    "codes": (f"m.embedding_code <~> {_QUERY_CODE}", ""),
    "halves": (f"m.embedding_half <#> {_QUERY_HALF}", "\n      AND m.embedding_half IS NOT NULL"),
}


def _shortlist(dimensions: tuple[str, ...], where: str, first_pass: FirstPass) -> str:
    """The two-phase ``candidates``: the ``:shortlist`` live scope rows nearest to ``:query``
    by their ``first_pass`` (:data:`_FIRST_PASSES`), then those rows' exact cosine distance,
    read from their full vectors one primary-key lookup each (:func:`_read_back`: no plan, a
    generic one included, whose estimates know nothing of ``:shortlist``, can turn it into a
    join that scans the scope's full vectors after all). The query's own code or half vector
    is a scalar subquery, worked out once.
    """
    order, guard = _FIRST_PASSES[first_pass]
    probe = _read_back(
        "s",
        "m.id, m.user_id, m.created_at, (m.embedding <=> :query) + 0 AS distance",
        routed="user_id" in dimensions,
    )
    return f"""shortlist AS MATERIALIZED (
    SELECT m.id, m.user_id
    FROM pgmemory_memories AS m
    WHERE {where}{guard}
      AND {_LIVE}
    ORDER BY {order}, m.id
    LIMIT :shortlist
),
candidates AS MATERIALIZED (
    SELECT m.id, m.user_id, m.created_at, m.distance
    FROM shortlist AS s
    {probe}
)"""


#: A user scope of more live rows than this ranks its keyword matches from a bounded pool
#: (:func:`_keyword_ranking`); up to this many, BM25 is exact over every matching row.
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
    whose plans know the values, the filter beside the key test (see :func:`_keyword_ranking`)."""
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


def _keyword_ranking(
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
    where, window = _scope_filter(dimensions, windowed=windowed)
    scope_size = (
        "SELECT count(*) AS n FROM candidates"
        if scope_from_candidates
        else f"SELECT count(*) AS n FROM pgmemory_memories AS m WHERE {where} AND {_LIVE}{window}"
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
      AND {_LIVE}{window}
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
          AND {_LIVE}{window}
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
    {_read_back("p", f"m.id, m.user_id, {length}, {_HITS}", routed=True)}
),
pairs AS MATERIALIZED (
    SELECT q.term, r.id, r.user_id, r.dl, r.tf
    FROM query_terms AS q CROSS JOIN LATERAL (
        SELECT m.id, m.user_id, {length}, {tf} AS tf
        FROM {source}
        WHERE {scoped}
          AND {_LIVE}{window}
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


def _hybrid_ranking(
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


def _hits(dimensions: tuple[str, ...], *, columns: tuple[str, ...] = ()) -> str:
    """The ``hits`` CTE: the ranked rows read back whole (plus ``columns`` of the memory
    row), at least ``:min_score``.

    The rows are read back by :func:`_scope_read_back`; when the scope names a user, it repeats
    ``m.user_id = :user_id``: a filter on the ranking's own columns alone does not tell Citus
    which shard the read-back reads, so without it every user's search ran on every shard.
    """
    extra = "".join(f", m.{c}" for c in columns)
    return f"""hits AS (
    SELECT {_READ_COLUMNS}{extra}, top.score
    FROM top
    {_scope_read_back("top", _READ_COLUMNS + extra, dimensions)}
    WHERE top.score >= :min_score
)"""


#: A signal the mode does not have.
_NONE = "CAST(NULL AS float8)"

#: A ranked row's neighbour share beyond which it is shown as a "neighbour" (of a match)
#: rather than a "match": most of its score was lent by an adjacent message.
_REASON = "CASE WHEN {n} > {own} THEN 'neighbour' ELSE 'match' END"


def _signals(*, mode: str, fusion: str) -> str:
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


#: A shown row's signals as the recall audit keeps them: one JSON object, values rounded.
_SIGNALS_JSON = """jsonb_build_object(
               'similarity', round(CAST({p}similarity AS numeric), 4),
               'keywords', round(CAST({p}keywords AS numeric), 4),
               'recency', round(CAST({p}recency AS numeric), 4),
               'neighbour', round(CAST({p}neighbour AS numeric), 4))"""


def _recall_audit(*, relax_commit: bool, guarded: bool, explained: bool = False) -> str:
    """The ``audit`` CTE: the recall audit row of the hits, written in the same statement
    (with ``explained``, each hit's reason and signals too, from :func:`_signals`; with
    ``guarded``, :data:`_ERASURE_GUARD`)."""
    relax = _audit_having(relax_commit=relax_commit, guarded=guarded)
    order = "ORDER BY h.score DESC, h.id"
    columns = values = ""
    source = "hits AS h"
    if explained:
        columns = ", reasons, signals"
        values = f""",
           COALESCE(array_agg(e.reason {order}), '{{}}'),
           COALESCE(jsonb_agg({_SIGNALS_JSON.format(p="e.")} {order}), '[]')"""
        source = "hits AS h JOIN explained AS e ON e.id = h.id AND e.user_id = h.user_id"
    return f""",
audit AS (
    INSERT INTO pgmemory_recall_audit
        (user_id, collection, application_id, agent_id, session_id, provider, mode,
         requesting_session_id, query_sha256, query_text, memory_ids, scores{columns})
    SELECT :audit_user_id, :collection, :audit_application_id, :audit_agent_id,
           :audit_session_id, :provider, :mode, :requesting_session_id,
           pgmemory_keyed_sha256(:audit_user_id, :query_sha256), :query_text,
           COALESCE(array_agg(h.id {order}), '{{}}'),
           COALESCE(array_agg(h.score {order}), '{{}}'){values}
    FROM {source}{relax}
)"""


def _ranking(
    dimensions: tuple[str, ...],
    *,
    covering: bool,
    mode: str,
    fusion: str,
    neighbours: bool,
    ann_dimensions: int | None,
    windowed: bool,
    shortlist: FirstPass | None = None,
    distributed: bool = False,
) -> str:
    """The CTEs of a mode's ranking, up to ``top`` (the best ``:limit`` rows and their score);
    shared by :func:`search_memories` and :func:`recall_memories` (``distributed``: for a
    table Citus distributes, see :func:`_keyword_ranking`)."""
    if neighbours and (mode != "hybrid" or fusion != "score"):
        raise ValueError("neighbours are part of mode='hybrid' with fusion='score' only")
    if ann_dimensions is not None and mode != "vector":
        raise ValueError("the approximate path serves mode='vector' only")
    if shortlist is not None and (mode != "vector" or ann_dimensions is not None):
        raise ValueError("the two-phase path serves mode='vector' on the exact path only")
    if mode not in SEARCH_MODES:
        raise ValueError(f"unknown search mode {mode!r}; expected one of {SEARCH_MODES}")
    candidates = _vector_candidates(
        dimensions,
        covering=covering,
        windowed=windowed,
        conversation=neighbours,
        materialized=mode != "vector",
        ann_dimensions=ann_dimensions,
        shortlist=shortlist,
    )
    keywords = _keyword_ranking(
        dimensions,
        windowed=windowed,
        scope_from_candidates=mode == "hybrid",
        distributed=distributed,
    )
    if mode == "vector":
        ranked = f"""{candidates},
top AS (
    SELECT id, user_id, CAST(1 - distance AS real) AS score
    FROM candidates ORDER BY distance, id LIMIT :limit
)"""
    elif mode == "text":
        ranked = f"""{keywords},
top AS (
    SELECT id, user_id, CAST(relevance AS real) AS score FROM by_text ORDER BY rank LIMIT :limit
)"""
    else:
        ranked = _hybrid_ranking(
            dimensions,
            candidates,
            keywords,
            fusion=fusion,
            neighbours=neighbours,
            windowed=windowed,
        )
    return ranked


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
    (:data:`_RELAX_COMMIT`, so a search in autocommit is one statement); with ``guarded`` it
    takes the user's erasure lock itself (:data:`_ERASURE_GUARD`). With ``explain``
    each hit also carries what each signal contributed to its score (:func:`_signals`: the
    columns ``similarity``, ``keywords``, ``recency``, ``neighbour``), and the audit row
    records them with each hit's reason.

    ``ann_dimensions`` (vector mode only) switches to the approximate path for large scopes:
    the candidates come from the collection's approximate index (HNSW or IVFFlat: an
    expression index on ``embedding::vector(D)``, see :data:`ANN_INDEX_DDL` and
    :data:`ANN_IVFFLAT_DDL`) with the scope filter applied inside the index scan,
    ``:ann_candidates`` of them (run with :data:`ANN_SETTINGS` or
    :data:`ANN_IVFFLAT_SETTINGS`: iterative scan, so the scan keeps reading until enough rows
    pass the filter), then re-ranked exactly.

    ``shortlist`` (vector mode only) is the two-phase path for large scopes: the scope's
    ``:shortlist`` rows nearest by that first pass (their binary codes, or their half-precision
    unit vectors), re-ranked by their exact cosine distance (:func:`_shortlist`);
    :mod:`pgmemory.store.shortlist` decides which scopes take it, through which pass, and how
    many rows it re-ranks.

    ``distributed``: the statement is for a table Citus distributes (the keyword side reads a
    term's rows beside the scope's filter, see :func:`_keyword_ranking`).
    """
    ranked = _ranking(
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
            _recall_audit(relax_commit=relax_commit, guarded=guarded, explained=True)
            if audit
            else ""
        )
        return f"""
WITH {ranked},
{_hits(dimensions, columns=("embedding",))},
{_signals(mode=mode, fusion=fusion)}{audit_cte}
SELECT {_READ_COLUMNS.replace("m.", "h.")}, h.score,
       e.similarity, e.keywords, e.recency, e.neighbour, e.reason
FROM hits AS h JOIN explained AS e ON e.id = h.id AND e.user_id = h.user_id
ORDER BY h.score DESC, h.id
"""
    audit_cte = _recall_audit(relax_commit=relax_commit, guarded=guarded) if audit else ""
    return f"""
WITH {ranked},
{_hits(dimensions)}{audit_cte}
SELECT * FROM hits ORDER BY score DESC, id
"""


# --- recall: what a provider injects, in one statement ----------------------------------------

#: A memory that records a tool call or result (not recalled unless asked for): a tool message,
#: one the provider marked so in its metadata (``"pgmemory.tool"``: ``"call"`` or ``"result"``),
#: or what a 0.2 provider stored for a call or a result without text.
_TOOL_MEMORY = """(m.role = 'tool'
           OR (m.metadata ->> 'pgmemory.tool') IS NOT NULL
           OR (m.role = 'assistant' AND (starts_with(m.content, '[called ')
                                         OR starts_with(m.content, '[tool result: '))))"""
#: A row's line cost (see pgmemory.store.recall_text): stored at write time; for a row written
#: by an older version, an upper bound (a character costs at most 4 once JSON-escaped, and the
#: time and role cost less than 32), capped at :item_cap.
_NEED = "LEAST(COALESCE({p}recall_tokens, 32 + 4 * length({p}content)), CAST(:item_cap AS bigint))"
#: A row the caller already shows the model (its message id is one of ``:exclude_message_ids``:
#: the session's history, the turn's input): never shown again. Tested only on the few rows a
#: recall may show (the walked and the recent ones), each against the whole list.
_SEEN = "({p}message_id IS NOT NULL AND {p}message_id = ANY(CAST(:exclude_message_ids AS text[])))"


def _near(a: str, b: str) -> str:
    """Whether two term sets (stripped tsvectors) overlap by ``:threshold`` or more (Jaccard):
    ``length`` counts a tsvector's distinct lexemes and ``||`` unites them, so with
    U = |A or B| the common terms are |A| + |B| - U, and (|A| + |B| - U) / U >= t reads
    |A| + |B| - U >= t U: one union a pair, no division. Two empty sets overlap by 1 (the
    second condition), an empty and a non-empty one by 0 (the inequality gives it)."""
    return f"""(length({a}) + length({b}) - length({a} || {b})
                 >= CAST(:threshold AS float8) * length({a} || {b})
             AND (length({a}) + length({b}) > 0 OR CAST(:threshold AS float8) <= 1))"""


#: No kept rows (a recall of no matches: ``max_results`` 0).
_NO_KEPT = """SELECT CAST(NULL AS bigint) AS rank, CAST(NULL AS uuid) AS id,
           CAST(NULL AS text) AS user_id, CAST(NULL AS real) AS score,
           CAST(NULL AS bigint) AS need
    WHERE false"""


def _walked_rows(dimensions: tuple[str, ...]) -> str:
    """The recall walk's read of each ranked row ``o`` (``walk_order``), as ``w``: its terms
    (``lexemes``), its line cost (``need``) and whether it may be shown (``showable``: not a
    tool memory, unless ``:include_tools``, and not a message the caller already shows,
    :data:`_SEEN`). In a user scope, one primary-key probe a row, made only when the walk gets
    to it (:func:`_read_back`); without a user, a join."""

    def columns(p: str) -> str:  # of the row ``p`` names (``m.``, ``mm.``)
        return f"""strip({p}search_vector) AS lexemes, {_NEED.format(p=p)} AS need,
               (CAST(:include_tools AS boolean) OR NOT {_TOOL_MEMORY.replace("m.", p)})
               AND NOT {_SEEN.format(p=p)} AS showable"""

    if "user_id" in dimensions:
        return _read_back("o", columns("m."), routed=True, name="w")
    return f"""JOIN pgmemory_memories AS mm ON mm.id = o.id AND mm.user_id = o.user_id
    CROSS JOIN LATERAL (
        SELECT {columns("mm.")}
    ) AS w"""


def _stage(name: str, source: str, order: str, limit: str, *, where: str = "") -> str:
    """One budget stage: the rows of ``source`` in ``order``, each shown (``cap``, its line's
    token cap) while the running cost stays within ``limit``; the first row that does not fit
    whole is shown shortened to the room left if that is at least ``:min_cap``, and the stage
    stops there. A row costs ``need + 1`` (its line and newline); ``limit`` is what the rows
    may take together, their section heading already counted."""
    where = f"\n        WHERE {where}" if where else ""
    return f"""{name} AS MATERIALIZED (
    SELECT y.*, CASE WHEN y.room >= y.need THEN y.need
                     WHEN y.room >= CAST(:min_cap AS bigint) THEN y.room END AS cap
    FROM (
        SELECT x.*, CAST(({limit}) - sum(x.need + 1) OVER (ORDER BY {order}) + x.need AS bigint)
               AS room
        FROM {source} AS x{where}
    ) AS y
)"""


def _used(name: str, stage: str, section_cost: str) -> str:
    """How many rows a stage showed, how many it had, and what they cost with their heading."""
    return f"""{name} AS MATERIALIZED (
    SELECT count(cap) AS n, count(*) AS total,
           COALESCE(sum(cap + 1), 0)
               + CASE WHEN count(cap) > 0 THEN {section_cost} ELSE 0 END AS used
    FROM {stage}
)"""


@builds(fan_out="a recall of a scope without a user (session, agent or application)")
@lru_cache(maxsize=128)
def recall_memories(
    dimensions: tuple[str, ...],
    *,
    covering: bool,
    mode: str | None,
    fusion: str = "score",
    neighbours: bool = False,
    max_results: int = 3,
    audit: bool = True,
    relax_commit: bool = False,
    guarded: bool = False,
    distributed: bool = False,
) -> str:
    """What a provider injects, chosen in one statement, with its recall audit row.

    * ``recent``: the newest ``:recent_turns`` user messages of the scope and every message
      after them (at most ``:recent_rows`` rows), tool memories (:data:`_TOOL_MEMORY`) left
      out unless ``:include_tools``; those the caller already shows (:data:`_SEEN`) are not
      shown, but still count as recent (a match near one is a near-duplicate);
    * ``matches`` (unless ``mode`` is None: no query): the mode's best ``:limit`` rows
      (:func:`_ranking`, with :func:`_signals`), less the recent ones, tool memories and
      those the caller already shows, then
      walked in rank order keeping a row unless its term set (``search_vector``'s lexemes)
      overlaps a recent row's or a kept row's by ``:threshold`` or more (Jaccard), until
      ``max_results`` are kept (the statement's shape: one step per kept row);
    * the budget, as :mod:`pgmemory.store.recall_text` renders it: ``:fixed`` tokens for the
      heading and note, each row's line capped at ``:item_cap``; the matches while they fit
      ``:half``, then the recent rows newest first while they fit ``:max_tokens``, then (when
      every recent row is shown) the further matches (:func:`_stage`), each section heading
      costing ``:related_cost`` / ``:recent_cost`` once;
    * the audit row (unless ``audit`` is off) holds exactly the shown rows, in shown order,
      with their scores, reasons and signals, and ``:mode``; ``relax_commit`` and
      ``guarded`` as for :func:`search_memories`.

    Returns the shown rows in shown order (related most relevant first, then recent oldest
    first): the memory, ``reason``, ``score``, ``cap`` and the signal columns.
    ``distributed`` as for :func:`search_memories`.
    """
    where = _scope_where(dimensions)
    ctes: list[str] = []
    if mode is not None:
        ctes.append(
            _ranking(
                dimensions,
                covering=covering,
                mode=mode,
                fusion=fusion,
                neighbours=neighbours,
                ann_dimensions=None,
                windowed=False,
                distributed=distributed,
            )
        )
        # The ranked rows in rank order, not read back: the walk below reads a row only when
        # it gets to it.
        ctes.append("""walk_order AS MATERIALIZED (
    SELECT t.id, t.user_id, t.score, row_number() OVER (ORDER BY t.score DESC, t.id) AS rank
    FROM top AS t
    WHERE t.score >= :min_score
)""")
    ctes.append(f"""latest AS MATERIALIZED (
    SELECT m.id, m.user_id, m.role, m.created_at, m.message_id,
           strip(m.search_vector) AS lexemes, {_NEED.format(p="m.")} AS need
    FROM pgmemory_memories AS m
    WHERE {where}
      AND {_LIVE}
      AND (CAST(:include_tools AS boolean) OR NOT {_TOOL_MEMORY})
    ORDER BY m.created_at DESC, m.id DESC
    LIMIT :recent_rows
)""")
    ctes.append(f"""recent AS MATERIALIZED (
    SELECT id, user_id, lexemes, need, pos, {_SEEN.format(p="")} AS seen
    FROM (
        SELECT l.*, row_number() OVER newest AS pos,
               count(*) FILTER (WHERE l.role = 'user') OVER newest
                   - CASE WHEN l.role = 'user' THEN 1 ELSE 0 END AS users_before
        FROM latest AS l
        WINDOW newest AS (ORDER BY l.created_at DESC, l.id DESC)
    ) AS w
    WHERE users_before < :recent_turns
)""")
    if mode is not None:
        walked = _walked_rows(dimensions)
        # The greedy walk, unrolled (Citus plans no recursive CTE beside a data-modifying
        # one): keep_k holds the first ranked row after keep_(k-1)'s that is no tool memory
        # (unless :include_tools), no recent row, near no recent row and near none of keep_1 ..
        # keep_(k-1), with its terms. Each step reads the rows it walks past, in rank order,
        # and stops at the one it keeps: a LIMIT 1 over a nested loop whose outer side comes
        # sorted (a subquery with its own ORDER BY and LIMIT, which the planner keeps whole;
        # over the CTE itself it sorted the loop's output, reading every row). A recall reads
        # the few rows before its matches, not all :limit ranked rows.
        for k in range(1, max_results + 1):
            after = f"(SELECT rank FROM keep_{k - 1})" if k > 1 else "0"
            against_kept = "".join(
                f"""
      AND NOT EXISTS (SELECT 1 FROM keep_{j} AS b WHERE {_near("w.lexemes", "b.lexemes")})"""
                for j in range(1, k)
            )
            near_recent = _near("w.lexemes", "r.lexemes")
            ctes.append(f"""keep_{k} AS MATERIALIZED (
    SELECT o.rank, o.id, o.user_id, o.score, w.need, w.lexemes
    FROM (SELECT * FROM walk_order WHERE rank > {after} ORDER BY rank LIMIT :limit) AS o
    {walked}
    WHERE w.showable
      AND NOT EXISTS (SELECT 1 FROM recent AS r WHERE r.id = o.id AND r.user_id = o.user_id)
      AND NOT EXISTS (SELECT 1 FROM recent AS r WHERE {near_recent}){against_kept}
    ORDER BY o.rank
    LIMIT 1
)""")
        kept = " UNION ALL ".join(
            f"SELECT rank, id, user_id, score, need FROM keep_{k}"
            for k in range(1, max_results + 1)
        )
        ctes.append(f"""matches AS MATERIALIZED (
    SELECT k.id, k.user_id, k.score, k.need, row_number() OVER (ORDER BY k.rank) AS ord
    FROM ({kept or _NO_KEPT}) AS k
)""")
        # The matches' own rows, for their signals (:func:`_signals` reads ``hits``).
        columns = "m.id, m.user_id, m.created_at, m.embedding"
        ctes.append(f"""hits AS (
    SELECT {columns}, x.score
    FROM matches AS x
    {_scope_read_back("x", columns, dimensions)}
)""")
        ctes.append(_signals(mode=mode, fusion=fusion))
    else:
        ctes.append("""matches AS (
    SELECT CAST(NULL AS uuid) AS id, CAST(NULL AS text) AS user_id, CAST(NULL AS real) AS score,
           CAST(NULL AS bigint) AS need, CAST(NULL AS bigint) AS ord
    WHERE false
)""")
    fixed = "CAST(:fixed AS bigint)"
    related_cost = "CAST(:related_cost AS bigint)"
    recent_cost = "CAST(:recent_cost AS bigint)"
    ctes += [
        _stage("stage_a", "matches", "x.ord", f"CAST(:half AS bigint) - {fixed} - {related_cost}"),
        _used("used_a", "stage_a", related_cost),
        _stage(
            "stage_b",
            "recent",
            "x.pos",
            f"CAST(:max_tokens AS bigint) - {fixed} - (SELECT used FROM used_a) - {recent_cost}",
            where="NOT x.seen",
        ),
        _used("used_b", "stage_b", recent_cost),
        _stage(
            "stage_c",
            "matches",
            "x.ord",
            f"CAST(:max_tokens AS bigint) - {fixed} - (SELECT used FROM used_a)"
            " - (SELECT used FROM used_b)"
            f" - CASE WHEN (SELECT n FROM used_a) = 0 THEN {related_cost} ELSE 0 END",
            where="x.ord > (SELECT n FROM used_a) AND (SELECT n = total FROM used_b)",
        ),
    ]
    explained = (
        "LEFT JOIN explained AS e ON e.id = c.id AND e.user_id = c.user_id"
        if mode is not None
        else "LEFT JOIN (SELECT CAST(NULL AS uuid) AS id, CAST(NULL AS text) AS user_id, "
        "CAST(NULL AS float8) AS similarity, CAST(NULL AS float8) AS keywords, "
        "CAST(NULL AS float8) AS recency, CAST(NULL AS float8) AS neighbour, "
        "CAST(NULL AS text) AS reason) AS e ON false"
    )
    ctes.append(f"""chosen AS (
    SELECT id, user_id, ord AS place, cap, score FROM stage_a WHERE cap IS NOT NULL
    UNION ALL
    SELECT id, user_id, ord, cap, score FROM stage_c WHERE cap IS NOT NULL
    UNION ALL
    SELECT id, user_id, 1000000 + (SELECT count(*) FROM recent) - pos, cap, CAST(0 AS real)
    FROM stage_b WHERE cap IS NOT NULL
),
shown AS MATERIALIZED (
    SELECT c.id, c.user_id, c.cap, c.score, row_number() OVER (ORDER BY c.place) AS seq,
           CASE WHEN c.place >= 1000000 THEN 'recent' ELSE e.reason END AS reason,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.similarity END AS similarity,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.keywords END AS keywords,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.recency END AS recency,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.neighbour END AS neighbour
    FROM chosen AS c
    {explained}
)""")
    if audit:
        relax = _audit_having(relax_commit=relax_commit, guarded=guarded)
        signals = _SIGNALS_JSON.format(p="s.")
        ctes.append(f"""audit AS (
    INSERT INTO pgmemory_recall_audit
        (user_id, collection, application_id, agent_id, session_id, provider, mode,
         requesting_session_id, query_sha256, query_text, memory_ids, scores, reasons, signals)
    SELECT :audit_user_id, :collection, :audit_application_id, :audit_agent_id,
           :audit_session_id, :provider, :mode, :requesting_session_id,
           pgmemory_keyed_sha256(:audit_user_id, :query_sha256), :query_text,
           COALESCE(array_agg(s.id ORDER BY s.seq), '{{}}'),
           COALESCE(array_agg(s.score ORDER BY s.seq), '{{}}'),
           COALESCE(array_agg(s.reason ORDER BY s.seq), '{{}}'),
           COALESCE(jsonb_agg(CASE WHEN s.reason = 'recent' THEN NULL ELSE {signals} END
                              ORDER BY s.seq), '[]')
    FROM shown AS s{relax}
)""")
    body = ",\n".join(ctes)
    return f"""
WITH {body}
SELECT {_READ_COLUMNS}, s.reason, s.score, s.cap, s.similarity, s.keywords, s.recency,
       s.neighbour
FROM shown AS s
{_scope_read_back("s", _READ_COLUMNS, dimensions)}
ORDER BY s.seq
"""


@builds(fan_out="listing a scope without a user (session, agent or application)")
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


@builds(fan_out="counting a scope without a user (session, agent or application)")
@lru_cache(maxsize=64)
def count_memories(dimensions: tuple[str, ...]) -> str:
    """How many live memories a scope holds."""
    return f"""
SELECT count(*) FROM pgmemory_memories AS m
WHERE {_scope_where(dimensions)}
  AND {_LIVE}
"""


# --- memories: deletes ---------------------------------------------------------------------


@builds(fan_out="deleting by id in a scope without a user (session, agent or application)")
@lru_cache(maxsize=64)
def delete_ids(dimensions: tuple[str, ...], *, distributed: bool = False) -> str:
    """Delete the memories with the given ids inside a scope, auditing each row: ids are unique
    per user only, so the scope is what keeps a delete from reaching another tenant's row.

    In a user scope each id is found by a primary-key probe (a LATERAL subquery with
    ``OFFSET 0`` that names the id alone), the scope is filtered above it, and the rows found
    are deleted: with the scope's filter beside the ids, a generic plan (estimating a user's
    rows from the table's average) read every row of the user through an index on
    ``(collection, user_id)`` and tested each id (a 3,000-row user: 0.49 ms against 0.013
    with the values known). On Citus (``distributed``), which routes the DELETE by the filter
    on its target and plans with the values, the filter stays on the target.
    """
    if "user_id" not in dimensions or distributed:
        return _audited(
            f"""
    DELETE FROM pgmemory_memories AS m
    WHERE {_scope_where(dimensions)}
      AND m.id = ANY(CAST(:ids AS uuid[]))""",
            "delete",
        )
    return _audited(
        f"""
    DELETE FROM pgmemory_memories AS gone
    USING (
        SELECT m.id AS found_id, m.user_id AS found_user
        FROM unnest(CAST(:ids AS uuid[])) AS d(wanted)
        CROSS JOIN LATERAL (
            SELECT m.id, m.user_id, m.collection, m.application_id, m.agent_id, m.session_id
            FROM pgmemory_memories AS m
            WHERE m.id = d.wanted
            OFFSET 0
        ) AS m
        WHERE {_scope_where(dimensions)}
    ) AS found
    WHERE gone.id = found.found_id AND gone.user_id = found.found_user""",
        "delete",
    )


#: Delete every expired memory (optionally of one collection), auditing each row.
DELETE_EXPIRED = Statement(
    _audited(
        """
    DELETE FROM pgmemory_memories
    WHERE expires_at IS NOT NULL AND expires_at <= :now
      AND (CAST(:collection AS text) IS NULL OR collection = :collection)""",
        "expire",
    ),
    fan_out="the expiry sweep: every user's expired rows, on every shard",
)


@builds(fan_out="erasing a session, agent or application scope (no user): any user's rows")
@lru_cache(maxsize=64)
def delete_scope(dimensions: tuple[str, ...]) -> str:
    """Erase every memory of a scope (expired ones too), auditing each row."""
    return _audited(
        f"""
    DELETE FROM pgmemory_memories AS m
    WHERE {_scope_where(dimensions)}""",
        "delete",
    )


# --- large scopes: the approximate (HNSW or IVFFlat) path -----------------------------------
# One partial expression index per collection (the embedding column is untyped, a collection's
# size is fixed), named after a hash of the collection name; the DDL is built server-side
# with format() so the name and the literal are quoted by PostgreSQL.

#: A collection's approximate index's name (whatever its kind).
_ANN_NAME = "'pgmemory_ann_' || left(md5(:collection), 16)"

#: The CREATE INDEX statement of a collection's approximate index (to run in autocommit), for
#: an access method, its options (``name = %s``) and their bound values.
_ANN_INDEX_DDL = """
SELECT format(
    'CREATE INDEX CONCURRENTLY IF NOT EXISTS %I ON pgmemory_memories '
    'USING {method} ((CAST(embedding AS vector(%s))) vector_cosine_ops) '
    'WITH ({options}) WHERE collection = %L',
    {name}, CAST(:dimensions AS int),
    {values}, :collection)
"""

#: The CREATE INDEX statement for a collection's HNSW index (to run in autocommit).
ANN_INDEX_DDL = Statement(
    _ANN_INDEX_DDL.format(
        method="hnsw",
        options="m = %s, ef_construction = %s",
        name=_ANN_NAME,
        values="CAST(:m AS int), CAST(:ef_construction AS int)",
    ),
    fan_out="DDL: the approximate index is built on every shard",
)

#: The CREATE INDEX statement for a collection's IVFFlat index (to run in autocommit): the
#: collection's vectors clustered into :lists lists (k-means over the rows stored at build
#: time), each row filed under its nearest list's centre.
ANN_IVFFLAT_DDL = Statement(
    _ANN_INDEX_DDL.format(
        method="ivfflat", options="lists = %s", name=_ANN_NAME, values="CAST(:lists AS int)"
    ),
    fan_out="DDL: the approximate index is built on every shard",
)

#: The rows of a collection (what an IVFFlat index's default number of lists follows).
ANN_COLLECTION_ROWS = Statement(
    "SELECT count(*) FROM pgmemory_memories WHERE collection = :collection",
    fan_out="enable_ann: the collection's size for an IVFFlat index's lists",
)

#: The DROP INDEX statement for a collection's approximate index (to run in autocommit).
ANN_DROP_DDL = Statement(f"""
SELECT format('DROP INDEX CONCURRENTLY IF EXISTS %I', {_ANN_NAME})
""")

#: Session settings for maintenance (an approximate index's build, an import's vacuum): no
#: statement timeout (it may take minutes), and optionally more memory (a build that fits in
#: maintenance_work_mem is several times faster).
MAINTENANCE_SETTINGS = Statement("""
SELECT set_config('statement_timeout', '0', false),
       set_config('maintenance_work_mem', COALESCE(CAST(:maintenance_work_mem AS text),
                                                   current_setting('maintenance_work_mem')), false)
""")

#: Back to the connection's own settings after maintenance (what RESET would restore).
MAINTENANCE_RESET = Statement("""
SELECT set_config(name, reset_val, false) FROM pg_settings
WHERE name IN ('statement_timeout', 'maintenance_work_mem')
""")

#: A collection's approximate index, if it exists: whether it is valid (a failed concurrent
#: build is not), then its access method (``hnsw``, ``ivfflat``).
ANN_INDEX_STATE = Statement(f"""
SELECT i.indisvalid, a.amname
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
JOIN pg_am AS a ON a.oid = c.relam
WHERE i.indexrelid = to_regclass({_ANN_NAME})
""")

#: Settings of a transaction on the HNSW path: iterative scan (keep walking the graph
#: until enough rows pass the scope filter), the search breadth, a custom plan (the partial
#: index matches only a literal collection, and a generic plan prices the scope at an average
#: size), and no sort-based plan for the candidates (sorting the scope's B-tree rows is the
#: exact path, which this statement exists to avoid on scopes known to be large).
ANN_SETTINGS = Statement("""
SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),
       set_config('hnsw.ef_search', CAST(:ef_search AS text), true),
       set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('enable_sort', 'off', true)
""")

#: :data:`ANN_SETTINGS` for an IVFFlat index: the lists nearest the query read first
#: (:probes), then, while too few of their rows pass the scope filter, the next ones
#: (iterative scan).
ANN_IVFFLAT_SETTINGS = Statement("""
SELECT set_config('ivfflat.iterative_scan', 'relaxed_order', true),
       set_config('ivfflat.probes', CAST(:probes AS text), true),
       set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('enable_sort', 'off', true)
""")

#: The user scopes the approximate path serves, with their rows, the largest first: more than
#: :min_rows rows, none of which can expire (an expiry filter thins the index's candidates);
#: rows without a user (``''``) are no user scope. Counted once a recall probe, which samples
#: the largest of them (each with SCOPE_SAMPLE: one user per statement, so that Citus routes it
#: to one shard).
ANN_LARGE_USERS = Statement(
    """
    SELECT user_id, count(*) AS memories FROM pgmemory_memories
    WHERE collection = :collection AND user_id <> ''
    GROUP BY user_id HAVING count(*) > :min_rows AND count(expires_at) = 0
    ORDER BY count(*) DESC, user_id
""",
    fan_out="the approximate-index probe: the large users' scopes and their sizes (all users)",
)


# --- large scopes: the two-phase path (codes or half vectors, then exact re-rank) -----------

#: The users whose scope takes the two-phase path: more than :min_rows stored rows (expired
#: ones too: the first pass reads them until they are swept); rows without a user (``''``)
#: are no user scope. Refreshed with every two-phase probe (see pgmemory.store.shortlist).
_SHORTLIST_SCOPES = """
    SELECT user_id FROM pgmemory_memories
    WHERE collection = :collection AND user_id <> ''
    GROUP BY user_id HAVING count(*) > :min_rows"""

#: The users whose scope takes the two-phase path, with their rows (see _SHORTLIST_SCOPES).
SHORTLIST_LARGE_USERS = Statement(
    _SHORTLIST_SCOPES.replace("SELECT user_id", "SELECT user_id, count(*)"),
    fan_out="the two-phase probe: which users' scopes are large (all users)",
)

#: Probe queries for the approximate and two-phase paths: :samples stored rows (id and
#: vector) of one user's scope, at random (one statement per probed user, so that Citus routes
#: each to one shard).
SCOPE_SAMPLE = Statement("""
SELECT m.id, m.embedding FROM pgmemory_memories AS m
WHERE m.collection = :collection AND m.user_id = :user_id
ORDER BY random()
LIMIT :samples
""")


# --- chat history --------------------------------------------------------------------------


#: A write takes the erasure lock of each user it names, shared (in sorted order): a running
#: erasure of one of them makes it wait, and an erasure waits for it. In the same statement it
#: takes the append lock of each chat-history session it appends to, exclusively (appends to one
#: session take turns, so two never pick the same ``seq``); erasure locks first.
LOCK_FOR_WRITE = Statement(f"""
SELECT locks.held FROM (
    SELECT 1 AS step, x.i, pg_advisory_xact_lock_shared({_ERASURE_LOCK_CLASS}, hashtext(x.u)) AS held
    FROM unnest(CAST(:users AS text[])) WITH ORDINALITY AS x(u, i)
    UNION ALL
    SELECT 2, y.i, pg_advisory_xact_lock(hashtextextended(y.s, hashtext(y.u)))
    FROM unnest(CAST(:session_users AS text[]), CAST(:sessions AS text[]))
        WITH ORDINALITY AS y(u, s, i)
) AS locks ORDER BY locks.step, locks.i
""")

#: One user's erasure lock, shared, and nothing else: what an audited search or recall of a
#: user scope takes (LOCK_FOR_WRITE's arrays, union and sort cost ~0.05 ms more a call).
LOCK_USER_SHARED = Statement(
    f"SELECT pg_advisory_xact_lock_shared({_ERASURE_LOCK_CLASS}, hashtext(:user_id))"
)

#: An erasure takes its user's lock exclusively: writes of the user already running finish
#: first (and are erased with the user), later ones wait for the erasure to commit.
LOCK_USER_FOR_ERASURE = Statement(
    f"SELECT pg_advisory_xact_lock({_ERASURE_LOCK_CLASS}, hashtext(:user_id))"
)

#: A chat-history append: its messages after ``base.last_seq``, the session's last seq
#: (``{base}``, with any ``{head}`` it needs); a message id already stored is skipped.
_APPEND_HISTORY = """{head}
INSERT INTO pgmemory_chat_messages (user_id, session_id, seq, message_id, role, message)
SELECT :user_id, :session_id, base.last_seq + r.ord, r.message_id, r.role, r.message
FROM {base},
unnest(CAST(:message_ids AS text[]), CAST(:roles AS text[]), CAST(:messages AS jsonb[]))
    WITH ORDINALITY AS r(message_id, role, message, ord)
ON CONFLICT (user_id, session_id, message_id) DO NOTHING
RETURNING seq
"""

#: Append messages after the session's last seq; a message id already stored is skipped (its
#: locks taken before it, by LOCK_FOR_WRITE).
APPEND_HISTORY = Statement(
    _APPEND_HISTORY.format(
        head="",
        base="""(
    SELECT COALESCE(max(seq), 0) AS last_seq FROM pgmemory_chat_messages
    WHERE user_id = :user_id AND session_id = :session_id
) AS base""",
    )
)

#: APPEND_HISTORY taking its own locks: the session's last seq comes from
#: ``pgmemory_history_tail`` (migration 0022), evaluated once (a materialised step), after it
#: holds the user's erasure lock and the session's append lock, read with a fresh snapshot (so
#: it follows what the append before it committed).
APPEND_HISTORY_LOCKING = Statement(
    _APPEND_HISTORY.format(
        head="""
WITH base AS MATERIALIZED (
    SELECT pgmemory_history_tail(:user_id, :session_id) AS last_seq
)""",
        base="base",
    )
)

#: A history append as the deployment runs it (:class:`~pgmemory.store._engine.deployment.Locking`).
HISTORY_APPEND = Locking(APPEND_HISTORY_LOCKING, APPEND_HISTORY)

#: A page of a session's history in order.
READ_HISTORY = Statement("""
SELECT seq, message, created_at FROM pgmemory_chat_messages
WHERE user_id = :user_id AND session_id = :session_id AND seq > :after_seq
ORDER BY seq
LIMIT :limit
""")

#: How many messages a session's history holds.
COUNT_HISTORY = Statement("""
SELECT count(*) FROM pgmemory_chat_messages WHERE user_id = :user_id AND session_id = :session_id
""")

#: Erase a session's history.
DELETE_HISTORY = Statement("""
DELETE FROM pgmemory_chat_messages WHERE user_id = :user_id AND session_id = :session_id
""")


# --- facts ---------------------------------------------------------------------------------

#: A scope's facts in one namespace (locked when merging).
GET_FACTS = Statement("""
SELECT facts FROM pgmemory_facts
WHERE user_id = :user_id AND application_id = :application_id AND agent_id = :agent_id
  AND session_id = :session_id AND namespace = :namespace
""")
GET_FACTS_FOR_UPDATE = Statement(GET_FACTS + "FOR UPDATE")

#: Create a scope's facts row if missing, so the merge below can lock it.
ENSURE_FACTS = Statement("""
INSERT INTO pgmemory_facts (user_id, application_id, agent_id, session_id, namespace)
VALUES (:user_id, :application_id, :agent_id, :session_id, :namespace)
ON CONFLICT DO NOTHING
""")

#: Replace a scope's facts with the merged object.
UPDATE_FACTS = Statement("""
UPDATE pgmemory_facts SET facts = :facts, updated_at = now()
WHERE user_id = :user_id AND application_id = :application_id AND agent_id = :agent_id
  AND session_id = :session_id AND namespace = :namespace
""")

#: Record changed facts (old and new value per key, and what they were derived from).
AUDIT_FACTS = Statement("""
INSERT INTO pgmemory_fact_audit
    (user_id, application_id, agent_id, session_id, namespace, key, old_value, new_value, actor,
     sources)
SELECT :user_id, :application_id, :agent_id, :session_id, :namespace, c.key, c.old_value,
       c.new_value, :actor, CAST(:sources AS jsonb)
FROM unnest(CAST(:keys AS text[]), CAST(:old_values AS jsonb[]), CAST(:new_values AS jsonb[]))
    AS c(key, old_value, new_value)
""")

#: Erase a scope's facts in one namespace (or every namespace).
DELETE_FACTS = Statement("""
DELETE FROM pgmemory_facts
WHERE user_id = :user_id AND application_id = :application_id AND agent_id = :agent_id
  AND session_id = :session_id AND (CAST(:namespace AS text) IS NULL OR namespace = :namespace)
""")

# --- the derivation queue ------------------------------------------------------------------
# A job is due when its time has come, it has attempts left, and no live lease holds it; with
# :early, a job never tried is due at once (what process_now and flush ask for). A worker
# leases all of one user's due jobs, and their jobs never tried, at once (one UPDATE, which
# re-checks the condition on rows another worker just leased), calls the model with no
# transaction open, then deletes them by its lease and their ids in the transaction that writes
# what it derived, or gives them back by the same, one (namespace, scope) group at a time.

_DUE = """namespace = ANY(CAST(:namespaces AS text[])) AND attempts < :max_attempts
  AND (leased_until IS NULL OR leased_until <= now())
  AND (run_after <= now() OR (attempts = 0 AND CAST(:early AS boolean)))"""

#: Queue one job (in the caller's transaction: a turn that rolls back queues nothing), due in
#: :delay_s seconds (a user's turns meanwhile are extracted with it).
ENQUEUE_JOB = Statement("""
INSERT INTO pgmemory_jobs
    (user_id, id, namespace, application_id, agent_id, session_id, payload, run_after)
VALUES (:user_id, :id, :namespace, :application_id, :agent_id, :session_id, :payload,
        now() + make_interval(secs => :delay_s))
""")

#: The users with due jobs in these namespaces, the longest-waiting first.
JOBS_DUE_USERS = Statement(
    f"""
SELECT user_id FROM pgmemory_jobs WHERE {_DUE}
GROUP BY user_id ORDER BY min(run_after) LIMIT :limit
""",
    fan_out="a worker's scan for the users whose derivation jobs are due (all users)",
)

#: Lease every due job of one user in these namespaces, and those never tried (:early true);
#: returns what they hold.
LEASE_JOBS = Statement(f"""
UPDATE pgmemory_jobs
SET lease_id = :lease_id, leased_until = now() + make_interval(secs => :lease_s),
    attempts = attempts + 1
WHERE user_id = :user_id AND {_DUE}
RETURNING id, namespace, application_id, agent_id, session_id, payload, attempts, created_at
""")

#: Delete these jobs of a lease (done: one (namespace, scope) group, or all of the lease's);
#: returns their ids: fewer than named means the rest were taken over after the lease ran out,
#: or cancelled by the user's erasure.
COMPLETE_JOBS = Statement("""
DELETE FROM pgmemory_jobs
WHERE user_id = :user_id AND lease_id = :lease_id AND id = ANY(CAST(:ids AS uuid[]))
RETURNING id
""")

#: Give these jobs of a lease back after their failure (one group's: the lease's other jobs keep
#: their lease), due again after a back-off; the error's type only.
RELEASE_JOBS = Statement("""
UPDATE pgmemory_jobs
SET lease_id = NULL, leased_until = NULL, last_error = :error,
    run_after = now() + make_interval(secs => :retry_in_s)
WHERE user_id = :user_id AND lease_id = :lease_id AND id = ANY(CAST(:ids AS uuid[]))
""")

#: How many jobs in these namespaces still have attempts left (due, waiting or leased).
JOBS_PENDING = Statement(
    """
SELECT count(*) FROM pgmemory_jobs
WHERE namespace = ANY(CAST(:namespaces AS text[])) AND attempts < :max_attempts
""",
    fan_out="how many derivation jobs are pending, for flush() and the worker's report",
)

#: Delete the jobs in these namespaces that used up their attempts and were last tried more
#: than :older_than_s seconds ago (they still hold the messages they were queued with); how many.
DROP_FAILED_JOBS = Statement(
    """
WITH dropped AS (
    DELETE FROM pgmemory_jobs
    WHERE namespace = ANY(CAST(:namespaces AS text[])) AND attempts >= :max_attempts
      AND COALESCE(leased_until, run_after) < now() - make_interval(secs => :older_than_s)
    RETURNING 1
)
SELECT count(*) FROM dropped
""",
    fan_out="the worker's sweep of jobs out of attempts past their keep time (all users)",
)

#: Whether the memories keep binary codes (migration 0013 adds them where pgvector >= 0.7) and
#: half-precision unit vectors (where an operator added them: pgmemory.admin.half_vectors), and
#: the installed pgvector's version.
FIRST_PASSES = Statement(
    """
SELECT EXISTS (
    SELECT 1 FROM pg_attribute
    WHERE attrelid = to_regclass('pgmemory_memories') AND attname = 'embedding_code'
      AND NOT attisdropped
) AS codes, EXISTS (
    SELECT 1 FROM pg_attribute
    WHERE attrelid = to_regclass('pgmemory_memories') AND attname = 'embedding_half'
      AND NOT attisdropped
) AS halves, (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS pgvector
""",
    fan_out="opening a store: whether the table keeps codes and half vectors (the catalog), no rows",
)

# --- Citus ---------------------------------------------------------------------------------

#: Whether the citus extension is installed in this database.
CITUS_INSTALLED = Statement("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')")

#: Whether the memories table is distributed by Citus (run only where citus is installed).
MEMORIES_DISTRIBUTED = Statement(
    """
SELECT EXISTS (
    SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('pgmemory_memories')
)""",
    fan_out="opening a store: whether Citus distributes the table, no rows",
)


# --- recall audit --------------------------------------------------------------------------


@builds()
@lru_cache(maxsize=2)
def record_recall(*, relax_commit: bool) -> str:
    """Record a recall assembled by a caller (e.g. similar plus most recent memories), with
    each memory's reason and signals when given (NULL otherwise); with
    ``relax_commit`` the statement lets its transaction commit without waiting for the disk
    flush, as :func:`search_memories` does (a SELECT without FROM: its WHERE runs once)."""
    # Without the relaxed commit, a VALUES row: Citus routes it to the user's shard as one
    # INSERT (a SELECT without FROM it would insert through the coordinator, by COPY).
    head, tail = ("SELECT", f"\nWHERE {_RELAX_COMMIT}") if relax_commit else ("VALUES (", ")")
    return f"""
INSERT INTO pgmemory_recall_audit
    (user_id, collection, application_id, agent_id, session_id, provider, mode,
     requesting_session_id, query_sha256, query_text, memory_ids, scores, reasons, signals)
{head} :user_id, :collection, :application_id, :agent_id, :session_id, :provider, :mode,
       :requesting_session_id, pgmemory_keyed_sha256(:user_id, :query_sha256), :query_text,
       CAST(:memory_ids AS uuid[]), CAST(:scores AS real[]), CAST(:reasons AS text[]),
       CAST(:signals AS jsonb){tail}
"""


# --- erasure of a user ---------------------------------------------------------------------

#: Erase everything stored about a user, as one call of a SECURITY DEFINER function (migration
#: 0014): audit and delete their memories in every collection, delete their facts and chat
#: history and cancel their pending derivation jobs (migration 0016), then move their audit rows to a pseudonym (personal values blanked), destroy their
#: secret and record the erasure. The owner does it all, so Citus never sees the application
#: role and the owner change the same shards in one transaction. Returns {"pseudonym",
#: "pseudonymised": {table: rows}, "erased": {"memories", "facts", "history_messages", "jobs"}}.
ERASE_USER = Statement("SELECT pgmemory_erase_user(:user_id, :actor)")


# --- read replicas -------------------------------------------------------------------------

#: The primary's WAL insert position, read right after a write commits (read-your-writes).
WAL_POSITION = Statement("SELECT pg_current_wal_insert_lsn()::text AS lsn")

#: Whether a read replica still replays WAL, how far it has, and how many seconds it lags (0
#: when it has replayed all it received).
REPLICA_HEALTH = Statement("""
SELECT pg_is_in_recovery() AS standby,
       pg_last_wal_replay_lsn()::text AS replayed,
       CASE WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn() THEN 0.0
            ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0.0)::float8
       END AS lag_s
""")

#: How far a read replica has replayed the primary's WAL (NULL on a server that is no replica).
REPLAY_POSITION = Statement("SELECT pg_last_wal_replay_lsn()::text")

# --- hash partitioning of the memories table by user (see pgmemory.store.partitioning) -------

#: What the memories table is now: its relkind ('r' plain, 'p' partitioned; NULL: no table).
MEMORIES_RELKIND = Statement(
    """
SELECT c.relkind::text FROM pg_class AS c WHERE c.oid = to_regclass('pgmemory_memories')
""",
    fan_out="pgmemory db partition, enable_ann: the catalog's kind of the table, no rows",
)

#: Take the migration advisory lock for the current transaction.
MIGRATION_XACT_LOCK = Statement("SELECT pg_advisory_xact_lock(:key)")


register(__name__, globals())
