"""Each memory keeps a half-precision copy of its unit vector, in an index of its own: the
first pass of a large scope's search where binary codes lose the right rows.

Binary codes (0013) keep real sentence embeddings' nearest rows, but not vectors that are
nearly random within a topic, so such collections searched their large scopes exactly.
``embedding_half`` is ``l2_normalize(embedding)`` as ``halfvec`` (2 bytes a dimension, half a
vector's bytes), a stored generated column like the codes; its inner product ranks rows as
their cosine distance does, up to half-precision rounding. The index
``ix_pgmemory_memories_user_halves`` holds it with the collection, the user, id and expiry, so
a large scope's first pass reads it index-only, keeps a shortlist and re-ranks it exactly from
the full vectors (:func:`pgmemory.store.queries.search_memories`).

Only collections of up to ``HALVES_MAX_DIMENSIONS`` (1,024) dimensions keep it: a B-tree entry
holds about 2,700 bytes, and 1,024 halves take 2,048 of them (what 512 floats take in the
covering index, 0007). Wider vectors get NULL, which the index leaves out (it is partial).

Adding a stored generated column rewrites the memories table and builds one index over it: on
a large table run this migration in a maintenance window. It needs pgvector >= 0.7
(``halfvec``, ``l2_normalize``); on an older pgvector it adds neither, and the codes' path and
the exact one remain (docs/scaling.md shows how to add them after upgrading pgvector).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from pgmemory.store.models import HALVES_MAX_DIMENSIONS

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_pgmemory_memories_user_halves"

#: The halves column and its index, as one statement (also what docs/scaling.md has an operator
#: run after upgrading an older pgvector).
ADD_HALVES = f"""
ALTER TABLE pgmemory_memories ADD COLUMN embedding_half halfvec
    GENERATED ALWAYS AS (CASE WHEN vector_dims(embedding) <= {HALVES_MAX_DIMENSIONS}
        THEN CAST(l2_normalize(embedding) AS halfvec) END) STORED;
CREATE INDEX {_INDEX} ON pgmemory_memories (collection, user_id)
    INCLUDE (id, expires_at, embedding_half) WHERE embedding_half IS NOT NULL
"""


def upgrade() -> None:
    """Add the generated halves column and its index, where pgvector can compute them."""
    conn = op.get_bind()
    if conn.exec_driver_sql("SELECT to_regprocedure('l2_normalize(vector)')").scalar():
        for statement in ADD_HALVES.split(";"):
            op.execute(statement)


def downgrade() -> None:
    """Drop the index and the column (if they were added)."""
    op.execute(f"DROP INDEX IF EXISTS {_INDEX}")
    op.execute("ALTER TABLE pgmemory_memories DROP COLUMN IF EXISTS embedding_half")
