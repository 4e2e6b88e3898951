"""Erasure that erases, and audits that only pgmemory's own functions may change.

* ``pgmemory_user_secrets``: one random 32-byte secret per user, created on the user's first
  audited write or recall. Audit rows keep content and query hashes keyed with it
  (``sha256(secret || sha256(text))``, by :func:`pgmemory_keyed_sha256`), never the plain
  sha256, so a guessed text cannot be confirmed once the secret is gone. Existing audit hashes
  are re-keyed here.
* ``pgmemory_erase_user_audit(user_id, actor)``: pseudonymises a user's audit rows
  (``'erased:' || sha256(secret || user_id)``), blanks the personal values they kept, deletes
  the secret and records what it did, all in the caller's transaction.
* ``pgmemory_prune_audit(cutoff, ...)``: the retention sweep, recording itself.
* A guard trigger on the three audit tables: INSERT computes ``row_sha256`` (a hash of the
  whole row, checked by ``pgmemory audit verify``); UPDATE, DELETE and TRUNCATE are refused
  unless they come from the two functions above. The two functions run as their owner
  (SECURITY DEFINER), so an application role needs INSERT and SELECT on the audits only.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AUDIT_TABLES = ("pgmemory_memory_audit", "pgmemory_recall_audit", "pgmemory_fact_audit")

#: 32 random bytes from the server's strong random source (two v4 UUIDs: 244 random bits).
_RANDOM_SECRET = (
    "decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex')"
)

_KEYED_SHA256 = f"""
CREATE FUNCTION pgmemory_keyed_sha256(p_user_id text, p_sha256 text) RETURNS text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER AS $$
DECLARE
    s bytea;
BEGIN
    SELECT secret INTO s FROM pgmemory_user_secrets WHERE user_id = p_user_id;
    IF s IS NULL THEN
        INSERT INTO pgmemory_user_secrets (user_id, secret)
        VALUES (p_user_id, {_RANDOM_SECRET})
        ON CONFLICT (user_id) DO NOTHING;
        SELECT secret INTO s FROM pgmemory_user_secrets WHERE user_id = p_user_id;
        IF s IS NULL THEN
            RAISE EXCEPTION 'pgmemory: a concurrent transaction created this user''s audit key; retry'
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;
    RETURN encode(sha256(s || decode(p_sha256, 'hex')), 'hex');
END
$$
"""

_ROW_SHA256 = """
CREATE FUNCTION pgmemory_audit_row_sha256(r jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to((r - 'row_sha256')::text, 'UTF8')), 'hex')
$$
"""

_GUARD = """
CREATE FUNCTION pgmemory_audit_guard() RETURNS trigger
LANGUAGE plpgsql
SET "TimeZone" TO 'UTC' SET extra_float_digits TO 1 AS $$
BEGIN
    IF TG_OP <> 'INSERT'
       AND current_setting('pgmemory.audit_change', true) IS DISTINCT FROM 'sanctioned' THEN
        RAISE EXCEPTION 'pgmemory: % on % refused: audit rows are append-only (erase with '
            'pgmemory_erase_user_audit, prune with pgmemory_prune_audit)', TG_OP, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_LEVEL = 'STATEMENT' OR TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW.row_sha256 := pgmemory_audit_row_sha256(to_jsonb(NEW));
    RETURN NEW;
