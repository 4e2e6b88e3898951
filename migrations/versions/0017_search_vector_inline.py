"""A memory's search vector stays in its row, so the keyword side reads no TOAST.

A heap row is squeezed below about 2 kB before it is stored: PostgreSQL moves the widest
compressible-or-movable columns out of line first. The embedding is ``STORAGE MAIN`` (0008)
and a 384-d vector alone is 1.5 kB, so at every common embedding size that rule moved
``search_vector`` (a few hundred bytes) into the TOAST table whenever it was the row's widest
movable column, as it usually is, and every keyword match (the ``text`` and ``hybrid``
searches, the recall's near-duplicate check) read its terms back through the TOAST index:
about ten buffer reads a row instead of none. ``STORAGE MAIN`` keeps it inline while the row
fits a page; ``content`` (read only for the rows a search returns) is the column that leaves
the row instead, so a page holds about as many rows as before.

Only the catalogue changes: no row is rewritten, though the ALTER holds the table's exclusive
lock for that moment (it waits for the statements running on the table). Rows stored before
keep their vectors out of line until they are rewritten (``VACUUM FULL pgmemory_memories``
rewrites them all, under the same lock for as long as it takes).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


#: Set the search vector's storage (``{storage}``). Citus refuses this ALTER on a distributed
#: table, so there it is made on the coordinator's table alone (the one new shards are made
#: from) and then on every existing shard.
_SET_STORAGE = """
DO $$
DECLARE
    distributed boolean := false;
    propagation text;
    failures bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_dist_partition '
                'WHERE logicalrelid = to_regclass(''pgmemory_memories''))' INTO distributed;
    END IF;
    IF NOT distributed THEN
        ALTER TABLE pgmemory_memories ALTER COLUMN search_vector SET STORAGE {storage};
        RETURN;
    END IF;
    propagation := current_setting('citus.enable_ddl_propagation');
    PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
    ALTER TABLE pgmemory_memories ALTER COLUMN search_vector SET STORAGE {storage};
    PERFORM set_config('citus.enable_ddl_propagation', propagation, true);
    EXECUTE 'SELECT count(*) FILTER (WHERE NOT success) FROM run_command_on_shards('
            '''pgmemory_memories'', '
            '''ALTER TABLE %s ALTER COLUMN search_vector SET STORAGE {storage}'')'
        INTO failures;
    IF failures > 0 THEN
        RAISE EXCEPTION 'search_vector storage: % shard(s) of pgmemory_memories refused it',
            failures;
    END IF;
END
$$
"""


def upgrade() -> None:
    """Keep the search vector inline while the row fits a page."""
    op.execute(_SET_STORAGE.format(storage="MAIN"))


def downgrade() -> None:
    """Back to the default, where a wide row moves its search vector out of line."""
    op.execute(_SET_STORAGE.format(storage="EXTENDED"))
