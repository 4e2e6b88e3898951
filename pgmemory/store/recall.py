"""The recall audit: which memories went into an answer, for whom, and for what query.

A :func:`pgmemory.store.reads.search` writes its own audit row in the search statement (or,
with read replicas, through :func:`insert` after the search); a
caller that puts an answer's memories together from several reads records them with
:func:`record`. Queries are kept as their sha256 unless the trace asks for the text; either is
of the query as search uses it (cleaned and cut, see :func:`pgmemory.text.clean.clean_query`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store.database import Database
from pgmemory.store.records import MemoryScope, RecallTrace
from pgmemory.store.validation import describe, sha256_hex
from pgmemory.text.clean import clean_query


async def record(
    db: Database,
    collection: str,
    scope: MemoryScope,
    *,
    memory_ids: Sequence[uuid.UUID],
    scores: Sequence[float],
    query: str | None,
    trace: RecallTrace | None,
) -> None:
    """Append one recall audit row for memories the caller put together itself.

    Raises:
        InvalidInputError: ``memory_ids`` and ``scores`` differ in length.
    """
    if len(memory_ids) != len(scores):
        raise InvalidInputError("memory_ids and scores must have the same length")
    if query is not None:
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string or None, got {describe(query)}")
        # As search() uses it, so the audit's hash is the search's.
        query = clean_query(query, max_chars=db.settings.max_text_chars)
    trace = trace or RecallTrace()
    params = {
        **scope.column_values(),
        "collection": collection,
        "provider": trace.provider,
        "mode": trace.mode,
        "requesting_session_id": trace.session_id,
        "query_sha256": sha256_hex(query or ""),
        "query_text": query if trace.include_query_text else None,
        "memory_ids": list(memory_ids),
        "scores": [float(x) for x in scores],
    }
    await insert(db, params)


async def insert(db: Database, params: dict[str, Any]) -> None:
    """Insert one recall audit row (:func:`~pgmemory.store.queries.record_recall`'s
    parameters) on the primary; no read waits for it on a replica.

    Outside a shared transaction: one prepared round trip, its own transaction, committed
    without waiting for the disk flush unless ``durable_recall_audit``. Inside one, the row
    commits with the block, at the block's durability.
    """
    shared = db.in_unit_of_work
    statement = q.record_recall(relax_commit=not (db.settings.durable_recall_audit or shared))
    await db.fetch(statement, params)
