"""Vectors stay inline while the row fits a page, and go out of line only when it cannot.

``STORAGE PLAIN`` (0001) never moves an embedding out of the row, so a row must fit one 8 kB
heap page with it: a 2,000-d vector (8,008 bytes) plus the row's other columns (ids, scope,
hash, TOAST pointers to content and metadata) does not, and every write of a 2,000-d memory
failed with "row is too big", although collections accept up to 2,000 dimensions.
``STORAGE MAIN`` keeps the vector inline whenever the row fits (every size up to about 1,950
dimensions, so exact scans of those collections are unchanged) and moves it out of line only
as a last resort. Only the catalogue changes: no row is rewritten.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Let a vector leave the row only when the row cannot fit a page with it."""
    op.execute("ALTER TABLE pgmemory_memories ALTER COLUMN embedding SET STORAGE MAIN")


def downgrade() -> None:
    """Back to always-inline vectors (rows stored out of line meanwhile stay as they are)."""
    op.execute("ALTER TABLE pgmemory_memories ALTER COLUMN embedding SET STORAGE PLAIN")
