"""The audit functions refuse what the owner would not do, and audit rows carry the server's time.

Tried as the least-privilege application role (which may call them), 0006's functions let it:

* erase the records user ``''`` (the erasure and prune records moved to a pseudonym, their
  summaries blanked), or a pseudonym, or a user whose memories, facts or chat history are
  still stored (their audit rows left their id while their data stayed);
* prune with a cutoff in the future, deleting rows written seconds before;
* insert audit rows dated whenever it liked (2001-01-01).

Here ``pgmemory_erase_user_audit`` refuses the records user, a pseudonym and a user with live
data (``erase_user`` deletes the data first, in the same transaction); ``pgmemory_prune_audit``
refuses a cutoff later than the transaction's start; and the audit guard stamps every inserted
audit row's ``at`` with the transaction's start (the server's clock), whatever the INSERT said.
Each refusal is an ``insufficient_privilege`` error whose message says what to do.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: What the guard does first on an INSERT (put before 0006's row-hash line).
_STAMP = """    IF TG_OP = 'INSERT' THEN
        NEW.at := now();  -- the server's clock, not the writer's say
    END IF;
"""
_ROW_HASH_LINE = "    NEW.row_sha256 := pgmemory_audit_row_sha256(to_jsonb(NEW));\n"


#: The checks put before 0006's erasure body (its first statement is the secret's DELETE).
_ERASE_CHECKS = """
    IF p_user_id = '' THEN
        RAISE EXCEPTION 'pgmemory: the audit''s own records (user '''') cannot be erased'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF left(p_user_id, 7) = 'erased:' THEN
        RAISE EXCEPTION 'pgmemory: % is the pseudonym of an erased user: nothing to erase',
            p_user_id USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF EXISTS (SELECT 1 FROM pgmemory_memories WHERE user_id = p_user_id)
       OR EXISTS (SELECT 1 FROM pgmemory_facts WHERE user_id = p_user_id)
       OR EXISTS (SELECT 1 FROM pgmemory_chat_messages WHERE user_id = p_user_id) THEN
        RAISE EXCEPTION 'pgmemory: the user''s memories, facts or chat history are still '
            'stored: erase the user with erase_user (pgmemory forget), which deletes them first'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
"""

#: The check put before 0006's prune body.
_PRUNE_CHECK = """
    IF p_cutoff > now() THEN
        RAISE EXCEPTION 'pgmemory: the prune cutoff % is in the future: audit rows are pruned '
            'only once they are older than it', p_cutoff USING ERRCODE = 'insufficient_privilege';
    END IF;
"""


def _v0006() -> ModuleType:
    """Migration 0006, whose function bodies these start from (and downgrade restores)."""
    path = Path(__file__).with_name("0006_audit_trust.py")
    spec = importlib.util.spec_from_file_location("pgmemory_migration_0006", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_checks(ddl: str, checks: str) -> str:
    """0006's CREATE FUNCTION as CREATE OR REPLACE, with ``checks`` first in its body."""
    head, begin, body = ddl.partition("\nBEGIN\n")
    assert begin, "0006's function has no BEGIN"
    return head.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1) + begin + checks + body


#: The two SECURITY DEFINER functions replaced here (their signatures).
_REPLACED_DEFINERS = (
    "pgmemory_erase_user_audit(text, text)",
    "pgmemory_prune_audit(timestamptz, boolean, boolean, boolean, text)",
)


def _pin_search_path() -> None:
    """CREATE OR REPLACE resets a function's settings: pin the definers' search_path again, as
    0006 did (the schema name comes from the server and is quoted there, never from input)."""
    for signature in _REPLACED_DEFINERS:
        op.execute(
            "DO $$ BEGIN EXECUTE format('ALTER FUNCTION "
            + signature
            + " SET search_path = %I, pg_temp', current_schema()); "
            "END $$"
        )


def _guard(v0006: ModuleType) -> str:
    """0006's guard, stamping an inserted row's ``at`` before it hashes the row."""
    ddl = v0006._GUARD.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    assert ddl.count(_ROW_HASH_LINE) == 1, "0006's guard has no row-hash line"
    return ddl.replace(_ROW_HASH_LINE, _STAMP + _ROW_HASH_LINE)


def upgrade() -> None:
    v0006 = _v0006()
    op.execute(_guard(v0006))
    op.execute(_with_checks(v0006._ERASE, _ERASE_CHECKS))
    op.execute(_with_checks(v0006._PRUNE, _PRUNE_CHECK))
    _pin_search_path()


def downgrade() -> None:
    v0006 = _v0006()
    for ddl in (v0006._GUARD, v0006._ERASE, v0006._PRUNE):
        op.execute(ddl.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    _pin_search_path()
