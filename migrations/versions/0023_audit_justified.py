"""Audit rows a change must justify: the application role can no longer forge one.

The least-privilege role inserts its own audit rows (every audited statement writes its row in
the same statement), so until now it could also insert a row that no change justified: a
``delete`` record for a memory nobody deleted passed ``pgmemory audit verify``. From here the
guard trigger of each audit table (owner-defined, on every shard under Citus) checks each new
row against the change it records, in the inserting transaction, and refuses it otherwise
(SQLSTATE 42501, ``insufficient_privilege``):

* ``pgmemory_memory_audit``, ``insert``: the memory is there, in the recorded collection and
  scope, written by this transaction (its ``xmin`` is this transaction or one of its
  subtransactions: ``pgmemory_written_here``), and its audit does not already hold it (no
  more inserts than deletions recorded: a memory deleted, then imported again, is inserted
  anew).
* ``pgmemory_memory_audit``, ``delete`` / ``expire``: the memory is gone, and this transaction
  deleted it from the recorded collection and scope. The evidence is a row of
  ``pgmemory_deleted_memories`` that a ``BEFORE DELETE`` trigger on the memories writes as the
  tables' owner (the role has no privilege on that table) with this transaction's id; the
  audit row takes it (``pgmemory_take_deletion``), so one deletion justifies one row. A
  deletion that no audit row took is left there: ``pgmemory audit verify`` reports it.
* ``pgmemory_fact_audit``: the scope's facts row in that namespace was written by this
  transaction and now holds the row's ``new_value`` under its key (none, for a removal). The
  audit functions' own records (user ``''``, namespaces ``pgmemory:erasure`` and
  ``pgmemory:retention``) are written by the functions, as the tables' owner, and only so.
* ``pgmemory_recall_audit``: a recall changes nothing, so its row is the application's own
  statement of what it showed; what the guard can check, it does: every memory id named is
  a memory of the row's user and collection that is there now, or whose deletion since was
  audited (a recall racing a deletion is not refused); the row's scope columns are the
  recalling provider's storage scope, not what the search filtered by. No row can name
  another tenant's memories. (On a Citus shard, where the guard can read only the user's own
  shards, a row of a search without a user is not checked.)

The guard runs on each shard under Citus, where ``TG_TABLE_NAME`` is the shard's name (the
table's, with ``_<shard id>`` after it): the guard tells the tables apart by that prefix.

Rows the audit functions move or prune (``sanctioned``, as the tables' owner) are not checked
again. The erasure function now deletes a user's memories first and audits what it deleted
(the deletion its rows record), and it also deletes the user's deletion evidence.

On a database whose tables Citus already distributes, the new table is distributed here, by
``user_id`` and co-located with the memories, and the trigger is created on every shard.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _migration(filename: str, name: str) -> ModuleType:
    """An earlier migration, whose definitions this one extends or a downgrade restores."""
    path = Path(__file__).with_name(filename)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0014 = _migration("0014_erasure_that_moves.py", "pgmemory_migration_0014")
_0016 = _migration("0016_derivation_queue.py", "pgmemory_migration_0016")

#: The memories deleted by transactions still to be audited: the evidence a delete record
#: needs. Normally empty: the audit row of a deletion takes its row in the same transaction.
_DELETED = """
CREATE TABLE pgmemory_deleted_memories (
    user_id text NOT NULL,
    memory_id uuid NOT NULL,
    collection text NOT NULL,
    application_id text NOT NULL,
    agent_id text NOT NULL,
    session_id text NOT NULL,
    txid bigint NOT NULL DEFAULT (pg_current_xact_id()::text)::bigint,
    at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_pgmemory_deleted_memories PRIMARY KEY (user_id, memory_id)
)
"""

_DISTRIBUTE = _0016._DISTRIBUTE_LIKE_MEMORIES.replace(
    "'pgmemory_jobs'", "'pgmemory_deleted_memories'"
)
assert _DISTRIBUTE != _0016._DISTRIBUTE_LIKE_MEMORIES, "0016's distribution changed shape"

#: Whether a row version's ``xmin`` is this transaction (or one of its subtransactions): a
#: row one can see whose writer is still in progress can only be one's own. ``xmin`` is 32
#: bits; the epoch is the current transaction's, one less or more across a wraparound.
_WRITTEN_HERE = """
CREATE FUNCTION pgmemory_written_here(p_xmin xid) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT pg_xact_status(
        (((c.now >> 32) + CASE WHEN x.low - (c.now & 4294967295) > 2147483648 THEN -1
                               WHEN x.low - (c.now & 4294967295) < -2147483648 THEN 1
                               ELSE 0 END) << 32 | x.low)::text::xid8
    ) = 'in progress'
    FROM (SELECT (pg_current_xact_id()::text)::bigint AS now) AS c,
         (SELECT (p_xmin::text)::bigint AS low) AS x
