"""Keyword matches are found per user: the term index's keys carry the collection and user.

The GIN index over ``search_vector`` held one posting list per term for the whole table, so a
user's keyword search read every user's rows holding its terms (a common word's list spans the
collection) and kept the scope's through a bitmap AND with a B-tree, or, under a generic plan
that took the user for a large one, filtered them on the heap row by row: measured at 1,000
messages in a table that also held a 10,000-message user, the keyword side alone took 15 ms
p50, and 6.5 ms with the scoped index.

``pgmemory_scope_terms(collection, user_id, search_vector)`` is each term prefixed with eight hex
digits of ``md5(collection, user)``; the new GIN index is over that array, and a user scope's
keyword search asks it for the same keys built from the query's terms (``&&``), so a posting
list holds one user's rows of one collection (two users whose digits collide share lists; the
scope filter still applies). Scopes without a user (a session, an application) match on
``search_vector`` itself through their own B-tree, as the vector side reads them. The terms
are lexemes of ``to_tsvector('simple', ...)``, at most 2,047 bytes, so a key never reaches the
GIN entry limit.

Building the index reads the whole table once, under a lock that blocks writes for that
time: on a large table run this migration in a maintenance window. Where a plan tests a small
scope's rows one by one instead of asking the index (stale statistics after a bulk load), it
computes every row's keys again, 6-10 µs a row (docs/performance.md has the measurements).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The keys of a row's (or a query's) terms within one collection and user. Immutable (it
#: reads nothing but its arguments, through pg_catalog's functions only), so it can key an
#: index.
SCOPE_TERMS = """
CREATE FUNCTION pgmemory_scope_terms(p_collection text, p_user_id text, p_terms tsvector)
RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog AS $$
    SELECT COALESCE(array_agg(s.prefix || t.lexeme), '{}')
    FROM (SELECT substr(md5(p_collection || chr(31) || p_user_id), 1, 8)) AS s(prefix),
         unnest(tsvector_to_array(p_terms)) AS t(lexeme)
$$
"""

_INDEX = "ix_pgmemory_memories_scope_terms"
_OLD_INDEX = "ix_pgmemory_memories_search_vector"


def upgrade() -> None:
    """Index the scoped term keys; drop the table-wide term index they replace."""
    op.execute(SCOPE_TERMS)
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {_INDEX} ON pgmemory_memories "
        "USING gin (pgmemory_scope_terms(collection, user_id, search_vector))"
    )
    op.execute(f"DROP INDEX IF EXISTS {_OLD_INDEX}")


def downgrade() -> None:
    """Back to the table-wide term index."""
    op.execute(
        f"CREATE INDEX IF NOT EXISTS {_OLD_INDEX} ON pgmemory_memories USING gin (search_vector)"
    )
    op.execute(f"DROP INDEX IF EXISTS {_INDEX}")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_scope_terms(text, text, tsvector)")