END
$$
"""

_ERASE = f"""
CREATE FUNCTION pgmemory_erase_user_audit(p_user_id text, p_actor text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER AS $$
DECLARE
    s bytea;
    pseudonym text;
    n_memory bigint;
    n_recall bigint;
    n_fact bigint;
    summary jsonb;
BEGIN
    DELETE FROM pgmemory_user_secrets WHERE user_id = p_user_id RETURNING secret INTO s;
    IF s IS NULL THEN
        s := {_RANDOM_SECRET};
    END IF;
    pseudonym := 'erased:' || encode(sha256(s || convert_to(p_user_id, 'UTF8')), 'hex');
    PERFORM set_config('pgmemory.audit_change', 'sanctioned', true);
    -- An actor naming the user (self-service) is pseudonymised in the user's own rows.
    UPDATE pgmemory_memory_audit
    SET user_id = pseudonym, actor = CASE WHEN actor = p_user_id THEN pseudonym ELSE actor END
    WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_memory = ROW_COUNT;
    UPDATE pgmemory_recall_audit SET user_id = pseudonym, query_text = NULL
    WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_recall = ROW_COUNT;
    UPDATE pgmemory_fact_audit
    SET user_id = pseudonym, old_value = NULL, new_value = NULL,
        actor = CASE WHEN actor = p_user_id THEN pseudonym ELSE actor END
    WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_fact = ROW_COUNT;
    PERFORM set_config('pgmemory.audit_change', '', true);
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

_PRUNE = """
CREATE FUNCTION pgmemory_prune_audit(
    p_cutoff timestamptz, p_recall boolean, p_memory boolean, p_fact boolean, p_actor text
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET "TimeZone" TO 'UTC' AS $$
DECLARE
    n_recall bigint := 0;
    n_memory bigint := 0;
    n_fact bigint := 0;
    summary jsonb;
BEGIN
    PERFORM set_config('pgmemory.audit_change', 'sanctioned', true);
    IF p_recall THEN
        DELETE FROM pgmemory_recall_audit WHERE at < p_cutoff;
        GET DIAGNOSTICS n_recall = ROW_COUNT;
    END IF;
    IF p_memory THEN
        DELETE FROM pgmemory_memory_audit WHERE at < p_cutoff;
        GET DIAGNOSTICS n_memory = ROW_COUNT;
    END IF;
    IF p_fact THEN
        -- The records of earlier prunes and erasures stay.
        DELETE FROM pgmemory_fact_audit
        WHERE at < p_cutoff
          AND NOT (user_id = '' AND application_id = '' AND agent_id = '' AND session_id = ''
                   AND namespace IN ('pgmemory:retention', 'pgmemory:erasure'));
        GET DIAGNOSTICS n_fact = ROW_COUNT;
    END IF;
    PERFORM set_config('pgmemory.audit_change', '', true);
    summary := jsonb_build_object(
        'cutoff', to_jsonb(p_cutoff),
        'deleted', jsonb_build_object(
            'recall_audit', n_recall, 'memory_audit', n_memory, 'fact_audit', n_fact));
    INSERT INTO pgmemory_fact_audit
        (user_id, application_id, agent_id, session_id, namespace, key, old_value, new_value,
         actor)
    VALUES ('', '', '', '', 'pgmemory:retention', 'prune_audit', NULL, summary, p_actor);
    RETURN summary;
END
$$
"""

#: The functions that run as their owner: only the schema's own objects (search_path pinned,
#: pg_temp last, so a caller's temporary table cannot stand in for an audit table).
_DEFINERS = (
    "pgmemory_keyed_sha256(text, text)",
    "pgmemory_erase_user_audit(text, text)",
    "pgmemory_prune_audit(timestamptz, boolean, boolean, boolean, text)",
)


def upgrade() -> None:
    op.create_table(
        "pgmemory_user_secrets",
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("secret", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("length(secret) = 32", name="ck_pgmemory_user_secrets_secret_length"),
        sa.PrimaryKeyConstraint("user_id", name="pk_pgmemory_user_secrets"),
    )
    op.execute("REVOKE ALL ON pgmemory_user_secrets FROM PUBLIC")
    for ddl in (_KEYED_SHA256, _ROW_SHA256, _GUARD, _ERASE, _PRUNE):
        op.execute(ddl)
    for signature in _DEFINERS:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        # The schema name comes from the server and is quoted there (%I), never from input.
        op.execute(
            "DO $$ BEGIN EXECUTE format('ALTER FUNCTION "
            + signature
            + " SET search_path = %I, pg_temp', current_schema()); "
            "END $$"
        )
    # Existing hashes become keyed: one secret per user found in the audits.
    op.execute(
        f"""
        INSERT INTO pgmemory_user_secrets (user_id, secret)
        SELECT u.user_id, {_RANDOM_SECRET}
        FROM (SELECT user_id FROM pgmemory_memory_audit
              UNION SELECT user_id FROM pgmemory_recall_audit) AS u
        ON CONFLICT (user_id) DO NOTHING
        """
    )
    op.execute(
        "UPDATE pgmemory_memory_audit "
        "SET content_sha256 = pgmemory_keyed_sha256(user_id, content_sha256)"
    )
    op.execute(
        "UPDATE pgmemory_recall_audit "
        "SET query_sha256 = pgmemory_keyed_sha256(user_id, query_sha256)"
    )
    op.execute("SET LOCAL \"TimeZone\" = 'UTC'")
    op.execute("SET LOCAL extra_float_digits = 1")
    for table in AUDIT_TABLES:
        op.add_column(table, sa.Column("row_sha256", sa.Text(), nullable=True))
        op.execute(f"UPDATE {table} AS t SET row_sha256 = pgmemory_audit_row_sha256(to_jsonb(t))")
        op.alter_column(table, "row_sha256", nullable=False)
        op.execute(
            f"CREATE TRIGGER pgmemory_audit_guard BEFORE INSERT OR UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION pgmemory_audit_guard()"
        )
        op.execute(
            f"CREATE TRIGGER pgmemory_audit_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION pgmemory_audit_guard()"
        )
    op.execute("RESET extra_float_digits")
    op.execute('RESET "TimeZone"')


def downgrade() -> None:
    # The audit hashes stay keyed (the plain ones are not recoverable, and need not be).
    for table in AUDIT_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS pgmemory_audit_no_truncate ON {table}")
        op.execute(f"DROP TRIGGER IF EXISTS pgmemory_audit_guard ON {table}")
        op.drop_column(table, "row_sha256")
    for signature in _DEFINERS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_audit_guard()")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_audit_row_sha256(jsonb)")
    op.drop_table("pgmemory_user_secrets")
