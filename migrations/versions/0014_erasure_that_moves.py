"""Erasure and retention that work when the tables are distributed by user (Citus), as well.

Run on a Citus cluster, the audit functions of 0006/0009 failed:

* erasure rewrote ``user_id`` of the user's audit rows to the pseudonym, but ``user_id`` is the
  distribution column, which Citus does not let an UPDATE change;
* the guard trigger read a flag the functions set with ``set_config`` on the coordinator, so
  on the worker shards it refused the functions' own deletes (a prune, an erasure);
* an erasure run by the application role deleted the user's data as that role, then changed
  the same shards as the functions' owner in the same transaction, which Citus refuses.

Here, on every server alike:

* ``pgmemory_erase_user_audit`` MOVES each audit row to the pseudonym: a copy under the
  pseudonym (same id, time and values, the personal ones blanked) and the original deleted,
  instead of an UPDATE of its user id;
* the functions set their flag with ``SET LOCAL`` and ``citus.propagate_set_commands =
  'local'`` (a placeholder setting without Citus), so the shards' guards see it; the guard
  honours it only for the tables' owner, whose sanctioned inserts (the moved copies) keep
  their time instead of being stamped with the server's clock;
* ``pgmemory_erase_user(user_id, actor)`` does the whole erasure as the owner: it audits and
  deletes the user's memories, deletes their facts and chat history, then calls
  ``pgmemory_erase_user_audit``. ``MemoryStore.erase_user`` calls it, in one statement.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _v0009() -> ModuleType:
    """Migration 0009, whose functions a downgrade restores."""
    path = Path(__file__).with_name("0009_audit_functions_refuse.py")
    spec = importlib.util.spec_from_file_location("pgmemory_migration_0009", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: 0009, whose refusals the functions here keep and whose functions a downgrade restores.
_0009 = _v0009()

#: 32 random bytes from the server's strong random source (as 0006's).
_RANDOM_SECRET = (
    "decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')"
)

#: Let the audit guards of every shard see a ``SET LOCAL`` of the flag (Citus propagates SET
#: LOCAL to the workers it then writes to; without Citus it is a harmless placeholder).
_PROPAGATE = "SET LOCAL citus.propagate_set_commands = 'local';"

_GUARD = """
CREATE OR REPLACE FUNCTION pgmemory_audit_guard() RETURNS trigger
LANGUAGE plpgsql
SET "TimeZone" TO 'UTC' SET extra_float_digits TO 1 AS $$
DECLARE
    -- Sanctioned: inside pgmemory's audit functions, which run as the tables' owner.
    sanctioned boolean := coalesce(current_setting('pgmemory.audit_change', true), '') = 'sanctioned'
        AND pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID),
                        'USAGE');
BEGIN
    IF TG_OP <> 'INSERT' AND NOT sanctioned THEN
        RAISE EXCEPTION 'pgmemory: % on % refused: audit rows are append-only (erase with '
            'pgmemory_erase_user_audit, prune with pgmemory_prune_audit)', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_LEVEL = 'STATEMENT' OR TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' AND NOT sanctioned THEN
        NEW.at := now();  -- the server's clock, not the writer's say
    END IF;
    NEW.row_sha256 := pgmemory_audit_row_sha256(to_jsonb(NEW));
    RETURN NEW;
