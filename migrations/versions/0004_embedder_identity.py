"""Embedder ids name the model and its size, never the endpoint's host.

Collections made with an OpenAI-compatible embedder recorded the endpoint's base URL in the
model id (``http://host:port/v1:text-embedding-3-small@256``), so moving the same model to
another URL made pgmemory refuse the collection. Such ids become
``openai:text-embedding-3-small@256``, in the catalogue and on the stored rows.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The endpoint prefix of an old id: scheme, host[:port], and a path without ':'.
_HOST_PREFIX = r"^https?://[^/]*(/[^:]*)?:"


def upgrade() -> None:
    for table in ("pgmemory_collections", "pgmemory_memories"):
        op.execute(
            f"UPDATE {table} SET embedding_model = "
            f"regexp_replace(embedding_model, '{_HOST_PREFIX}', 'openai:') "
            f"WHERE embedding_model ~ '{_HOST_PREFIX}'"
        )


def downgrade() -> None:
    # The host is not recoverable, and not needed: an 'openai:' id is valid at every revision.
    pass
