"""Every SQL statement the store issues, each with a one-line purpose, but the ranking's: the
search and recall statements are built in :mod:`pgmemory.store._ranking`.

All statements are parameterised. The only text ever spliced into a statement is chosen from
fixed fragments (scope column predicates, the covering-index guard); nothing that a caller
passes becomes part of SQL text.
"""

from __future__ import annotations

from functools import lru_cache

from pgmemory.store._engine.deployment import Locking
from pgmemory.store._engine.statement import Statement, builds, register
from pgmemory.store._ranking.audit import RELAX_COMMIT
from pgmemory.store._ranking.scope import LIVE, READ_LIST, scope_where
from pgmemory.store.columns import MEMORY_COLUMNS, POSITION, SENT_COLUMNS, STAGING_COLUMNS

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
# A scope's filter (pgmemory.store._ranking.scope); the variants are built once per shape.


@builds(fan_out="listing a scope without a user (session, agent or application)")
@lru_cache(maxsize=64)
def list_memories(dimensions: tuple[str, ...], *, newest_first: bool) -> str:
    """Live memories of a scope in time order, paginated by limit/offset."""
    order = "DESC" if newest_first else "ASC"
    return f"""
SELECT {READ_LIST}
FROM pgmemory_memories AS m
WHERE {scope_where(dimensions)}
  AND {LIVE}
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
WHERE {scope_where(dimensions)}
  AND {LIVE}
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
    WHERE {scope_where(dimensions)}
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
        WHERE {scope_where(dimensions)}
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
    WHERE {scope_where(dimensions)}""",
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
    flush, as :func:`~pgmemory.store._ranking.search.search_memories` does (a SELECT without FROM: its WHERE runs once)."""
    # Without the relaxed commit, a VALUES row: Citus routes it to the user's shard as one
    # INSERT (a SELECT without FROM it would insert through the coordinator, by COPY).
    head, tail = ("SELECT", f"\nWHERE {RELAX_COMMIT}") if relax_commit else ("VALUES (", ")")
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
