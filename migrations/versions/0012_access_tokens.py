"""Operators' access tokens, kept hashed: revocable, with an expiry, one design for every face.

``pgmemory_access_tokens`` holds, per token, a label (``name``), what it opens (``purpose``:
the audit page today, the MCP server later), its sha256, when it was issued, when it expires
and when it was revoked. The token itself is shown once, when issued, and never stored: a copy
of the table opens nothing. The least-privilege role gets no grant on it.

Revision ID: 0012
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pgmemory_access_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("purpose", sa.Text(), nullable=False),
        sa.Column("token_sha256", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("name <> ''", name="ck_pgmemory_access_tokens_name_not_blank"),
        sa.CheckConstraint(
            "expires_at > created_at", name="ck_pgmemory_access_tokens_expires_after_creation"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_pgmemory_access_tokens"),
    )
    op.create_index(
        "uq_pgmemory_access_tokens_sha256", "pgmemory_access_tokens", ["token_sha256"], unique=True
    )
    op.create_index(
        "uq_pgmemory_access_tokens_name",
        "pgmemory_access_tokens",
        ["name"],
        unique=True,
        postgresql_where=sa.text("revoked_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("pgmemory_access_tokens")
