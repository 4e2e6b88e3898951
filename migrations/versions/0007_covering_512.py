"""Covering index up to 512 dimensions, so ordinary ids fit beside the vector.

At 640 dimensions the vector took 2,568 of the 2,704 bytes a B-tree entry may hold, leaving
about 90 bytes for the collection name and the four scope ids together: an email user id and a
64-hex session id did not fit. At 512 dimensions about 600 bytes remain. Collections of 513–640
dimensions (a size no common embedder produces) recall from the heap, like larger ones.

The index is rebuilt, which reads every row of a collection of up to 512 dimensions: on a large
table run this migration in a maintenance window.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "ix_pgmemory_memories_user_cover"
_KEYS = ["collection", "user_id", "session_id", "agent_id", "application_id"]
_INCLUDE = ["id", "created_at", "expires_at", "embedding"]


def _recreate(dimensions: int) -> None:
    op.drop_index(_NAME, table_name="pgmemory_memories")
    op.create_index(
        _NAME,
        "pgmemory_memories",
        _KEYS,
        unique=False,
        postgresql_include=_INCLUDE,
        postgresql_where=sa.text(f"vector_dims(embedding) <= {dimensions}"),
    )


def upgrade() -> None:
    _recreate(512)


def downgrade() -> None:
    _recreate(640)
