"""Keyword recall stops reading the term index's pending list: new rows go straight to it.

A GIN index with ``fastupdate`` (PostgreSQL's default) puts new entries in an unsorted pending
list of up to ``gin_pending_list_limit`` (4 MB) and merges them into the index only when the
list is full or the table is vacuumed. Every search through the index reads the whole pending
list, every user's entries in it: with a scope's keys in the index (0018) the sorted part
answers a user's query in a fraction of a millisecond, but after a few hundred writes the
pending list held 137 pages and the term index's scan took 4.8 ms instead of 0.25 ms, a fifth
of a 1,000-message recall. With ``fastupdate = off`` each write puts its keys in their posting
lists at once: the recall's scan reads only the user's lists, and a write does a little more
(measured: a 1,000-message recall 1.20-1.29x faster, the turn's store unchanged; importing one
scope's 10,000 messages 4.2 s before, 4.9 s after, 100,000 rows of many users no slower).

The upgrade sets the option and empties the list the index already holds. On Citus the option
propagates to every shard's index; what each shard's list already holds is merged by the next
vacuum.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_pgmemory_memories_scope_terms"

#: Merge the pending entries of the term index into it. Not on a distributed table: there each
#: shard's index is on a worker, and a merge sent to the shards on connections of their own
#: (Citus's ``run_command_on_shards``) hung the upgrade, waiting, it seems, for the lock the
#: upgrade's ALTER INDEX holds on each shard's index until the migration's transaction ends.
#: Autovacuum (or ``VACUUM pgmemory_memories``, which Citus runs on every shard) merges them.
_EMPTY_PENDING = f"""
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        IF EXISTS (SELECT 1 FROM pg_dist_partition
                   WHERE logicalrelid = to_regclass('pgmemory_memories')) THEN
            RETURN;
        END IF;
    END IF;
    PERFORM gin_clean_pending_list('{_INDEX}'::regclass);
END
$$
"""


def upgrade() -> None:
    """Write new keys straight into the term index; merge what is pending."""
    op.execute(f"ALTER INDEX {_INDEX} SET (fastupdate = off)")
    op.execute(_EMPTY_PENDING)


def downgrade() -> None:
    """Back to PostgreSQL's default, a pending list for new entries."""
    op.execute(f"ALTER INDEX {_INDEX} RESET (fastupdate)")
