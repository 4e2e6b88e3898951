"""A collection can be re-embedded with another model while it serves searches.

``pgmemory db reembed`` (:mod:`pgmemory.admin.reembedding`) writes each memory's vector from the
new model into ``embedding_next`` while ``embedding`` keeps serving every search, then swaps
them for the whole collection in one transaction. ``pgmemory_collections.next_embedding_model``
and ``next_dimensions`` name the model being staged (NULL when none is), so a second run
resumes it and a run for another model is refused.

Both are nullable columns without a default: adding them rewrites nothing.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


#: On Citus, DDL on the reference table after parallel DDL on a distributed one in the same
#: transaction is refused; one connection per node makes both fine (elsewhere: an unused
#: placeholder setting).
_SEQUENTIAL = "SET LOCAL citus.multi_shard_modify_mode = 'sequential'"


def upgrade() -> None:
    """Add the staged vector and the staged model."""
    op.execute(_SEQUENTIAL)
    op.execute("ALTER TABLE pgmemory_memories ADD COLUMN embedding_next vector")
    op.execute(
        "ALTER TABLE pgmemory_collections ADD COLUMN next_embedding_model text, "
        "ADD COLUMN next_dimensions integer"
    )
    op.execute(
        "ALTER TABLE pgmemory_collections ADD CONSTRAINT "
        "ck_pgmemory_collections_next_dimensions_range "
        "CHECK (next_dimensions BETWEEN 1 AND 2000)"
    )


def downgrade() -> None:
    """Drop them (a re-embedding in progress is lost; the collection keeps its vectors)."""
    op.execute(_SEQUENTIAL)
    op.execute(
        "ALTER TABLE pgmemory_collections DROP CONSTRAINT "
        "ck_pgmemory_collections_next_dimensions_range, "
        "DROP COLUMN next_dimensions, DROP COLUMN next_embedding_model"
    )
    op.execute("ALTER TABLE pgmemory_memories DROP COLUMN embedding_next")
