"""Reading memories back: ranked search, pages in time order, and counts, within a scope.

Every read is confined to a scope (see :func:`pgmemory.store.records.check_search_scope`) and
skips expired rows. Search is exact unless the collection's approximate path takes it (see
:mod:`pgmemory.store.ann`); it is an audited read (:class:`~pgmemory.store._engine.deployment.AuditedRead`)
whose recall audit row commits with it, written where the deployment says (in the same
statement; apart on Citus; on the primary after it when a read replica served it: see
:meth:`pgmemory.store._engine.database.Database.audited`).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

import pgmemory.telemetry as telemetry
from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store._engine.deployment import AuditedRead, Shape
from pgmemory.store._ranking.search import search_memories
from pgmemory.store.ann import AnnPath, AnnPaths
from pgmemory.store.catalogue import Catalogue
from pgmemory.store.columns import hit_from_row, memory_from_row
from pgmemory.store.jsonb import jsonb
from pgmemory.store.models import COVERING_MAX_DIMENSIONS
from pgmemory.store.modes import DEFAULT_MODE, SEARCH_MODES
from pgmemory.store.records import (
    Memory,
    MemoryHit,
    MemoryScope,
    RecallTrace,
    SearchWeights,
    Signals,
    check_search_scope,
)
from pgmemory.store.shortlist import Shortlist, Shortlists
from pgmemory.store.validation import (
    check_aware,
    check_choice,
    check_limit,
    check_number,
    check_text,
    check_vector,
    describe,
    sha256_hex,
)
from pgmemory.text import terms
from pgmemory.text.clean import clean_query

logger = logging.getLogger(__name__)

#: The earliest and latest instants a memory can carry (Python's, UTC): open time bounds, so
#: a window or a walk with no bound of its own leaves no storable memory out.
DISTANT_PAST = datetime.min.replace(tzinfo=UTC)
DISTANT_FUTURE = datetime.max.replace(tzinfo=UTC)


#: The weights of a search that names none (frozen: one instance serves every search).
_DEFAULT_WEIGHTS = SearchWeights()
#: The recall trace of an audited search whose caller gave none: its mode only.
_MODE_TRACES: dict[str, RecallTrace] = {mode: RecallTrace(mode=mode) for mode in SEARCH_MODES}


class Route(enum.Enum):
    """How a search picks between the exact and the approximate path."""

    #: Ask the collection's approximate path (vector mode only; exact otherwise).
    AUTO = "auto"


def check_min_score(value: object, *, mode: str) -> float:
    """A search's ``min_score``: from -1 to 1 in vector mode (cosine similarity), else any
    finite number (BM25 and fused scores have no fixed range)."""
    if mode == "vector":
        return check_number(value, what="min_score", low=-1.0, high=1.0)
    return check_number(value, what="min_score")


async def search(
    db: Database,
    catalogue: Catalogue,
    ann: AnnPaths,
    collection: str,
    scope: MemoryScope,
    *,
    query: str | None,
    vector: Sequence[float] | np.ndarray | None,
    limit: int,
    mode: str | None,
    weights: SearchWeights | None,
    min_score: float | None,
    since: datetime | None,
    until: datetime | None,
    allow_unscoped: bool,
    audit: bool,
    trace: RecallTrace | None,
    path: AnnPath | Route | None = Route.AUTO,
    explain: bool = False,
    shortlists: Shortlists | None = None,
    shortlist: Shortlist | Route | None = Route.AUTO,
) -> list[MemoryHit]:
    """The ``limit`` best memories of the scope, best first (see ``MemoryStore.search``).

    A text query is cleaned like stored text and cut to its first ``max_text_chars``
    characters (:func:`pgmemory.text.clean.clean_query`): it is never refused for its length
    or its characters.

    ``path`` forces the exact path (None) or an approximate one (what a recall probe
    compares); by default the collection's approximate paths decide, for vector searches
    without a ``since``/``until`` window only (a window filters the index's candidates down
    to too few, so windowed searches stay exact). On its own decision, a search never fails
    because of the approximate path: if that statement fails, or returns fewer than ``limit``
    hits without a ``min_score``, the search runs exactly instead (and audits once).

    ``shortlist`` forces the exact path (None) or a two-phase one (its first pass and how many
    rows it re-ranks: what its probe compares); by default ``shortlists`` decides (see
    :mod:`pgmemory.store.shortlist`), for the vector searches without a window that the
    approximate path does not take.
    """
    with telemetry.operation(
        telemetry.SEARCH_MEMORY,
        settings=db.settings,
        collection=collection,
        scope=scope,
        mode=mode,
        sensitive=trace is not None and trace.include_query_text,
    ) as op:
        check_search_scope(scope, allow_unscoped=allow_unscoped)
        scope_columns = scope.as_dict()
        info = await catalogue.get(collection)
        check_limit(limit)
        if mode is None:
            mode = DEFAULT_MODE if vector is None else "vector"
        check_choice(mode, what="mode", choices=SEARCH_MODES)
        op.retrieval_mode(mode)
        weights = weights or _DEFAULT_WEIGHTS
        floor = -2.0 if min_score is None else check_min_score(min_score, mode=mode)
        window = _window(since, until)
        windowed = since is not None or until is not None
        if (query is None) == (vector is None):
            raise InvalidInputError("pass exactly one of query= (text) or vector=")
        if query is None and mode != "vector":
            raise InvalidInputError(f"mode={mode!r} matches keywords: pass query= (text)")
        if query is not None:
            if isinstance(query, str):
                query = clean_query(query, max_chars=db.settings.max_text_chars)
            query = check_text(query, what="query", max_chars=db.settings.max_text_chars)
            op.query(query)
            if mode != "text":
                vector = (await catalogue.embed(info, [query]))[0]
            query_hash = sha256_hex(query)
        if vector is not None:
            vector = check_vector(vector, dimensions=info.dimensions, what="query vector")
            if query is None:
                query_hash = hashlib.sha256(vector.tobytes()).hexdigest()  # its float32 bytes
        chosen = isinstance(path, Route)
        if isinstance(path, Route):
            path = await ann.route(collection, scope) if mode == "vector" and not windowed else None
        if isinstance(shortlist, Route):
            shortlist = None
            if shortlists is not None and path is None and mode == "vector" and not windowed:
                shortlist = await shortlists.route(collection, scope, limit)
        if path is not None:
            shortlist = None

        def statement(on: AnnPath | None, shape: Shape) -> str:
            return search_memories(
                tuple(scope_columns),
                covering=info.dimensions <= COVERING_MAX_DIMENSIONS,
                audit=shape.audit,
                mode=mode,
                fusion=weights.fusion if mode == "hybrid" else "score",
                neighbours=mode == "hybrid" and weights.fusion == "score" and weights.neighbour > 0,
                ann_dimensions=info.dimensions if on is not None else None,
                shortlist=shortlist.first_pass if on is None and shortlist is not None else None,
                relax_commit=shape.relax_commit,
                guarded=shape.guarded,
                windowed=windowed,
                explain=explain,
                distributed=shape.distributed,
            )

        found = terms.distinct(query) if query is not None else []  # stemmed once
        params: dict[str, Any] = {
            **scope_columns,
            **(window if windowed else {}),
            "collection": collection,
            "query": vector,
            "terms": terms.or_query(found),
            "term_list": found,
            "pool": max(weights.pool, limit),
            "rrf_k": weights.rrf_k,
            "vector_weight": weights.vector,
            "text_weight": weights.text,
            "recency_weight": weights.recency,
            "neighbour_weight": weights.neighbour,
            "limit": limit,
            "ann_candidates": max(4 * limit, 40),
            **({"shortlist": shortlist.rows} if shortlist is not None else {}),
            "min_score": floor,
        }
        if audit:
            # The audit names the search's mode unless the caller described its own recall mode.
            if trace is None:
                trace = _MODE_TRACES[mode]
            elif not trace.mode:
                trace = dataclasses.replace(trace, mode=mode)
            params.update(_audit_params(scope, trace, query, query_hash))

        def read(on: AnnPath | None, wanted: int) -> AuditedRead:
            return AuditedRead(
                build=lambda shape: statement(on, shape),
                params=params,
                user=scope.user_id,
                audit=audit,
                audit_row=lambda got: _audit_row(
                    params, got, collection=collection, explain=explain
                ),
                replica=True,
                settings=on.settings() if on is not None else None,
                wanted=wanted,
            )

        rows: Sequence[Any] | None = None
        if path is not None and chosen:
            # Too few hits (the scope filter thinned the index's candidates) or any failure: the
            # transaction rolls back (no audit row) and the exact path answers.
            try:
                rows = await db.audited(read(path, limit if min_score is None else 0))
            except Exception as exc:
                logger.warning(
                    "approximate path of collection %s not used for a search (%s); searched exactly",
                    collection,
                    type(exc).__name__,
                )
            path = None
        if rows is None:
            rows = await db.audited(read(path, 0))
        hits = _hits(rows, explain=explain)
        op.results([h.score for h in hits], [h.memory.content for h in hits])
        return hits


async def probe_search(
    db: Database,
    catalogue: Catalogue,
    ann: AnnPaths,
    collection: str,
    scope: MemoryScope,
    vector: Any,
    limit: int,
    path: AnnPath | None,
    shortlist: Shortlist | None = None,
) -> list[MemoryHit]:
    """An unaudited vector search for a probe: on ``path`` (the approximate index's; exact
    when None), or the two-phase ``shortlist`` (exact when None)."""
    return await search(
        db,
        catalogue,
        ann,
        collection,
        scope,
        query=None,
        vector=vector,
        limit=limit,
        mode="vector",
        weights=None,
        min_score=None,
        since=None,
        until=None,
        allow_unscoped=False,
        audit=False,
        trace=None,
        path=path,
        shortlist=shortlist,
    )


#: The recall audit row's parameters that describe the recall rather than the scope.
_AUDIT_TRACE = ("provider", "mode", "requesting_session_id", "query_sha256", "query_text")


def _audit_row(
    params: dict[str, Any], rows: Sequence[Any], *, collection: str, explain: bool
) -> dict[str, Any]:
    """A search's recall audit row (:func:`~pgmemory.store.queries.record_recall`'s
    parameters) for the ``rows`` it returned, when it is written apart from the search."""
    return {
        **{name: params[f"audit_{name}"] for name in MemoryScope.DIMENSIONS},
        **{name: params[name] for name in _AUDIT_TRACE},
        "collection": collection,
        "memory_ids": [row["id"] for row in rows],
        "scores": [float(row["score"]) for row in rows],
        "reasons": [row["reason"] for row in rows] if explain else None,
        "signals": jsonb([_signals(row).as_dict() for row in rows]) if explain else None,
    }


def _hits(rows: Sequence[Any], *, explain: bool = False) -> list[MemoryHit]:
    if explain:
        return [hit_from_row(row, _signals(row)) for row in rows]
    return [hit_from_row(row) for row in rows]


def _signals(row: Any) -> Signals:
    """A hit's signals, from the explained search statement's columns."""

    def number(name: str) -> float | None:
        value = row[name]
        return None if value is None else round(float(value), 6)

    return Signals(
        similarity=number("similarity"),
        keywords=number("keywords"),
        recency=number("recency"),
        neighbour=number("neighbour"),
    )


def _audit_params(
    scope: MemoryScope, trace: RecallTrace, query: str | None, query_hash: str
) -> dict[str, Any]:
    """The parameters of a search's recall audit row."""
    stored = scope.column_values()
    return {
        "audit_user_id": stored["user_id"],
        "audit_application_id": stored["application_id"],
        "audit_agent_id": stored["agent_id"],
        "audit_session_id": stored["session_id"],
        "provider": trace.provider,
        "mode": trace.mode,
        "requesting_session_id": trace.session_id,
        "query_sha256": query_hash,
        "query_text": query if trace.include_query_text else None,
    }


