"""Keyword search terms on memories; structured facts with their audit trail.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Rows stored before this revision get no terms (keyword recall skips them) until rewritten.
    op.add_column(
        "pgmemory_memories",
        sa.Column(
            "search_vector",
            postgresql.TSVECTOR(),
            server_default=sa.text("''::tsvector"),
            nullable=False,
        ),
    )
    op.create_index(
        "ix_pgmemory_memories_search_vector",
        "pgmemory_memories",
        ["search_vector"],
        unique=False,
        postgresql_using="gin",
    )
    op.create_table(
        "pgmemory_facts",
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column("application_id", sa.Text(), nullable=False),
        sa.Column("agent_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column(
            "facts",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint(
            "user_id",
            "application_id",
            "agent_id",
            "session_id",
            "namespace",
            name=op.f("pk_pgmemory_facts"),
        ),
    )
    op.create_table(
        "pgmemory_fact_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("application_id", sa.Text(), nullable=False),
        sa.Column("agent_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("old_value", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("new_value", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("actor", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.PrimaryKeyConstraint("id", "user_id", name=op.f("pk_pgmemory_fact_audit")),
    )
    op.create_index(
        "ix_pgmemory_fact_audit_scope",
        "pgmemory_fact_audit",
        ["user_id", "namespace", "at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_pgmemory_fact_audit_scope", table_name="pgmemory_fact_audit")
    op.drop_table("pgmemory_fact_audit")
    op.drop_table("pgmemory_facts")
    op.drop_index("ix_pgmemory_memories_search_vector", table_name="pgmemory_memories")
    op.drop_column("pgmemory_memories", "search_vector")
