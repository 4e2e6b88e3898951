"""An index of each conversation's rows in time order, for a hybrid search's neighbours.

A hybrid search with neighbours (the chat-history providers' default) gives a row a share of
the better score of the rows just before and after it in its conversation (same user,
session, agent and application, by ``created_at`` then ``id``), and ranks the pooled rows'
neighbours too. Those links came from a window over every scope row, which sorted the scope
(at 10,000 messages a sort of every row that spilled to disk, about half of the statement).
Now, in a large scope, each pooled row's two rows before and two after are read by two probes
of this index: its keys are the conversation (the user, session, agent and application ids
hashed to 8 bytes), then ``created_at`` and ``id``; it includes ``expires_at``. A probe reads
those rows' entries (and checks the ids themselves on the rows) and stops, whatever the
scope's size. No id is in the entry, so the index adds no limit on the ids' lengths, and no
search by scope (``user_id = ...``) is planned through it in place of the other indexes.

Building it reads every memory row once: on a large table, run this migration in a quiet
hour (or create the index with ``CREATE INDEX CONCURRENTLY`` first, under this name).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = "ix_pgmemory_memories_conversation"
#: pgmemory.store.models.CONVERSATION_KEY, as of this revision.
_CONVERSATION = (
    "hashtextextended((((((user_id || '/'::text) || session_id) || '/'::text) || agent_id)"
    " || '/'::text) || application_id, 0::bigint)"
)


def upgrade() -> None:
    """Create the conversation index (unless an index of that name already exists)."""
    op.create_index(
        _NAME,
        "pgmemory_memories",
        ["collection", sa.text(_CONVERSATION), "created_at", "id"],
        unique=False,
        postgresql_include=["expires_at"],
        if_not_exists=True,
    )


def downgrade() -> None:
    """Drop the conversation index."""
    op.drop_index(_NAME, table_name="pgmemory_memories")
