"""Every SQL statement of the admin plane (operators, the CLI, the audit page), each with a
one-line purpose; the data plane's are in :mod:`pgmemory.store.queries`.

As there, every statement is parameterised, and the only text ever spliced into one is chosen
from the fixed fragments and table names below; nothing a caller passes becomes SQL text.
Each statement that touches per-user tables without naming one user says so, and why, where it
is defined (``fan_out=``, ``constant_user=``: :mod:`pgmemory.store._engine.statement`).
"""

from __future__ import annotations

from functools import lru_cache

from pgmemory.store import queries as q
from pgmemory.store._engine.connector import APP_DATA_TABLES
from pgmemory.store._engine.statement import Statement, builds, register
from pgmemory.store.models import HALVES_MAX_DIMENSIONS
from pgmemory.store.validation import HALVES_INDEX

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


#: Whether any table holds a row of the user (the memories, the audits, history, facts).
USER_KNOWN = Statement(
    "SELECT "
    + "\n    OR ".join(
        f"EXISTS (SELECT 1 FROM {table} WHERE user_id = :user_id)"
        for table in ("pgmemory_memories", *_USER_SOURCES)
    )
)

#: Erased users' pseudonyms (``erased:`` + hex) are audit records, not users: the directory
#: leaves them out (each probe steps over their index entries, so a page behind many erased
#: users' audit rows reads those entries once). ``/user?user=erased:...`` still shows one.
_NOT_PSEUDONYM = "left({column}, 7) <> 'erased:'"


def _skip_scan(name: str, table: str) -> str:
    """A recursive CTE yielding up to :limit distinct user ids of ``table`` after :after, one
    index probe each (a loose index scan), instead of reading every row of the table."""
    keep = _NOT_PSEUDONYM.format(column="t.user_id")
    return f"""{name}(user_id, depth) AS (
    SELECT (SELECT min(t.user_id) FROM {table} AS t WHERE t.user_id > :after AND {keep}), 1
    UNION ALL
    SELECT (SELECT min(t.user_id) FROM {table} AS t WHERE t.user_id > s.user_id AND {keep}),
           s.depth + 1
    FROM {name} AS s WHERE s.user_id IS NOT NULL AND s.depth < :limit
)"""


