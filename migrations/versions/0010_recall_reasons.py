"""A recall fits its budget in SQL and says why it showed each memory.

* ``pgmemory_memories.recall_tokens``: the estimated tokens of the memory's full recall line
  (:func:`pgmemory.store.recall_text.line_tokens`), written by the store with every row, so the
  recall statement can fit its token budget in SQL and audit exactly what it shows. Existing
  rows are computed here, in batches, by the same Python function. The column stays nullable
  (a row written by an older version during a rolling upgrade); the statement then takes a
  safe upper bound for it.
* ``pgmemory_recall_audit.reasons`` (text[]) and ``.signals`` (jsonb array): per recalled
  memory, why it was shown (``match``, ``recent``, ``neighbour``) and what each signal
  (similarity, keywords, recency, neighbour) contributed. NULL in older rows.
* ``pgmemory_audit_row_sha256`` leaves those two keys out of the hashed row while they are
  NULL, so the rows written before (hashed without them) still verify, and a new row's values
  are covered by its hash like every other column.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from pgmemory.store.recall_text import line_tokens

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Rows read and rewritten per statement.
BATCH = 2000

#: Columns a row hash leaves out while they are NULL (added after rows were hashed without them).
_LATE_COLUMNS = ("reasons", "signals")

_ROW_SHA256 = """
CREATE OR REPLACE FUNCTION pgmemory_audit_row_sha256(r jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT encode(sha256(convert_to(
        (r - 'row_sha256'
           - ARRAY(SELECT k FROM unnest(ARRAY[{late}]) AS k WHERE jsonb_typeof(r -> k) = 'null')
        )::text, 'UTF8')), 'hex')
$$
""".format(late=", ".join(f"'{c}'" for c in _LATE_COLUMNS))

_NEXT = sa.text(
    "SELECT user_id, id, role, content FROM pgmemory_memories "
    "WHERE (user_id, id) > (:user_id, :id) ORDER BY user_id, id LIMIT :batch"
)
_UPDATE = sa.text(
    "UPDATE pgmemory_memories AS m SET recall_tokens = r.tokens "
    "FROM unnest(CAST(:user_ids AS text[]), CAST(:ids AS uuid[]), CAST(:tokens AS int[])) "
    "AS r(user_id, id, tokens) WHERE m.user_id = r.user_id AND m.id = r.id"
)


def upgrade() -> None:
    op.execute(_ROW_SHA256)
    op.add_column("pgmemory_recall_audit", sa.Column("reasons", sa.ARRAY(sa.Text()), nullable=True))
    op.add_column("pgmemory_recall_audit", sa.Column("signals", JSONB(), nullable=True))
    op.add_column("pgmemory_memories", sa.Column("recall_tokens", sa.Integer(), nullable=True))
    conn = op.get_bind()
    user_id, last = "", "00000000-0000-0000-0000-000000000000"
    while True:
        rows = conn.execute(_NEXT, {"user_id": user_id, "id": last, "batch": BATCH}).all()
        if not rows:
            return
        conn.execute(
            _UPDATE,
            {
                "user_ids": [r.user_id for r in rows],
                "ids": [str(r.id) for r in rows],
                "tokens": [line_tokens(r.role, r.content) for r in rows],
            },
        )
        user_id, last = rows[-1].user_id, str(rows[-1].id)


def downgrade() -> None:
    op.drop_column("pgmemory_memories", "recall_tokens")
    # Audit rows written with reasons were hashed with them: after the columns are dropped
    # ``pgmemory audit verify`` reports those rows (their recorded reasons are gone). The
    # tolerant row hash stays: it hashes every row without the columns as 0006's did.
    op.drop_column("pgmemory_recall_audit", "signals")
    op.drop_column("pgmemory_recall_audit", "reasons")