END
$$
"""


def _move(table: str, patch: str) -> str:
    """Move the user's rows of an audit table to the pseudonym: insert a copy under it (same
    id and time; ``patch``, a jsonb of the columns to change, applied), then delete the
    originals. A column added later moves along unchanged."""
    return f"""
    INSERT INTO {table} OVERRIDING SYSTEM VALUE
    SELECT moved.*
    FROM {table} AS a,
         LATERAL jsonb_populate_record(NULL::{table}, to_jsonb(a) || {patch}) AS moved
    WHERE a.user_id = p_user_id;"""


#: An actor naming the user (self-service) is pseudonymised in the user's own rows.
_ACTOR = "CASE WHEN a.actor = p_user_id THEN jsonb_build_object('actor', pseudonym) ELSE '{}' END"
_MOVE_MEMORY_AUDIT = _move(
    "pgmemory_memory_audit", f"jsonb_build_object('user_id', pseudonym) || {_ACTOR}"
)
_MOVE_RECALL_AUDIT = _move(
    "pgmemory_recall_audit", "jsonb_build_object('user_id', pseudonym, 'query_text', NULL)"
)
_MOVE_FACT_AUDIT = _move(
    "pgmemory_fact_audit",
    f"jsonb_build_object('user_id', pseudonym, 'old_value', NULL, 'new_value', NULL) || {_ACTOR}",
)

_ERASE_AUDIT = f"""
CREATE OR REPLACE FUNCTION pgmemory_erase_user_audit(p_user_id text, p_actor text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER AS $$
DECLARE
    s bytea;
    pseudonym text;
    n_memory bigint;
    n_recall bigint;
    n_fact bigint;
    summary jsonb;
BEGIN
{_0009._ERASE_CHECKS.strip(chr(10))}
    DELETE FROM pgmemory_user_secrets WHERE user_id = p_user_id RETURNING secret INTO s;
    IF s IS NULL THEN
        s := {_RANDOM_SECRET};
    END IF;
    pseudonym := 'erased:' || encode(sha256(s || convert_to(p_user_id, 'UTF8')), 'hex');
    {_PROPAGATE}
    SET LOCAL pgmemory.audit_change = 'sanctioned';
    {_MOVE_MEMORY_AUDIT}
    GET DIAGNOSTICS n_memory = ROW_COUNT;
    DELETE FROM pgmemory_memory_audit WHERE user_id = p_user_id;
    {_MOVE_RECALL_AUDIT}
    GET DIAGNOSTICS n_recall = ROW_COUNT;
    DELETE FROM pgmemory_recall_audit WHERE user_id = p_user_id;
    {_MOVE_FACT_AUDIT}
    GET DIAGNOSTICS n_fact = ROW_COUNT;
    DELETE FROM pgmemory_fact_audit WHERE user_id = p_user_id;
    SET LOCAL pgmemory.audit_change = '';
    summary := jsonb_build_object(
        'pseudonym', pseudonym,
        'pseudonymised', jsonb_build_object(
            'memory_audit', n_memory, 'recall_audit', n_recall, 'fact_audit', n_fact));
    INSERT INTO pgmemory_fact_audit
        (user_id, application_id, agent_id, session_id, namespace, key, old_value, new_value,
         actor)
    VALUES ('', '', '', '', 'pgmemory:erasure', 'erase_user', NULL, summary, p_actor);
    RETURN summary;
END
$$
"""

_ERASE_USER = f"""
CREATE FUNCTION pgmemory_erase_user(p_user_id text, p_actor text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER AS $$
DECLARE
    s bytea;
    n_memories bigint;
    n_facts bigint;
    n_history bigint;
BEGIN
    SELECT secret INTO s FROM pgmemory_user_secrets WHERE user_id = p_user_id;
    IF s IS NULL THEN
        s := {_RANDOM_SECRET};  -- a user with no audited row: the hashes go with it anyway
    END IF;
    -- Each memory's deletion is audited (its content hash keyed like every other).
    INSERT INTO pgmemory_memory_audit
        (user_id, operation, memory_id, collection, application_id, agent_id, session_id,
         content_sha256, actor)
    SELECT m.user_id, 'delete', m.id, m.collection, m.application_id, m.agent_id,
           m.session_id, encode(sha256(s || decode(m.content_sha256, 'hex')), 'hex'), p_actor
    FROM pgmemory_memories AS m
    WHERE m.user_id = p_user_id;
    DELETE FROM pgmemory_memories WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_memories = ROW_COUNT;
    DELETE FROM pgmemory_facts WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_facts = ROW_COUNT;
    DELETE FROM pgmemory_chat_messages WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_history = ROW_COUNT;
    RETURN pgmemory_erase_user_audit(p_user_id, p_actor) || jsonb_build_object(
        'erased', jsonb_build_object(
            'memories', n_memories, 'facts', n_facts, 'history_messages', n_history));
END
$$
"""

#: 0006's prune with 0009's check, the flag set with SET LOCAL so the shards' guards see it.
_PRUNE = (
    _0009._with_checks(_0009._v0006()._PRUNE, _0009._PRUNE_CHECK)
    .replace(
        "    PERFORM set_config('pgmemory.audit_change', 'sanctioned', true);\n",
        f"    {_PROPAGATE}\n    SET LOCAL pgmemory.audit_change = 'sanctioned';\n",
    )
    .replace(
        "    PERFORM set_config('pgmemory.audit_change', '', true);\n",
        "    SET LOCAL pgmemory.audit_change = '';\n",
    )
)
assert "set_config" not in _PRUNE, "0006's prune no longer sets its flag as expected"

#: The SECURITY DEFINER functions (re)defined here.
_DEFINERS = (
    "pgmemory_erase_user(text, text)",
    "pgmemory_erase_user_audit(text, text)",
    "pgmemory_prune_audit(timestamptz, boolean, boolean, boolean, text)",
)


def _pin_search_path(signatures: Sequence[str]) -> None:
    """Only the schema's own objects, pg_temp last (as 0006 pinned them); CREATE OR REPLACE
    resets a function's settings. The schema name comes from the server, quoted there."""
    for signature in signatures:
        op.execute(
            "DO $$ BEGIN EXECUTE format('ALTER FUNCTION "
            + signature
            + " SET search_path = %I, pg_temp', current_schema()); "
            "END $$"
        )


def upgrade() -> None:
    op.execute(_GUARD)
    op.execute(_ERASE_AUDIT)
    op.execute(_PRUNE)
    op.execute(_ERASE_USER)
    op.execute("REVOKE ALL ON FUNCTION pgmemory_erase_user(text, text) FROM PUBLIC")
    _pin_search_path(_DEFINERS)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS pgmemory_erase_user(text, text)")
    _0009.upgrade()
