"""Recall, and the recall audit: which memories went into an answer, for whom, and why.

:func:`recall` is what a memory provider injects, chosen, fitted to its token budget and
audited in ONE statement (:func:`pgmemory.store._ranking.recall.recall_memories`, run by
:meth:`Database.audited <pgmemory.store._engine.database.Database.audited>`, which writes the audit row
apart on Citus); it renders the shown rows with :mod:`pgmemory.store.recall_text`. A
:func:`pgmemory.store.reads.search` is audited the same way; a caller that puts an answer's
memories together from several reads records them with :func:`record`.

What :func:`recall` shows: the newest ``recent_turns`` user messages of the scope and every
message after them (at most :data:`ROWS_PER_TURN` rows a turn), oldest first; and the best
``max_results`` matches for the query (with their conversation neighbours in hybrid mode),
most relevant first, less the recent rows, tool memories unless ``include_tools`` (role
``tool``, metadata ``{"pgmemory.tool": true}``, or an assistant row the 0.x provider stored as
``[called …]``) and near-duplicates (a match whose term set overlaps a recent row's or a
better kept match's by ``near_duplicate_threshold`` or more, Jaccard; above 1 keeps them
all). A row whose message id is in ``exclude_message_ids`` (what the caller already shows the
model: the session's history, the turn's input) is shown in neither part; as a recent row it
still makes the matches near it near-duplicates. The audit row records the retrieval mode used
(``"recent"`` without a query; the trace's ``mode`` is not used) and per memory its reason and
signals.

The budget of a recall (estimated tokens, :func:`pgmemory.text.tokens.estimate_tokens`): the
heading and a note that memories are data come first; no memory's line takes more than a sixth
of what they leave; then the matches in rank order while they fit in half the budget, the
recent turns newest first while they fit, then further matches. Each stage stops at the first
memory that does not fit even shortened (to at least
:data:`~pgmemory.store.recall_text.MIN_LINE_TOKENS`). The statement applies the rule with each
row's stored line cost and returns each shown row's line cap; the text rendered from them
never exceeds the budget, so the audit row holds exactly what the model saw.

Queries are kept as their sha256 unless the
trace asks for the text; either is of the query as search uses it (cleaned and cut, see
:func:`pgmemory.text.clean.clean_query`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pgmemory.telemetry as telemetry
from pgmemory.errors import InvalidInputError
from pgmemory.store import recall_text
from pgmemory.store._engine.database import Database
from pgmemory.store._engine.deployment import AuditedRead
from pgmemory.store._ranking.budget import budget_parameters
from pgmemory.store._ranking.recall import recall_memories
from pgmemory.store.catalogue import Catalogue
from pgmemory.store.columns import memory_from_row
from pgmemory.store.jsonb import jsonb
from pgmemory.store.models import COVERING_MAX_DIMENSIONS
from pgmemory.store.records import (
    MemoryScope,
    Recall,
    RecallItem,
    RecallReason,
    RecallTrace,
    SearchWeights,
    Signals,
    check_search_scope,
)
from pgmemory.store.requests import RecallRequest
from pgmemory.store.validation import (
    check_choice,
    describe,
    sha256_hex,
)
from pgmemory.text import terms
from pgmemory.text.clean import clean_query

#: Why a recall shows a memory (see :data:`pgmemory.store.records.RecallReason`).
REASONS = ("match", "recent", "neighbour")
#: The recall audit's mode when there is no query (recent turns only).
RECENT_ONLY = "recent"
#: Rows a recent turn may hold at most (a turn of more tool calls than this is cut).
ROWS_PER_TURN = 50
#: Most ranked rows a recall reads before dropping recent rows and near-duplicates.
MAX_FETCH = 400


async def recall(
    db: Database, catalogue: Catalogue, collection: str, scope: MemoryScope, request: RecallRequest
) -> Recall:
    """What a provider injects, in one statement (see ``MemoryStore.recall``); ``request`` is
    checked (:meth:`RecallRequest.checked`)."""
    trace = request.trace
    with telemetry.operation(
        telemetry.SEARCH_MEMORY,
        settings=db.settings,
        collection=collection,
        scope=scope,
        mode=request.mode,
        sensitive=trace is not None and trace.include_query_text,
    ) as op:
        check_search_scope(scope, allow_unscoped=request.allow_unscoped)
        info = await catalogue.get(collection)
        query, mode, max_results = request.query, request.mode, request.max_results
        recent_turns, max_tokens, heading = (
            request.recent_turns,
            request.max_tokens,
            request.heading,
        )
        weights = request.weights or SearchWeights()
        trace = trace or RecallTrace()
        # The store cleans and cuts a query as it does stored text: no query is too long or too
        # odd to recall with; a blank one recalls the recent turns only.
        cleaned = clean_query(query, max_chars=db.settings.max_text_chars) if query else ""
        matched = bool(cleaned.strip()) and max_results > 0
        used_mode = mode if matched else RECENT_ONLY
        op.retrieval_mode(used_mode)
        op.query(cleaned)
        fetch = min(MAX_FETCH, 4 * (max_results + 2 * recent_turns) + 8)
        params: dict[str, Any] = {
            **scope.as_dict(),
            "collection": collection,
            "recent_turns": recent_turns,
            "recent_rows": ROWS_PER_TURN * recent_turns,
            "include_tools": request.include_tools,
            "exclude_message_ids": list(request.exclude_message_ids),
            "threshold": request.near_duplicate_threshold,
            **budget_parameters(max_tokens, heading),
        }
        if matched:
            vector = None if mode == "text" else (await catalogue.embed(info, [cleaned]))[0]
            found = terms.distinct(cleaned)  # stemmed once
            params.update(
                {
                    "query": vector,
                    "terms": terms.or_query(found),
                    "term_list": found,
                    "pool": max(weights.pool, fetch),
                    "rrf_k": weights.rrf_k,
                    "vector_weight": weights.vector,
                    "text_weight": weights.text,
                    "recency_weight": weights.recency,
                    "neighbour_weight": weights.neighbour,
                    "limit": fetch,
                    "min_score": -2.0,
                }
            )
        if request.audit:
            stored = scope.column_values()
            params.update(
                {
                    "audit_user_id": stored["user_id"],
                    "audit_application_id": stored["application_id"],
                    "audit_agent_id": stored["agent_id"],
                    "audit_session_id": stored["session_id"],
                    "provider": trace.provider,
                    "mode": used_mode,
                    "requesting_session_id": trace.session_id,
                    "query_sha256": sha256_hex(cleaned),
                    "query_text": cleaned if trace.include_query_text and cleaned else None,
                }
            )
        dimensions = tuple(scope.as_dict())
        covering = info.dimensions <= COVERING_MAX_DIMENSIONS
        neighbours = mode == "hybrid" and weights.fusion == "score" and weights.neighbour > 0
        rows = await db.audited(
            AuditedRead(
                build=lambda shape: recall_memories(
                    dimensions,
                    covering=covering,
                    mode=mode if matched else None,
                    fusion=weights.fusion if mode == "hybrid" else "score",
                    neighbours=neighbours,
                    max_results=max_results,
                    audit=shape.audit,
                    relax_commit=shape.relax_commit,
                    guarded=shape.guarded,
                    distributed=shape.distributed,
                ),
                params=params,
                user=scope.user_id,
                audit=request.audit,
                audit_row=lambda got: _audit_row(params, got),
            )
        )
        recalled = _assemble(rows, heading=heading, bounded=max_tokens is not None, mode=used_mode)
        op.results([i.score for i in recalled.items], [i.memory.content for i in recalled.items])
        return recalled


def _audit_row(params: dict[str, Any], rows: Sequence[Any]) -> dict[str, Any]:
    """The recall's audit row (:func:`~pgmemory.store.queries.record_recall`'s parameters) for
    the shown ``rows``, when it is written apart from the recall: what the statement's own
    audit part records (signals rounded to 4 places, none for recent turns)."""

    def signals(row: Any) -> dict[str, float | None] | None:
        if row["reason"] == "recent":
            return None
        names = ("similarity", "keywords", "recency", "neighbour")
        return {n: None if row[n] is None else round(float(row[n]), 4) for n in names}

    return {
        **{name: params[f"audit_{name}"] for name in MemoryScope.DIMENSIONS},
        **{name: params[name] for name in ("provider", "mode", "requesting_session_id")},
        "query_sha256": params["query_sha256"],
        "query_text": params["query_text"],
        "collection": params["collection"],
        "memory_ids": [row["id"] for row in rows],
        "scores": [float(row["score"]) for row in rows],
        "reasons": [row["reason"] for row in rows],
        "signals": jsonb([signals(row) for row in rows]),
    }


def _assemble(rows: Sequence[Any], *, heading: str | None, bounded: bool, mode: str) -> Recall:
    """The shown rows (in shown order), each rendered within the cap the statement gave it."""
    items = []
    for row in rows:
        memory = memory_from_row(row)
        reason = row["reason"]
        signals = (
            None
            if reason == "recent"
            else Signals(
                similarity=_number(row["similarity"]),
                keywords=_number(row["keywords"]),
                recency=_number(row["recency"]),
                neighbour=_number(row["neighbour"]),
            )
        )
        cap = int(row["cap"]) if bounded else None
        line = recall_text.fitted_line(memory.created_at, memory.role, memory.content, cap)
        items.append(RecallItem(memory, reason, float(row["score"]), signals, line))
    # (each reason comes from the statement: 'recent', or _signals' 'match' / 'neighbour')
    related = [i.line for i in items if i.reason != "recent"]
    recent = [i.line for i in items if i.reason == "recent"]
    return Recall(recall_text.render(heading, related, recent), items, mode)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


async def record(
    db: Database,
    collection: str,
    scope: MemoryScope,
    *,
    memory_ids: Sequence[uuid.UUID],
    scores: Sequence[float],
    query: str | None,
    trace: RecallTrace | None,
    reasons: Sequence[RecallReason] | None = None,
    signals: Sequence[Signals | None] | None = None,
) -> None:
    """Append one recall audit row for memories the caller put together itself.

    Raises:
        InvalidInputError: ``memory_ids`` and ``scores`` (or given ``reasons``, ``signals``)
            differ in length, or a reason is unknown.
    """
    if len(memory_ids) != len(scores):
        raise InvalidInputError("memory_ids and scores must have the same length")
    if reasons is not None:
        if len(reasons) != len(memory_ids):
            raise InvalidInputError("memory_ids and reasons must have the same length")
        for reason in reasons:
            check_choice(reason, what="reason", choices=REASONS)
    if signals is not None:
        if len(signals) != len(memory_ids):
            raise InvalidInputError("memory_ids and signals must have the same length")
        if not all(s is None or isinstance(s, Signals) for s in signals):
            raise InvalidInputError("signals must be Signals objects or None")
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
        "reasons": None if reasons is None else list(reasons),
        "signals": None
        if signals is None
        else jsonb([None if s is None else s.as_dict() for s in signals]),
    }
    await db.insert_audit(params)
