"""Opt-in half vectors: a second first pass for the large scopes of collections whose vectors the
binary codes do not keep apart (``pgmemory db half-vectors``).

A user scope of more than 1,000 rows is searched in two phases (:mod:`pgmemory.store.shortlist`):
a compact first pass keeps a shortlist, re-ranked exactly. The binary codes every schema keeps
(migration 0013) hold real sentence embeddings' neighbours, but not vectors that are nearly
random within a topic; such a collection's probe measures recall below the floor and its large
scopes are scanned exactly. :func:`add_half_vectors` adds each memory's unit vector in half
precision (a stored generated column, so every write path fills it) and an index that holds it
beside the collection and the user; stores opened after it (and the one given) measure both
passes in their probe and take the cheaper one at the floor.

It is a choice, not a migration, because every write pays for it whatever the data (measured,
docs/performance.md: an ``add`` of two 512-d memories +0.04 ms, a provider's turn writes about
5 % slower, an import 12-18 % slower; about 1 kB a row more at 384 d, in TOAST and the index),
and it only helps collections whose probe log says the codes failed ("two-phase path of C: ...
codes 0.70 ... -> off (exact)"). Adding the column rewrites the table: run it in a maintenance
window on a large one, or right after ``pgmemory db upgrade``. Only collections of up to
``HALVES_MAX_DIMENSIONS`` (1,024) dimensions keep halves; ids must then fit beside them in the
index (about 600 bytes for the collection name and user id together), which writes check. It
needs pgvector >= 0.7 (``l2_normalize``), and runs under the migration lock, all or nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from sqlalchemy.exc import DBAPIError

from pgmemory.errors import DatabaseNotReadyError
from pgmemory.store.models import HALVES_MAX_DIMENSIONS
from pgmemory.store.validation import HALVES_INDEX

if TYPE_CHECKING:
    from pgmemory.store._engine.database import Database


#: SQLSTATE program_limit_exceeded: an index entry larger than a B-tree holds.
_ENTRY_TOO_BIG = "54000"


@dataclass(frozen=True)
class HalfVectorsReport:
    """What :func:`add_half_vectors` did."""

    #: Whether this call added them (False: the memories kept them already).
    added: bool
    #: The column and its index.
    column: str = "embedding_half"
    index: str = HALVES_INDEX.name

    def as_dict(self) -> dict[str, str | bool]:
        """The report for ``--json``."""
        return asdict(self)


async def add_half_vectors(db: Database) -> HalfVectorsReport:
    """Add the half vectors' column and index to the memories table, if it has none yet.

    Args:
        db: The database (migrated to head); its store takes the pass from its next probe.

    Returns:
        What was done.

    Raises:
        DatabaseNotReadyError: pgvector is older than 0.7 (no ``l2_normalize``); nothing was
            changed.
    """
    from pgmemory.admin import statements as s
    from pgmemory.store import queries as q
    from pgmemory.store._engine.clauses import clause
    from pgmemory.store._engine.connector import first_passes
    from pgmemory.store.migrate import MIGRATION_LOCK_KEY

    async with db.write() as conn:
        await conn.execute(clause(q.MIGRATION_XACT_LOCK), {"key": MIGRATION_LOCK_KEY})
        if (await conn.execute(clause(q.FIRST_PASSES))).one().halves:
            added = False
        elif not (await conn.execute(clause(s.HAS_L2_NORMALIZE))).scalar_one():
            raise DatabaseNotReadyError(
                "pgvector has no l2_normalize (it needs pgvector >= 0.7): run `ALTER EXTENSION "
                "vector UPDATE` as its owner after upgrading pgvector; nothing was changed"
            )
        else:
            await conn.execute(clause(s.ADD_HALF_VECTORS_COLUMN))
            try:
                await conn.execute(clause(s.ADD_HALF_VECTORS_INDEX))
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != _ENTRY_TOO_BIG:
                    raise
                raise DatabaseNotReadyError(
                    f"a stored memory's collection name and user id are too long to fit beside "
                    f"its half vector in the index {HalfVectorsReport.index} (about 600 bytes "
                    f"together at {HALVES_MAX_DIMENSIONS} dimensions); nothing was changed. "
                    "Find them with `SELECT collection, user_id FROM pgmemory_memories WHERE "
                    "octet_length(collection) + octet_length(user_id) > 500`, and move those "
                    "memories to shorter ids (export, import) before adding the half vectors"
                ) from None
            added = True
    db.first_passes = await first_passes(db.engine)
    return HalfVectorsReport(added=added)
