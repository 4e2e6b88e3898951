"""Recompute keyword terms with English stemming.

Keyword recall now reduces English words to their stem on both sides ("ordered" and "orders"
match "order"). Rows written before keep unstemmed terms, which a stemmed query misses, so their
``search_vector`` is recomputed here, in batches, from their content, with the same analyser the
store uses for new rows.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from pgmemory.text import terms

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read and rewritten per statement.
BATCH = 2000

_NEXT = sa.text(
    "SELECT user_id, id, content FROM pgmemory_memories "
    "WHERE (user_id, id) > (:user_id, :id) ORDER BY user_id, id LIMIT :batch"
)
_UPDATE = sa.text(
    "UPDATE pgmemory_memories AS m SET search_vector = to_tsvector('simple', r.document) "
    "FROM unnest(CAST(:user_ids AS text[]), CAST(:ids AS uuid[]), CAST(:documents AS text[])) "
    "AS r(user_id, id, document) WHERE m.user_id = r.user_id AND m.id = r.id"
)


def upgrade() -> None:
    conn = op.get_bind()
    user_id, last = "", "00000000-0000-0000-0000-000000000000"
    while True:
        rows = conn.execute(_NEXT, {"user_id": user_id, "id": last, "batch": BATCH}).all()
        if not rows:
            return
        documents = [terms.document(r.content) for r in rows]
        conn.execute(
            _UPDATE,
            {
                "user_ids": [r.user_id for r in rows],
                "ids": [str(r.id) for r in rows],
                "documents": documents,
            },
        )
        user_id, last = rows[-1].user_id, str(rows[-1].id)


def downgrade() -> None:
    # The terms stay stemmed: earlier revisions search them as they are (fewer matches for
    # inflected forms, nothing lost).
    pass
