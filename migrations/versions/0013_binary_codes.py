"""Each memory keeps a binary code of its vector, in a small index of its own: the first pass
of a large scope's search.

``embedding_code`` is ``binary_quantize(embedding)`` (pgvector: one bit per dimension, set where
the component is positive), a stored generated column, so every write path (INSERT, COPY
import, anything a caller runs) fills it and it can never disagree with the vector. The index
``ix_pgmemory_memories_user_codes`` holds it with the collection, the user, id and expiry (the
path serves user scopes only, so the index adds no limit on the other scope ids): d / 8 bytes
a row (64 at 512 dimensions, against 2,048 for the vector the covering index holds), so a large
scope's search scans it index-only for the rows nearest by Hamming distance, then re-ranks those
exactly from the full vectors (see :func:`pgmemory.store.queries.search_memories`). Its entries
stay small at every size a collection may have (250 bytes at 2,000 dimensions), so collections
above the covering index's 512 dimensions get an index-only first pass too.

Adding a stored generated column rewrites the memories table and builds one index over it: on a
large table run this migration in a maintenance window. It needs pgvector >= 0.7
(``binary_quantize``); on an older pgvector it adds neither, and every search stays exact (the
store says so when it opens; docs/scaling.md shows how to add them after upgrading pgvector).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_pgmemory_memories_user_codes"


#: The code column and its index, as one statement (also what docs/scaling.md has an operator
#: run after upgrading an older pgvector).
ADD_CODES = f"""
ALTER TABLE pgmemory_memories ADD COLUMN embedding_code bit varying
    GENERATED ALWAYS AS (CAST(binary_quantize(embedding) AS bit varying)) STORED;
CREATE INDEX {_INDEX} ON pgmemory_memories (collection, user_id)
    INCLUDE (id, expires_at, embedding_code)
"""


def upgrade() -> None:
    """Add the generated code column and its covering index, where pgvector can compute it."""
    conn = op.get_bind()
    if conn.exec_driver_sql("SELECT to_regprocedure('binary_quantize(vector)')").scalar():
        for statement in ADD_CODES.split(";"):
            op.execute(statement)


def downgrade() -> None:
    """Drop the index and the column (if they were added)."""
    op.execute(f"DROP INDEX IF EXISTS {_INDEX}")
    op.execute("ALTER TABLE pgmemory_memories DROP COLUMN IF EXISTS embedding_code")
