"""A durable queue of derivation work, and fact changes that name the messages they came from.

* ``pgmemory_jobs``: work left by a turn for later (extracting and consolidating a user's
  facts off the turn path). One row per job, keyed ``(user_id, id)`` like every per-user table
  (so Citus distributes it with the rest). A turn inserts its job in its own transaction; a
  worker leases it (``lease_id``, ``leased_until``, ``attempts``), calls the model with no transaction open,
  then deletes it in the transaction that writes what it derived. ``last_error`` holds an
  exception type, never a message.
* ``pgmemory_fact_audit.sources`` (jsonb): what a change was derived from
  (``{"message_ids": [...]}``: the ids under which the history and the chat-history memories
  keep those messages). The row hash leaves it out while it is NULL, as 0010 did for its late
  columns, so every row hashed before still verifies.
* ``pgmemory_erase_user`` also deletes the user's pending jobs (they hold message texts), in
  the erasure's transaction, and counts them under ``erased.jobs``.

On a database whose tables Citus already distributes, the new table is distributed here too,
by ``user_id`` and co-located with the memories, as ``pgmemory db distribute`` would.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
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


_0010 = _migration("0010_recall_reasons.py", "pgmemory_migration_0010")
_0014 = _migration("0014_erasure_that_moves.py", "pgmemory_migration_0014")

_JOBS = """
CREATE TABLE pgmemory_jobs (
    user_id text NOT NULL,
    id uuid NOT NULL,
    namespace text NOT NULL,
    application_id text NOT NULL DEFAULT '',
    agent_id text NOT NULL DEFAULT '',
    session_id text NOT NULL DEFAULT '',
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    run_after timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    lease_id uuid,
    leased_until timestamptz,
    last_error text,
    CONSTRAINT pk_pgmemory_jobs PRIMARY KEY (user_id, id),
    CONSTRAINT ck_pgmemory_jobs_namespace_not_blank CHECK (namespace <> '')
)
"""

#: The worker's scan for users with work that is due.
_JOBS_DUE = "CREATE INDEX ix_pgmemory_jobs_due ON pgmemory_jobs (namespace, run_after)"

#: Distribute the queue with the memories where Citus distributes them (elsewhere: nothing).
_DISTRIBUTE_LIKE_MEMORIES = """
DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition '
                'WHERE logicalrelid = to_regclass(''pgmemory_memories''))' INTO distributed;
    END IF;
    IF distributed THEN
        PERFORM create_distributed_table(
            'pgmemory_jobs', 'user_id', colocate_with => 'pgmemory_memories');
    END IF;
END
$$
"""

#: On Citus, DDL after parallel DDL on a distributed table in the same transaction needs one
#: connection per node (elsewhere: an unused placeholder setting).
_SEQUENTIAL = "SET LOCAL citus.multi_shard_modify_mode = 'sequential'"

#: The row hash, leaving ``sources`` out while it is NULL as well.
_ROW_SHA256 = _0010._ROW_SHA256.replace("'reasons', 'signals'", "'reasons', 'signals', 'sources'")
assert _ROW_SHA256 != _0010._ROW_SHA256, "0010's row hash no longer lists its late columns"

_DELETE_HISTORY = """    DELETE FROM pgmemory_chat_messages WHERE user_id = p_user_id;
    GET DIAGNOSTICS n_history = ROW_COUNT;
"""
_ERASE_USER = (
    _0014._ERASE_USER.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    .replace("    n_history bigint;\n", "    n_history bigint;\n    n_jobs bigint;\n")
    .replace(
        _DELETE_HISTORY,
        _DELETE_HISTORY
        + "    DELETE FROM pgmemory_jobs WHERE user_id = p_user_id;\n"
        + "    GET DIAGNOSTICS n_jobs = ROW_COUNT;\n",
    )
    .replace("'history_messages', n_history)", "'history_messages', n_history, 'jobs', n_jobs)")
)
assert _ERASE_USER.count("n_jobs") == 3, "0014's erasure no longer has the expected shape"


def upgrade() -> None:
    """Create the queue, add the sources column, and let an erasure cancel the user's jobs."""
    op.execute(_SEQUENTIAL)
    op.execute(_JOBS)
    op.execute(_JOBS_DUE)
    op.execute(_DISTRIBUTE_LIKE_MEMORIES)
    op.execute(_ROW_SHA256)
    op.execute("ALTER TABLE pgmemory_fact_audit ADD COLUMN sources jsonb")
    op.execute(_ERASE_USER)
    _0014._pin_search_path(("pgmemory_erase_user(text, text)",))


def downgrade() -> None:
    """Drop the queue (pending jobs are lost) and the sources (rows written with them then fail
    ``pgmemory audit verify``: what their hash covered is gone)."""
    op.execute(_SEQUENTIAL)
    op.execute(_0014._ERASE_USER.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
    _0014._pin_search_path(("pgmemory_erase_user(text, text)",))
    op.execute("ALTER TABLE pgmemory_fact_audit DROP COLUMN sources")
    op.execute(_0010._ROW_SHA256)
    op.execute("DROP TABLE pgmemory_jobs")
