"""Initial schema: collections, memories, audit of writes and recalls, chat history.

Creates the pgvector extension (the only place pgmemory runs CREATE EXTENSION; it needs a
superuser once per database) and keeps embeddings inline with STORAGE PLAIN.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "pgmemory_chat_messages",
        sa.Column("user_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("message", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "session_id <> ''", name=op.f("ck_pgmemory_chat_messages_session_not_blank")
        ),
        sa.PrimaryKeyConstraint(
            "user_id", "session_id", "seq", name=op.f("pk_pgmemory_chat_messages")
        ),
    )
    op.create_index(
        "uq_pgmemory_chat_messages_message",
        "pgmemory_chat_messages",
        ["user_id", "session_id", "message_id"],
        unique=True,
    )
    op.create_table(
        "pgmemory_collections",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("dimensions", sa.Integer(), nullable=False),
        sa.Column("embedding_model", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("name <> ''", name=op.f("ck_pgmemory_collections_name_not_blank")),
        sa.CheckConstraint(
            "dimensions BETWEEN 1 AND 2000", name=op.f("ck_pgmemory_collections_dimensions_range")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pgmemory_collections")),
    )
    op.create_table(
        "pgmemory_memory_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "txid",
            sa.BigInteger(),
            server_default=sa.text("(pg_current_xact_id()::text)::bigint"),
            nullable=False,
        ),
        sa.Column("operation", sa.Text(), nullable=False),
        sa.Column("memory_id", sa.UUID(), nullable=False),
        sa.Column("collection", sa.Text(), nullable=False),
        sa.Column("application_id", sa.Text(), nullable=False),
        sa.Column("agent_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("content_sha256", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.CheckConstraint(
            "operation IN ('insert', 'delete', 'expire')",
            name=op.f("ck_pgmemory_memory_audit_operation_known"),
        ),
        sa.PrimaryKeyConstraint("id", "user_id", name=op.f("pk_pgmemory_memory_audit")),
    )
    op.create_index("ix_pgmemory_memory_audit_at", "pgmemory_memory_audit", ["at"], unique=False)
    op.create_index(
        "ix_pgmemory_memory_audit_memory",
        "pgmemory_memory_audit",
        ["user_id", "memory_id"],
        unique=False,
    )
    op.create_table(
        "pgmemory_recall_audit",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("user_id", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("collection", sa.Text(), nullable=False),
        sa.Column("application_id", sa.Text(), nullable=False),
        sa.Column("agent_id", sa.Text(), nullable=False),
        sa.Column("session_id", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("mode", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("requesting_session_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("query_sha256", sa.Text(), nullable=False),
        sa.Column("query_text", sa.Text(), nullable=True),
        sa.Column("memory_ids", sa.ARRAY(sa.UUID()), nullable=False),
        sa.Column("scores", sa.ARRAY(postgresql.REAL()), nullable=False),
        sa.PrimaryKeyConstraint("id", "user_id", name=op.f("pk_pgmemory_recall_audit")),
    )
    op.create_index(
        "ix_pgmemory_recall_audit_session",
        "pgmemory_recall_audit",
        ["user_id", "requesting_session_id", "at"],
        unique=False,
    )
    op.create_index(
        "ix_pgmemory_recall_audit_user_at", "pgmemory_recall_audit", ["user_id", "at"], unique=False
    )
    op.create_table(
        "pgmemory_memories",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("user_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("collection", sa.Text(), nullable=False),
        sa.Column("application_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("agent_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("session_id", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("author_name", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("source_type", sa.Text(), server_default=sa.text("'external'"), nullable=False),
        sa.Column("source_id", sa.Text(), nullable=True),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("content_sha256", sa.Text(), nullable=False),
        sa.Column("embedding", Vector(), nullable=False),
        sa.Column("embedding_model", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "metadata",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.CheckConstraint("content <> ''", name=op.f("ck_pgmemory_memories_content_not_blank")),
        sa.CheckConstraint(
            "length(content_sha256) = 64", name=op.f("ck_pgmemory_memories_sha256_length")
        ),
        sa.ForeignKeyConstraint(
            ["collection"],
            ["pgmemory_collections.name"],
            name=op.f("fk_pgmemory_memories_collection_pgmemory_collections"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", "user_id", name=op.f("pk_pgmemory_memories")),
    )
    # Keep vectors inline: a TOASTed 1536-d vector makes exact scans ~3x slower.
    op.execute("ALTER TABLE pgmemory_memories ALTER COLUMN embedding SET STORAGE PLAIN")
    op.create_index(
        "ix_pgmemory_memories_app_agent_recent",
        "pgmemory_memories",
        ["collection", "application_id", "agent_id", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_pgmemory_memories_expires_at",
        "pgmemory_memories",
        ["expires_at"],
        unique=False,
        postgresql_where=sa.text("expires_at IS NOT NULL"),
    )
    op.create_index(
        "ix_pgmemory_memories_session_recent",
        "pgmemory_memories",
        ["collection", "session_id", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_pgmemory_memories_user_cover",
        "pgmemory_memories",
        ["collection", "user_id", "session_id", "agent_id", "application_id"],
        unique=False,
        postgresql_include=["id", "created_at", "expires_at", "embedding"],
        postgresql_where=sa.text("vector_dims(embedding) <= 640"),
    )
    op.create_index(
        "ix_pgmemory_memories_user_recent",
        "pgmemory_memories",
        ["collection", "user_id", "created_at"],
        unique=False,
    )


def downgrade() -> None:
    # The vector extension stays: other schemas in the database may use it.
    op.drop_index("ix_pgmemory_memories_user_recent", table_name="pgmemory_memories")
    op.drop_index(
        "ix_pgmemory_memories_user_cover",
        table_name="pgmemory_memories",
        postgresql_include=["id", "created_at", "expires_at", "embedding"],
        postgresql_where=sa.text("vector_dims(embedding) <= 640"),
    )
    op.drop_index("ix_pgmemory_memories_session_recent", table_name="pgmemory_memories")
    op.drop_index(
        "ix_pgmemory_memories_expires_at",
        table_name="pgmemory_memories",
        postgresql_where=sa.text("expires_at IS NOT NULL"),
    )
    op.drop_index("ix_pgmemory_memories_app_agent_recent", table_name="pgmemory_memories")
    op.drop_table("pgmemory_memories")
    op.drop_index("ix_pgmemory_recall_audit_user_at", table_name="pgmemory_recall_audit")
    op.drop_index("ix_pgmemory_recall_audit_session", table_name="pgmemory_recall_audit")
    op.drop_table("pgmemory_recall_audit")
    op.drop_index("ix_pgmemory_memory_audit_memory", table_name="pgmemory_memory_audit")
    op.drop_index("ix_pgmemory_memory_audit_at", table_name="pgmemory_memory_audit")
    op.drop_table("pgmemory_memory_audit")
    op.drop_table("pgmemory_collections")
    op.drop_index("uq_pgmemory_chat_messages_message", table_name="pgmemory_chat_messages")
    op.drop_table("pgmemory_chat_messages")