$$
"""

#: Record a memory's deletion as evidence for its audit row (as the tables' owner).
_NOTE_DELETION = """
CREATE FUNCTION pgmemory_note_deletion() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO pgmemory_deleted_memories
        (user_id, memory_id, collection, application_id, agent_id, session_id)
    VALUES (OLD.user_id, OLD.id, OLD.collection, OLD.application_id, OLD.agent_id,
            OLD.session_id)
    ON CONFLICT (user_id, memory_id) DO UPDATE
    SET collection = EXCLUDED.collection, application_id = EXCLUDED.application_id,
        agent_id = EXCLUDED.agent_id, session_id = EXCLUDED.session_id,
        txid = EXCLUDED.txid, at = EXCLUDED.at;
    RETURN OLD;
END
$$
"""

#: BEFORE, not AFTER: an AFTER trigger of a CTE's DELETE fires at the end of the whole
#: statement, after the audit rows of the same statement were checked.
_DELETION_TRIGGER = (
    "CREATE TRIGGER pgmemory_note_deletion BEFORE DELETE ON pgmemory_memories "
    "FOR EACH ROW EXECUTE FUNCTION pgmemory_note_deletion()"
)

#: Take this transaction's evidence of one deletion (once): whether there was any.
_TAKE_DELETION = """
CREATE FUNCTION pgmemory_take_deletion(
    p_user_id text, p_memory_id uuid, p_collection text, p_application_id text,
    p_agent_id text, p_session_id text) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER AS $$
    WITH taken AS (
        DELETE FROM pgmemory_deleted_memories
        WHERE user_id = p_user_id AND memory_id = p_memory_id
          AND txid = (pg_current_xact_id()::text)::bigint
          AND collection = p_collection AND application_id = p_application_id
          AND agent_id = p_agent_id AND session_id = p_session_id
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM taken)
$$
"""

#: The refusal of a row no change justifies.
_UNJUSTIFIED = """RAISE EXCEPTION 'pgmemory: % row refused: %', TG_TABLE_NAME, {why}
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'audit rows are written by the statements that make the change'"""

#: What the guard checks of a new row, by table (see the module's docstring).
_JUSTIFY = f"""
    IF TG_OP = 'INSERT' AND NOT sanctioned THEN
        IF starts_with(TG_TABLE_NAME, 'pgmemory_memory_audit') THEN
            IF NEW.operation = 'insert' THEN
                IF NOT EXISTS (
                    SELECT 1 FROM pgmemory_memories AS m
                    WHERE m.user_id = NEW.user_id AND m.id = NEW.memory_id
                      AND m.collection = NEW.collection
                      AND m.application_id = NEW.application_id
                      AND m.agent_id = NEW.agent_id AND m.session_id = NEW.session_id
                      AND pgmemory_written_here(m.xmin))
                THEN
                    {_UNJUSTIFIED.format(why="'this transaction wrote no such memory'")};
                END IF;
                IF (SELECT count(*) FILTER (WHERE a.operation = 'insert')
                           > count(*) FILTER (WHERE a.operation <> 'insert')
                    FROM pgmemory_memory_audit AS a
                    WHERE a.user_id = NEW.user_id AND a.memory_id = NEW.memory_id)
                THEN
                    {_UNJUSTIFIED.format(why="'the memory already has its audit'")};
                END IF;
            ELSIF EXISTS (
                    SELECT 1 FROM pgmemory_memories AS m
                    WHERE m.user_id = NEW.user_id AND m.id = NEW.memory_id)
                OR NOT pgmemory_take_deletion(
                    NEW.user_id, NEW.memory_id, NEW.collection, NEW.application_id,
                    NEW.agent_id, NEW.session_id)
            THEN
                {_UNJUSTIFIED.format(why="'this transaction deleted no such memory'")};
            END IF;
        ELSIF starts_with(TG_TABLE_NAME, 'pgmemory_fact_audit') THEN
            -- the audit functions' own records (erasures, prunes), written as the owner
            IF NOT (NEW.user_id = '' AND NEW.namespace IN ('pgmemory:erasure', 'pgmemory:retention')
                    AND pg_has_role(current_user,
                                    (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE'))
               AND NOT EXISTS (
                SELECT 1 FROM pgmemory_facts AS f
                WHERE f.user_id = NEW.user_id AND f.application_id = NEW.application_id
                  AND f.agent_id = NEW.agent_id AND f.session_id = NEW.session_id
                  AND f.namespace = NEW.namespace AND pgmemory_written_here(f.xmin)
                  AND (f.facts -> NEW.key) IS NOT DISTINCT FROM NEW.new_value)
            THEN
                {_UNJUSTIFIED.format(why="'this transaction made no such change of the facts'")};
            END IF;
        ELSIF starts_with(TG_TABLE_NAME, 'pgmemory_recall_audit')
            AND cardinality(NEW.memory_ids) > 0
            AND (NEW.user_id <> '' OR TG_TABLE_NAME = 'pgmemory_recall_audit')
            AND EXISTS (
                SELECT 1 FROM unnest(NEW.memory_ids) AS i
                WHERE NOT EXISTS (
                        SELECT 1 FROM pgmemory_memories AS m
                        WHERE (NEW.user_id = '' OR m.user_id = NEW.user_id)
                          AND m.id = i AND m.collection = NEW.collection)
                  -- a memory deleted since the search showed it: its deletion is audited
                  AND NOT EXISTS (
                        SELECT 1 FROM pgmemory_memory_audit AS a
                        WHERE (NEW.user_id = '' OR a.user_id = NEW.user_id)
                          AND a.memory_id = i AND a.collection = NEW.collection
                          AND a.operation <> 'insert'))
        THEN
            {_UNJUSTIFIED.format(why="'it names memories that are not in its scope'")};
        END IF;
    END IF;
"""

#: The guard's setting of ``at``, after which the new row is checked.
_AT_LINE = "        NEW.at := now();  -- the server's clock, not the writer's say\n    END IF;\n"
_GUARD = _0014._GUARD.replace(_AT_LINE, _AT_LINE + _JUSTIFY)
assert _GUARD != _0014._GUARD, "0014's guard no longer has the expected shape"

#: The erasure's memories: deleted first, then each deletion audited (what the guard checks),
#: the keyed hash in a materialised step of its own (as the store's audited statements take
#: it, for Citus).
_ERASE_MEMORIES_BEFORE = """    INSERT INTO pgmemory_memory_audit
        (user_id, operation, memory_id, collection, application_id, agent_id, session_id,
         content_sha256, actor)
    SELECT m.user_id, 'delete', m.id, m.collection, m.application_id, m.agent_id,
           m.session_id, encode(sha256(s || decode(m.content_sha256, 'hex')), 'hex'), p_actor
    FROM pgmemory_memories AS m
    WHERE m.user_id = p_user_id;
    DELETE FROM pgmemory_memories WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_memories = ROW_COUNT;
"""
_ERASE_MEMORIES = """    WITH gone AS (
        DELETE FROM pgmemory_memories WHERE user_id = p_user_id
        RETURNING user_id, id, collection, application_id, agent_id, session_id,
                  content_sha256
    ),
    keyed AS MATERIALIZED (
        SELECT user_id, id, collection, application_id, agent_id, session_id,
               encode(sha256(s || decode(content_sha256, 'hex')), 'hex') AS keyed_sha256
        FROM gone
    )
    INSERT INTO pgmemory_memory_audit
        (user_id, operation, memory_id, collection, application_id, agent_id, session_id,
         content_sha256, actor)
    SELECT user_id, 'delete', id, collection, application_id, agent_id, session_id,
           keyed_sha256, p_actor
    FROM keyed;
    GET DIAGNOSTICS n_memories = ROW_COUNT;
    DELETE FROM pgmemory_deleted_memories WHERE user_id = p_user_id;
"""
_ERASE_USER = _0016._ERASE_USER.replace(_ERASE_MEMORIES_BEFORE, _ERASE_MEMORIES)
assert _ERASE_USER != _0016._ERASE_USER, "0016's erasure no longer has the expected shape"

#: On Citus, DDL after parallel DDL on a distributed table in the same transaction needs one
#: connection per node; a trigger on a distributed table needs the unsafe-triggers switch (it
#: is then created on every shard). Elsewhere both are unused placeholder settings.
_CITUS_SETTINGS = (
    _0016._SEQUENTIAL,
    "SET LOCAL citus.enable_unsafe_triggers = on",
)


#: The new owner functions: no one but their callers (the guard, the trigger) may run them.
_SIGNATURES = (
    "pgmemory_note_deletion()",
    "pgmemory_take_deletion(text, uuid, text, text, text, text)",
)

#: Grant the guard's check, and reading the evidence (what ``audit verify`` counts), to every
#: role that may call pgmemory_keyed_sha256 (the roles that audit; the owner and PUBLIC aside),
#: as 0022 granted its functions. The guard runs as the
#: role that inserts the row, so that role calls it; it takes only the evidence of its own
#: transaction. The names come from the catalog, quoted there.
_GRANT_TO_CALLERS = """
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN
        SELECT DISTINCT quote_ident(a.rolname)
        FROM pg_proc AS p, aclexplode(p.proacl) AS x
        JOIN pg_roles AS a ON a.oid = x.grantee
        WHERE p.oid = 'pgmemory_keyed_sha256(text, text)'::regprocedure
          AND x.privilege_type = 'EXECUTE' AND x.grantee <> p.proowner
    LOOP
        EXECUTE 'GRANT EXECUTE ON FUNCTION '
             || 'pgmemory_take_deletion(text, uuid, text, text, text, text) TO ' || r;
        EXECUTE 'GRANT SELECT ON pgmemory_deleted_memories TO ' || r;
    END LOOP;
END
$$
"""


def upgrade() -> None:
    """Create the deletion evidence and its trigger, and make the guards check each row."""
    for setting in _CITUS_SETTINGS:
        op.execute(setting)
    op.execute(_DELETED)
    op.execute("REVOKE ALL ON pgmemory_deleted_memories FROM PUBLIC")
    op.execute(_DISTRIBUTE)
    op.execute(_WRITTEN_HERE)
    op.execute(_NOTE_DELETION)
    op.execute(_TAKE_DELETION)
    for signature in _SIGNATURES:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    _0014._pin_search_path(_SIGNATURES)
    op.execute(_GRANT_TO_CALLERS)
    op.execute(_DELETION_TRIGGER)
    op.execute(_GUARD)
    op.execute(_ERASE_USER)
    _0014._pin_search_path(("pgmemory_erase_user(text, text)",))


def downgrade() -> None:
    """The guards trust their writers again; the evidence and its trigger go."""
    for setting in _CITUS_SETTINGS:
        op.execute(setting)
    op.execute(_0016._ERASE_USER)
    _0014._pin_search_path(("pgmemory_erase_user(text, text)",))
    op.execute(_0014._GUARD)
    op.execute("DROP TRIGGER IF EXISTS pgmemory_note_deletion ON pgmemory_memories")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_take_deletion(text, uuid, text, text, text, text)")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_note_deletion()")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_written_here(xid)")
    op.execute("DROP TABLE pgmemory_deleted_memories")
