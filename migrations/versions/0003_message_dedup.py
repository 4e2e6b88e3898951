"""Store a message once per collection and scope: unique (scope, message_id) when set.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Earlier revisions allowed repeats: keep the oldest copy of each message (audited).
    op.execute(
        """
        WITH repeats AS (
            SELECT id, user_id FROM (
                SELECT id, user_id, row_number() OVER (
                    PARTITION BY collection, user_id, application_id, agent_id, session_id,
                                 message_id
                    ORDER BY created_at, id) AS n
                FROM pgmemory_memories WHERE message_id IS NOT NULL
            ) AS ranked WHERE n > 1
        ),
        deleted AS (
            DELETE FROM pgmemory_memories AS m USING repeats AS r
            WHERE m.id = r.id AND m.user_id = r.user_id
            RETURNING m.id, m.user_id, m.collection, m.application_id, m.agent_id,
                      m.session_id, m.content_sha256
        )
        INSERT INTO pgmemory_memory_audit
            (user_id, operation, memory_id, collection, application_id, agent_id, session_id,
             content_sha256, actor)
        SELECT user_id, 'delete', id, collection, application_id, agent_id, session_id,
               content_sha256, 'migration 0003: duplicate message'
        FROM deleted
        """
    )
    op.create_index(
        "uq_pgmemory_memories_message",
        "pgmemory_memories",
        ["collection", "user_id", "application_id", "agent_id", "session_id", "message_id"],
        unique=True,
        postgresql_where=sa.text("message_id IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_pgmemory_memories_message", table_name="pgmemory_memories")