def _build_user_page() -> str:
    # Memories: per collection, the (collection, user_id, created_at) index is walked instead.
    keep = _NOT_PSEUDONYM.format(column="m.user_id")
    ctes = [
        f"""memory_users(collection, user_id, depth) AS (
    SELECT c.name,
           (SELECT min(m.user_id) FROM pgmemory_memories AS m
            WHERE m.collection = c.name AND m.user_id > :after AND {keep}), 1
    FROM pgmemory_collections AS c
    UNION ALL
    SELECT s.collection,
           (SELECT min(m.user_id) FROM pgmemory_memories AS m
            WHERE m.collection = s.collection AND m.user_id > s.user_id AND {keep}),
           s.depth + 1
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


#: One page of user ids (ascending, after :after; '' = "no user" and erased users' pseudonyms
#: are never listed) found in any table: memories, either audit, chat history or facts. At most
#: :limit index probes per source.
USER_PAGE = Statement(
    _build_user_page(),
    fan_out="the operator's user directory: a page of user ids across all tables",
)


def _build_user_page_distributed() -> str:
    sources = ("pgmemory_memories", *_USER_SOURCES)
    keep = _NOT_PSEUDONYM.format(column="user_id")
    parts = "\n    UNION\n    ".join(
        f"(SELECT DISTINCT user_id FROM {table} WHERE user_id > :after AND {keep} "
        "ORDER BY user_id LIMIT :limit)"
        for table in sources
    )
    return f"""
SELECT user_id FROM (
    {parts}
) AS found
ORDER BY user_id
LIMIT :limit
"""


#: USER_PAGE where the tables are distributed by user (Citus, which runs no recursive CTE
#: across shards): each table's first :limit distinct users after :after, which every shard
#: finds in its own index (the users of different shards are different), merged. It reads
#: the page's users' index entries, not one per user: dearer than the skip scan for users
#: with many rows, and spread over the workers.
USER_PAGE_DISTRIBUTED = Statement(
    _build_user_page_distributed(),
    fan_out="the operator's user directory on Citus: a page of user ids",
)

#: Memories per collection of each user on a page (the ids come from USER_PAGE).
USER_MEMORY_COUNTS = Statement(
    """
SELECT u.user_id, c.name AS collection, s.memories, s.last_at
FROM unnest(CAST(:user_ids AS text[])) AS u(user_id)
CROSS JOIN pgmemory_collections AS c
CROSS JOIN LATERAL (
    -- grouped by the user (one group, or none when the user has no memory there): Citus runs
    -- a lateral aggregate only when it is grouped by the distribution column
    SELECT count(*) AS memories, max(m.created_at) AS last_at FROM pgmemory_memories AS m
    WHERE m.collection = c.name AND m.user_id = u.user_id
    GROUP BY m.user_id
) AS s
ORDER BY u.user_id, c.name
""",
    fan_out="the operator's user directory: counts for one page of users",
)

#: Recalls, chat messages and facts of each user on a page, with the latest time of each (a
#: user with none has no row); each table grouped by user, so Citus runs each on the shards.
USER_ACTIVITY = Statement(
    """
SELECT user_id, sum(recalls) AS recalls, max(last_recall_at) AS last_recall_at,
       max(last_message_at) AS last_message_at, max(last_fact_at) AS last_fact_at
FROM (
    SELECT user_id, count(*) AS recalls, max(at) AS last_recall_at,
           CAST(NULL AS timestamptz) AS last_message_at, CAST(NULL AS timestamptz) AS last_fact_at
    FROM pgmemory_recall_audit WHERE user_id = ANY(CAST(:user_ids AS text[])) GROUP BY user_id
    UNION ALL
    SELECT user_id, 0, NULL, max(created_at), NULL
    FROM pgmemory_chat_messages WHERE user_id = ANY(CAST(:user_ids AS text[])) GROUP BY user_id
    UNION ALL
    SELECT user_id, 0, NULL, NULL, max(updated_at)
    FROM pgmemory_facts WHERE user_id = ANY(CAST(:user_ids AS text[])) GROUP BY user_id
) AS activity
GROUP BY user_id
""",
    fan_out="the operator's user directory: activity for one page of users",
)

#: A user's memory scopes: each collection/application/agent/session with its row count.
USER_MEMORY_SCOPES = Statement("""
SELECT m.collection, m.application_id, m.agent_id, m.session_id, count(*) AS memories,
       min(m.created_at) AS first_at, max(m.created_at) AS last_at
FROM pgmemory_memories AS m
WHERE m.user_id = :user_id
GROUP BY m.collection, m.application_id, m.agent_id, m.session_id
ORDER BY max(m.created_at) DESC
LIMIT :limit
""")

#: A user's chat sessions, most recently active first, with their message counts.
USER_SESSIONS = Statement("""
SELECT h.session_id, count(*) AS messages, min(h.created_at) AS first_at,
       max(h.created_at) AS last_at
FROM pgmemory_chat_messages AS h
WHERE h.user_id = :user_id
GROUP BY h.session_id
ORDER BY max(h.created_at) DESC
LIMIT :limit
""")


def _keyset_pages(head: str, *, alias: str, at: str) -> tuple[Statement, Statement]:
    """A newest-first keyset page's two statements, ordered by ``(alias.at, alias.id)``: the
    rows older than the cursor (``:before_at``, ``:before_id``), newest first; and the page just
    newer than it (``:after_at``, ``:after_id``), oldest first (the caller reverses it). ``head``
    is the ``SELECT ... FROM ... WHERE ...`` they share; each reads ``:limit`` rows
    (:func:`pgmemory.admin.pages.keyset_page` runs them)."""
    key = f"({alias}.{at}, {alias}.id)"
    return (
        Statement(
            f"{head}\n  AND {key} < (:before_at, :before_id)\n"
            f"ORDER BY {alias}.{at} DESC, {alias}.id DESC\nLIMIT :limit\n"
        ),
        Statement(
            f"{head}\n  AND {key} > (:after_at, :after_id)\n"
            f"ORDER BY {alias}.{at} ASC, {alias}.id ASC\nLIMIT :limit\n"
        ),
    )


_BROWSE_MEMORY_COLUMNS = """m.id, m.collection, m.application_id, m.agent_id, m.user_id,
       m.session_id, m.role, m.content, m.author_name, m.message_id, m.source_type, m.source_id,
       m.embedding_model, m.created_at, m.expires_at, m.metadata"""
#: Optional narrowing of a user's memories to one session (NULL = every session).
_SESSION_FILTER = "(CAST(:session_id AS text) IS NULL OR m.session_id = :session_id)"

#: A page of a user's memories in a collection (optionally one session) older than the cursor,
#: newest first, and the page just newer; expired rows not yet reclaimed are included (they are
#: still stored).
USER_MEMORIES_OLDER, USER_MEMORIES_NEWER = _keyset_pages(
    f"""
SELECT {_BROWSE_MEMORY_COLUMNS}
FROM pgmemory_memories AS m
WHERE m.collection = :collection AND m.user_id = :user_id AND {_SESSION_FILTER}""",
    alias="m",
    at="created_at",
)

#: One memory of a user (in any collection).
USER_MEMORY = Statement(f"""
SELECT {_BROWSE_MEMORY_COLUMNS}
FROM pgmemory_memories AS m
WHERE m.user_id = :user_id AND m.id = :memory_id
""")

_RECALL_COLUMNS = """a.id, a.at, a.collection, a.application_id, a.agent_id, a.session_id,
       a.provider, a.mode, a.requesting_session_id, a.query_sha256, a.query_text,
       cardinality(a.memory_ids) AS returned"""

#: A page of a user's recalls older than the cursor, newest first, and the page just newer.
USER_RECALLS_OLDER, USER_RECALLS_NEWER = _keyset_pages(
    f"""
SELECT {_RECALL_COLUMNS}
FROM pgmemory_recall_audit AS a
WHERE a.user_id = :user_id""",
    alias="a",
    at="at",
)

#: One recall of a user.
USER_RECALL = Statement(f"""
SELECT {_RECALL_COLUMNS}
FROM pgmemory_recall_audit AS a
WHERE a.user_id = :user_id AND a.id = :recall_id
""")

#: What the given recalls of a user returned, in rank order (the first :per_recall of each),
#: with each one's reason and signals (NULL in rows older than migration 0010), joined to the
#: memories (NULL columns: deleted since) and to the latest deletion or expiry
#: audited for each memory. Each memory is one primary-key probe (a LATERAL subquery with
#: OFFSET 0): as a join, a generic plan (estimating a user's rows from the table's average)
#: read every row of the user and matched them against each recalled id (a busy user's page
#: of 20 recalls: 0.4 ms with the values known, 18.9 ms on that plan).
RECALLED_MEMORIES = Statement("""
SELECT a.id AS recall_id, r.rank, r.memory_id, r.score, r.reason, r.signals, m.collection,
       m.role, m.content, m.session_id, m.created_at, m.expires_at, d.at AS deleted_at,
       d.operation AS deleted_by
FROM pgmemory_recall_audit AS a
CROSS JOIN LATERAL unnest(
    a.memory_ids, a.scores, a.reasons,
    ARRAY(SELECT x.value FROM jsonb_array_elements(COALESCE(a.signals, '[]')) WITH ORDINALITY
          AS x(value, i) ORDER BY x.i)
) WITH ORDINALITY AS r(memory_id, score, reason, signals, rank)
LEFT JOIN LATERAL (
    SELECT m.id, m.collection, m.role, m.content, m.session_id, m.created_at, m.expires_at
    FROM pgmemory_memories AS m
    WHERE m.user_id = :user_id AND m.id = r.memory_id
    OFFSET 0
) AS m ON true
LEFT JOIN LATERAL (
    SELECT x.at, x.operation FROM pgmemory_memory_audit AS x
    WHERE x.user_id = :user_id AND x.memory_id = r.memory_id
      AND x.operation IN ('delete', 'expire')
    ORDER BY x.at DESC, x.id DESC
    LIMIT 1
) AS d ON m.id IS NULL
WHERE a.user_id = :user_id AND a.id = ANY(CAST(:recall_ids AS bigint[])) AND r.rank <= :per_recall
ORDER BY a.id, r.rank
""")

#: The latest recalls of a user that returned a given memory (newest first).
RECALLS_OF_MEMORY = Statement(f"""
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
""")

_MEMORY_AUDIT_COLUMNS = """x.id, x.at, x.txid, x.operation, x.memory_id, x.collection,
       x.application_id, x.agent_id, x.session_id, x.content_sha256, x.actor"""

#: A page of a user's memory write/delete audit older than the cursor, newest first, and the
#: page just newer.
USER_MEMORY_AUDIT_OLDER, USER_MEMORY_AUDIT_NEWER = _keyset_pages(
    f"""
SELECT {_MEMORY_AUDIT_COLUMNS}
FROM pgmemory_memory_audit AS x
WHERE x.user_id = :user_id""",
    alias="x",
    at="at",
)

#: The audit trail of one memory of a user, oldest first.
MEMORY_AUDIT_TRAIL = Statement(f"""
SELECT {_MEMORY_AUDIT_COLUMNS}
FROM pgmemory_memory_audit AS x
WHERE x.user_id = :user_id AND x.memory_id = :memory_id
ORDER BY x.at, x.id
LIMIT :limit
""")

#: A user's current facts, one row per scope and namespace.
USER_FACTS = Statement("""
SELECT f.application_id, f.agent_id, f.session_id, f.namespace, f.facts, f.updated_at
FROM pgmemory_facts AS f
WHERE f.user_id = :user_id
ORDER BY f.namespace, f.application_id, f.agent_id, f.session_id
LIMIT :limit
""")

_FACT_AUDIT_COLUMNS = """x.id, x.at, x.application_id, x.agent_id, x.session_id, x.namespace,
       x.key, x.old_value, x.new_value, x.actor"""

#: A page of a user's fact changes older than the cursor, newest first, and the page just newer.
USER_FACT_AUDIT_OLDER, USER_FACT_AUDIT_NEWER = _keyset_pages(
    f"""
SELECT {_FACT_AUDIT_COLUMNS}
FROM pgmemory_fact_audit AS x
WHERE x.user_id = :user_id""",
    alias="x",
    at="at",
)

#: The page of a session's history just before :before_seq, newest first (the caller reverses).
READ_HISTORY_BEFORE = Statement("""
SELECT seq, message, created_at FROM pgmemory_chat_messages
WHERE user_id = :user_id AND session_id = :session_id AND seq < :before_seq
ORDER BY seq DESC
LIMIT :limit
""")

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
PRUNE_AUDIT = Statement(
    """
SELECT pgmemory_prune_audit(:cutoff, :recall_audit, :memory_audit, :fact_audit, :actor)
""",
    fan_out="audit retention (pgmemory_prune_audit): rows older than a cutoff, of every user",
)

#: The latest prune records, newest first.
LIST_PRUNES = Statement(
    """
SELECT x.id, x.at, x.new_value AS summary, x.actor
FROM pgmemory_fact_audit AS x
WHERE x.user_id = '' AND x.application_id = '' AND x.agent_id = '' AND x.session_id = ''
  AND x.namespace = :retention_namespace
ORDER BY x.at DESC, x.id DESC
LIMIT :limit
""",
    constant_user="the records of audit prunes, kept under user '' (one shard)",
)


# --- audit integrity (pgmemory audit verify) and the application role (pgmemory db roles) --
# Migration 0006 guards the audit tables with a trigger and two SECURITY DEFINER functions;
# these statements read that guard back. Table names come from AUDIT_TABLES only.

#: The audit tables the guard protects.
AUDIT_TABLES = ("pgmemory_memory_audit", "pgmemory_recall_audit", "pgmemory_fact_audit")
#: The table of per-user secrets keying audit hashes (no role but its owner may touch it).
SECRETS_TABLE = "pgmemory_user_secrets"
#: The functions the guard consists of; the first four run as their owner.
DEFINER_FUNCTIONS = (
    "pgmemory_keyed_sha256",
    "pgmemory_erase_user",
    "pgmemory_erase_user_audit",
    "pgmemory_prune_audit",
    "pgmemory_note_deletion",
    "pgmemory_take_deletion",
)
GUARD_FUNCTION = "pgmemory_audit_guard"
#: The guard's triggers on each audit table.
GUARD_TRIGGERS = ("pgmemory_audit_guard", "pgmemory_audit_no_truncate")

#: Row hashes are computed in UTC with shortest-exact floats (the guard function's settings).
HASH_TIME_ZONE = Statement("SET LOCAL \"TimeZone\" = 'UTC'")
HASH_FLOAT_DIGITS = Statement("SET LOCAL extra_float_digits = 1")

#: The non-internal triggers of the given tables: table, name, state ('D': disabled), function,
#: and type bits (row, before, insert, delete, update, truncate).
AUDIT_TRIGGERS = Statement("""
SELECT c.relname AS table_name, t.tgname AS trigger_name, t.tgenabled AS enabled,
       p.proname AS function_name, t.tgtype AS type_bits
FROM pg_trigger AS t
JOIN pg_class AS c ON c.oid = t.tgrelid
JOIN pg_proc AS p ON p.oid = t.tgfoid
WHERE c.oid = ANY(CAST(:tables AS regclass[])) AND NOT t.tgisinternal
""")

#: The guard's functions in the current schema: owner, SECURITY DEFINER, settings, whether
#: PUBLIC may execute them.
AUDIT_FUNCTIONS = Statement("""
SELECT p.proname AS name, pg_get_userbyid(p.proowner) AS owner, p.prosecdef AS definer,
       COALESCE(p.proconfig, '{}') AS config,
       EXISTS (SELECT 1 FROM aclexplode(COALESCE(p.proacl, acldefault('f', p.proowner))) AS a
               WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS public_execute
FROM pg_proc AS p
WHERE p.proname = ANY(CAST(:names AS text[])) AND p.pronamespace = CAST(current_schema() AS regnamespace)
""")

#: Owners of the given tables, and every privilege held on them by another role that would
#: let it change audit rows (UPDATE, DELETE, TRUNCATE, TRIGGER), or touch the secrets at all.
AUDIT_GRANTS = Statement("""
SELECT c.relname AS table_name, pg_get_userbyid(c.relowner) AS owner,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END AS grantee,
       a.privilege_type
FROM pg_class AS c
CROSS JOIN LATERAL aclexplode(COALESCE(c.relacl, acldefault('r', c.relowner))) AS a
WHERE c.oid = ANY(CAST(:tables AS regclass[]))
  AND a.grantee <> c.relowner
  AND (c.relname = :secrets OR a.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER'))
""")

#: The owners of the given tables.
TABLE_OWNERS = Statement("""
SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class AS c
WHERE c.oid = ANY(CAST(:tables AS regclass[]))
""")

#: Roles that may act as the given role (its members, directly or not) and are not superusers.
ROLE_MEMBERS = Statement("""
WITH RECURSIVE members AS (
    SELECT m.member FROM pg_auth_members AS m WHERE m.roleid = CAST(:role AS regrole)
    UNION
    SELECT m.member FROM pg_auth_members AS m JOIN members AS x ON m.roleid = x.member
)
SELECT r.rolname FROM members AS x JOIN pg_roles AS r ON r.oid = x.member ORDER BY r.rolname
""")

#: The superusers (they bypass every privilege and may disable triggers).
SUPERUSERS = Statement("SELECT rolname FROM pg_roles WHERE rolsuper ORDER BY rolname")


@builds(fan_out="pgmemory audit verify rechecks every row hash of an audit table")
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


@builds(fan_out="pgmemory audit verify's rolled-back UPDATE of an audit table's newest row")
@lru_cache(maxsize=8)
def audit_guard_probe(table: str) -> str:
    """A no-op UPDATE of the newest row of an audit table (run in a savepoint that is rolled
    back): the guard must refuse it."""
    if table not in AUDIT_TABLES:
        raise ValueError(f"not an audit table: {table!r}")
    return f"""
UPDATE {table} SET user_id = user_id WHERE id = (SELECT max(id) FROM {table}) RETURNING id
"""


#: Pseudonyms in the audits with no erasure record (rows pseudonymised outside erasure), in two
#: materialised steps (Citus plans each on its own; a UNION correlated with a subquery it cannot
#: push down).
#: Memories deleted with no audit row (migration 0023: a deletion's evidence, left because no
#: audit row took it in the deleting transaction), and the oldest of them.
UNAUDITED_DELETIONS = Statement(
    """
SELECT count(*) AS deletions, min(at) AS oldest FROM pgmemory_deleted_memories
""",
    fan_out="pgmemory audit verify: deletions no audit row took, all users",
)

UNRECORDED_PSEUDONYMS = Statement(
    """
WITH pseudonyms AS MATERIALIZED (
    SELECT user_id FROM pgmemory_memory_audit WHERE left(user_id, 7) = 'erased:'
    UNION
    SELECT user_id FROM pgmemory_recall_audit WHERE left(user_id, 7) = 'erased:'
    UNION
    SELECT user_id FROM pgmemory_fact_audit WHERE left(user_id, 7) = 'erased:'
),
recorded AS MATERIALIZED (
    SELECT r.new_value ->> 'pseudonym' AS pseudonym FROM pgmemory_fact_audit AS r
    WHERE r.user_id = '' AND r.application_id = '' AND r.agent_id = '' AND r.session_id = ''
      AND r.namespace = :erasure_namespace
)
SELECT count(*) FROM pseudonyms AS u
WHERE NOT EXISTS (SELECT 1 FROM recorded AS r WHERE r.pseudonym = u.user_id)
""",
    fan_out="pgmemory audit verify: erased users' pseudonyms across all audits",
)

#: What only a misuse of the audit functions leaves (migration 0009 refuses each now): the
#: audit's own records (erasures, prunes) moved off the records user '' or blanked, a prune
#: whose cutoff was later than the prune itself, and live memories whose insert row carries a
#: pseudonym (their user was "erased" while their data stayed).
AUDIT_MISUSE = Statement(
    """
WITH erased_inserts AS MATERIALIZED (
    -- the pseudonymised insert rows, gathered first: on Citus they live on other shards than
    -- the memories they name, which a join could not reach without repartitioning
    SELECT a.memory_id FROM pgmemory_memory_audit AS a
    WHERE a.operation = 'insert' AND left(a.user_id, 7) = 'erased:'
)
SELECT
  (SELECT count(*) FROM pgmemory_fact_audit AS r
   WHERE r.namespace IN (:erasure_namespace, :retention_namespace)
     AND (r.user_id <> '' OR r.new_value IS NULL)) AS moved_records,
  (SELECT count(*) FROM pgmemory_fact_audit AS r
   WHERE r.user_id = '' AND r.namespace = :retention_namespace
     AND CAST(r.new_value ->> 'cutoff' AS timestamptz) > r.at) AS future_prunes,
  (SELECT count(*) FROM pgmemory_memories AS m
   WHERE m.id IN (SELECT memory_id FROM erased_inserts)
     AND left(m.user_id, 7) <> 'erased:') AS live_but_erased
""",
    fan_out="pgmemory audit verify: misplaced records and erased live users, all users",
)

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
ROLE_ATTRIBUTES = Statement("""
SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls OR rolreplication AS powerful
FROM pg_roles WHERE rolname = :name
""")

#: The database and schema the store works in, and whether PUBLIC may create objects there.
ROLE_CONTEXT = Statement("""
SELECT current_database() AS database, current_schema() AS schema,
       EXISTS (SELECT 1 FROM pg_namespace AS n
               CROSS JOIN LATERAL aclexplode(COALESCE(n.nspacl, acldefault('n', n.nspowner))) AS a
               WHERE n.nspname = current_schema() AND a.grantee = 0
                 AND a.privilege_type = 'CREATE') AS public_create
""")

#: Create the application role: it may log in and nothing else beyond its grants.
CREATE_APP_ROLE = Statement(
    "CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
    "PASSWORD '{verifier}'"
)
#: Reset an existing application role to the same attributes and a new password.
ALTER_APP_ROLE = Statement(
    "ALTER ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
    "PASSWORD '{verifier}'"
)

_DATA_TABLES = ", ".join(APP_DATA_TABLES)
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
    "GRANT SELECT ON pgmemory_deleted_memories TO {role}",
    "GRANT EXECUTE ON FUNCTION pgmemory_keyed_sha256(text, text), "
    "pgmemory_erase_user(text, text), pgmemory_erase_user_audit(text, text), "
    "pgmemory_prune_audit(timestamptz, boolean, boolean, boolean, text), "
    "pgmemory_erasure_stamp(text), pgmemory_erasure_guard(text, text), "
    "pgmemory_history_tail(text, text), "
    "pgmemory_take_deletion(text, uuid, text, text, text, text) TO {role}",
)

#: The identity sequences of the audit tables (their ``id`` columns), as quoted names.
IDENTITY_SEQUENCES = Statement("""
SELECT pg_get_serial_sequence(t, 'id') FROM unnest(CAST(:tables AS text[])) AS t
WHERE pg_get_serial_sequence(t, 'id') IS NOT NULL ORDER BY t
""")

#: Let the role draw audit row ids (one server needs it not; Citus draws an identity column's
#: value on the coordinator with nextval, which needs USAGE). ``{sequences}`` are the catalog's
#: own quoted names (IDENTITY_SEQUENCES), never input.
APP_ROLE_SEQUENCE_GRANT = Statement("GRANT USAGE ON SEQUENCE {sequences} TO {role}")


# --- half vectors, opt-in (see pgmemory.admin.half_vectors) -----------------------------------

#: Each memory's unit vector in half precision, a stored generated column (NULL above
#: HALVES_MAX_DIMENSIONS, whose halves a B-tree entry could not hold): the two-phase path's
#: ``halves`` pass. Rewrites the table.
ADD_HALF_VECTORS_COLUMN = Statement(
    f"""
ALTER TABLE pgmemory_memories ADD COLUMN embedding_half halfvec
    GENERATED ALWAYS AS (CASE WHEN vector_dims(embedding) <= {HALVES_MAX_DIMENSIONS}
        THEN CAST(l2_normalize(embedding) AS halfvec) END) STORED
""",
    fan_out="DDL: pgmemory db half-vectors adds the column on every shard",
)
#: ... and the index that pass reads index-only (rows without halves left out).
ADD_HALF_VECTORS_INDEX = Statement(
    f"""
CREATE INDEX {HALVES_INDEX.name} ON pgmemory_memories (collection, user_id)
    INCLUDE (id, expires_at, embedding_half) WHERE embedding_half IS NOT NULL
""",
    fan_out="DDL: pgmemory db half-vectors builds the index on every shard",
)
#: Whether pgvector computes what the half vectors need (``l2_normalize``: pgvector >= 0.7).
HAS_L2_NORMALIZE = Statement("SELECT to_regprocedure('l2_normalize(vector)') IS NOT NULL")


# --- hash partitioning of the memories table by user (see pgmemory.admin.partitioning) -------

#: Whether the memories table holds any row at all (partitioning is refused then).
MEMORIES_ANY_ROW = Statement(
    "SELECT EXISTS (SELECT 1 FROM pgmemory_memories)",
    fan_out="pgmemory db partition: refused unless the table is empty (any user)",
)

#: The partition count for PARTITION_MEMORIES, transaction-local (DDL takes no parameters).
SET_PARTITION_COUNT = Statement(
    "SELECT set_config('pgmemory.partitions', CAST(:partitions AS text), true)"
)

#: Turn the EMPTY memories table into one hash-partitioned by user_id into
#: current_setting('pgmemory.partitions') partitions, keeping every column, default, check,
#: generated column (the vector's code), storage setting, key, foreign key, index (by name) and
#: trigger (migration 0023's deletion evidence). Run after SET_PARTITION_COUNT, in
#: one transaction; no '%' and no bind marker in it, so it runs as written.
PARTITION_MEMORIES = Statement(
    """
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
    triggers text[] := ARRAY(
        SELECT pg_get_triggerdef(oid) FROM pg_trigger
        WHERE tgrelid = 'pgmemory_memories'::regclass AND NOT tgisinternal ORDER BY tgname);
    statement text;
BEGIN
    ALTER TABLE pgmemory_memories RENAME TO pgmemory_memories_plain;
    CREATE TABLE pgmemory_memories (LIKE pgmemory_memories_plain
        INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING STORAGE
        INCLUDING COMMENTS)
        PARTITION BY HASH (user_id);
    DROP TABLE pgmemory_memories_plain;
    FOR i IN 0 .. partitions - 1 LOOP
        EXECUTE 'CREATE TABLE ' || quote_ident('pgmemory_memories_p' || i)
             || ' PARTITION OF pgmemory_memories FOR VALUES WITH (MODULUS ' || partitions
             || ', REMAINDER ' || i || ')';
    END LOOP;
    FOREACH statement IN ARRAY keys LOOP EXECUTE statement; END LOOP;
    FOREACH statement IN ARRAY indexes LOOP EXECUTE statement; END LOOP;
    FOREACH statement IN ARRAY triggers LOOP EXECUTE statement; END LOOP;
END $$
""",
    fan_out="DDL: pgmemory db partition rebuilds the whole (empty) table",
)

#: How many partitions the memories table has (0: not partitioned).
MEMORIES_PARTITIONS = Statement(
    """
SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass('pgmemory_memories')
""",
    fan_out="pgmemory db partition: the catalog's count of partitions, no rows",
)


# --- re-embedding a collection (see pgmemory.admin.reembedding) ---------------------------

#: A collection's model and size, and those of the re-embedding being staged (if any).
REEMBED_STATE = Statement("""
SELECT dimensions, embedding_model, next_embedding_model, next_dimensions
FROM pgmemory_collections WHERE name = :collection
""")

#: Name the model being staged (a rerun for the same one resumes; another one is refused).
REEMBED_BEGIN = Statement("""
UPDATE pgmemory_collections
SET next_embedding_model = :model, next_dimensions = :dimensions
WHERE name = :collection
  AND (next_embedding_model IS NULL
       OR (next_embedding_model = :model AND next_dimensions = :dimensions))
RETURNING name
""")

#: No model is being staged any more (``--restart``, before naming the new one).
REEMBED_FORGET = Statement("""
UPDATE pgmemory_collections SET next_embedding_model = NULL, next_dimensions = NULL
WHERE name = :collection
""")

#: Forget the vectors staged for another model (``--restart``).
REEMBED_CLEAR = Statement(
    """
UPDATE pgmemory_memories SET embedding_next = NULL
WHERE collection = :collection AND embedding_next IS NOT NULL
""",
    fan_out="pgmemory db reembed --restart: a collection's staged vectors, every user",
)

#: How many memories of the collection there are, and how many still need the new vector.
REEMBED_COUNTS = Statement(
    """
SELECT count(*) AS total,
       count(*) FILTER (WHERE embedding_model <> :model AND embedding_next IS NULL) AS todo
FROM pgmemory_memories WHERE collection = :collection
""",
    fan_out="pgmemory db reembed: progress over a whole collection, every user",
)

#: The next memories without the new model's vector, in primary-key order after a keyset.
REEMBED_TODO = Statement(
    """
SELECT id, user_id, content FROM pgmemory_memories
WHERE collection = :collection AND embedding_model <> :model AND embedding_next IS NULL
  AND (id, user_id) > (CAST(:after_id AS uuid), CAST(:after_user AS text))
ORDER BY id, user_id
LIMIT :batch
""",
    fan_out="pgmemory db reembed: the next batch of a whole collection, in key order",
)

#: Stage one user's new vectors beside the ones searches use.
REEMBED_STAGE = Statement("""
UPDATE pgmemory_memories AS m SET embedding_next = v.embedding
FROM unnest(CAST(:ids AS uuid[]), CAST(:embeddings AS vector[])) AS v(id, embedding)
WHERE m.user_id = :user_id AND m.collection = :collection AND m.id = v.id
""")

#: Hold the collection's catalogue row: new memories of the collection (whose foreign key
#: reads it) wait until the switch commits.
REEMBED_LOCK = Statement(
    "SELECT name FROM pgmemory_collections WHERE name = :collection FOR UPDATE"
)

#: The switch: every staged vector replaces the one searches used.
REEMBED_SWAP = Statement(
    """
UPDATE pgmemory_memories
SET embedding = embedding_next, embedding_model = :model, embedding_next = NULL
WHERE collection = :collection AND embedding_next IS NOT NULL
""",
    fan_out="pgmemory db reembed: the switch of a whole collection, every user",
)

#: The switch of the catalogue entry to the staged model.
REEMBED_SWITCH = Statement("""
UPDATE pgmemory_collections
SET embedding_model = next_embedding_model, dimensions = next_dimensions,
    next_embedding_model = NULL, next_dimensions = NULL
WHERE name = :collection AND next_embedding_model = :model
""")


# --- distribution over Citus (see pgmemory.admin.distribution) ----------------------------------

#: The database connected to (for messages).
CURRENT_DATABASE = Statement("SELECT current_database()")

#: Whether the citus extension is installed (q.CITUS_INSTALLED), as a row (``installed``), for
#: the read helpers.
CITUS_INSTALLED_AS_ROW = Statement(f"{q.CITUS_INSTALLED} AS installed")

#: How Citus manages a table already ('distributed', 'reference'; NULL: not at all).
CITUS_TABLE_TYPE = Statement("""
SELECT citus_table_type FROM citus_tables WHERE table_name = CAST(:table AS regclass)
""")

#: Make a table a reference table (copied to every node).
CITUS_REFERENCE_TABLE = Statement("SELECT create_reference_table(CAST(:table AS regclass))")

#: Distribute a table by a column, co-located with another table ('default': Citus's choice).
CITUS_DISTRIBUTE_TABLE = Statement("""
SELECT create_distributed_table(CAST(:table AS regclass), :column, colocate_with => :colocate_with)
""")

#: Drop the rows a table held before it was distributed: Citus copies them to the shards and
#: keeps the originals on the coordinator's disk (unseen by queries, untouched by erasure).
CITUS_DROP_LOCAL_ROWS = Statement(
    "SELECT truncate_local_data_after_distributing_table(CAST(:table AS regclass))"
)

#: The audit guard lets the owner's sanctioned change through (migration 0014): here the
#: truncation of the audit tables' former local rows, which their shards now hold.
SANCTION_AUDIT_CHANGE = Statement("SET LOCAL pgmemory.audit_change = 'sanctioned'")

#: Settings of the one transaction :func:`~pgmemory.admin.distribution.distribute` runs in (``SET LOCAL``: they end with it).
DISTRIBUTE_SETTINGS = (
    # The audit tables' guard triggers (migration 0006): Citus refuses to distribute a table
    # with triggers unless this is on; with it, each trigger is created on every shard too.
    "SET LOCAL citus.enable_unsafe_triggers = on",
    # Tables with a foreign key to a reference table made in the same transaction must be
    # distributed over one connection per node.
    q.SEQUENTIAL_SHARD_WRITES,
)

#: How Citus manages each of some tables now: ``{table: (type, distribution column)}``.
#: Which of these tables exist (in the search path), in the order given.
EXISTING_TABLES = Statement("""
SELECT t FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS u(t, n)
WHERE to_regclass(t) IS NOT NULL ORDER BY n
""")

CITUS_TABLES = Statement("""
SELECT CAST(table_name AS text), CAST(citus_table_type AS text), distribution_column
FROM citus_tables WHERE CAST(table_name AS text) = ANY(:tables)
""")


# --- access tokens (pgmemory token, the audit page) ----------------------------------------
# Tokens are looked up by their sha256 only; a token is valid while it is neither revoked nor
# expired, by the server's clock. Not a per-user table: nothing here names a user.

#: What a token's record shows (never its hash): the columns of TokenInfo.
_TOKEN_INFO = "id, name, purpose, created_at, expires_at, revoked_at"

#: Issue a token: revoke an expired one of the same name first (so the name is free again),
#: then insert the new token's hash; a live token of that name makes the insert fail.
ISSUE_TOKEN = Statement(f"""
WITH expired AS (
    UPDATE pgmemory_access_tokens SET revoked_at = now()
    WHERE name = :name AND revoked_at IS NULL AND expires_at <= now()
    RETURNING id
)
INSERT INTO pgmemory_access_tokens (name, purpose, token_sha256, expires_at)
-- Read from ``expired``, so that its UPDATE runs before this row is inserted.
SELECT :name, :purpose, :token_sha256, now() + CAST(:lifetime AS interval)
FROM (SELECT count(*) FROM expired) AS freed
RETURNING {_TOKEN_INFO}
""")

#: The live token with this hash and purpose, if any.
VALID_TOKEN = Statement(f"""
SELECT {_TOKEN_INFO}
FROM pgmemory_access_tokens
WHERE token_sha256 = :token_sha256 AND purpose = :purpose
  AND revoked_at IS NULL AND expires_at > now()
""")

#: Whether the token with this id is still live (a signed-in page re-checks it per request).
TOKEN_STILL_VALID = Statement("""
SELECT EXISTS (
    SELECT 1 FROM pgmemory_access_tokens
    WHERE id = :id AND purpose = :purpose AND revoked_at IS NULL AND expires_at > now()
)
""")

#: Every token, newest first: names, purposes and dates, never a hash.
LIST_TOKENS = Statement(f"""
SELECT {_TOKEN_INFO}
FROM pgmemory_access_tokens
WHERE :include_inactive OR (revoked_at IS NULL AND expires_at > now())
ORDER BY created_at DESC, id DESC
LIMIT :limit
""")

#: Revoke the live token of this name (or of this id); returns what was revoked.
REVOKE_TOKEN = Statement(f"""
UPDATE pgmemory_access_tokens SET revoked_at = now()
WHERE revoked_at IS NULL AND (name = :name OR id = :id)
RETURNING {_TOKEN_INFO}
""")

register(__name__, globals())