async def page(
    db: Database,
    catalogue: Catalogue,
    collection: str,
    scope: MemoryScope,
    *,
    limit: int,
    offset: int,
    newest_first: bool,
    since: datetime | None,
    until: datetime | None,
    allow_unscoped: bool,
) -> list[Memory]:
    """One page of the scope's live memories in time order (see ``MemoryStore.list``)."""
    check_search_scope(scope, allow_unscoped=allow_unscoped)
    await catalogue.get(collection)
    check_limit(limit)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidInputError(f"offset is {describe(offset)}; expected an integer >= 0")
    statement = q.list_memories(tuple(scope.as_dict()), newest_first=newest_first)
    params = {
        **scope.as_dict(),
        **_window(since, until),
        "collection": collection,
        "limit": limit,
        "offset": offset,
    }
    rows = await db.read_rows(statement, params, user=scope.user_id)
    return [memory_from_row(row) for row in rows]


async def count(
    db: Database, catalogue: Catalogue, collection: str, scope: MemoryScope, *, allow_unscoped: bool
) -> int:
    """How many live memories the scope holds."""
    check_search_scope(scope, allow_unscoped=allow_unscoped)
    await catalogue.get(collection)
    statement = q.count_memories(tuple(scope.as_dict()))
    async with db.read(scope.user_id) as conn:
        result = await conn.execute(
            clause(statement), {**scope.as_dict(), "collection": collection}
        )
        return int(result.scalar_one())


def _window(since: datetime | None, until: datetime | None) -> dict[str, datetime]:
    """The ``:since``/``:until`` parameters: ``created_at`` bounds, open ends made explicit."""
    return {
        "since": check_aware(since, what="since") or DISTANT_PAST,
        "until": check_aware(until, what="until") or DISTANT_FUTURE,
    }
