"""OpenTelemetry spans and metrics of memory operations, named as the GenAI semantic
conventions name them.

Every store operation runs in a span of the caller's trace (an agent-framework agent's span,
when a provider runs inside one): ``search_memory`` (search, recall, history reads),
``update_memory`` (add, import, history appends, fact extraction), ``delete_memory`` (delete,
erase_user, prune_audit), ``create_memory_store`` and ``delete_memory_store`` (collections).
Embedding calls and SQL round trips are child spans. Only the ``opentelemetry-api`` package is
used: with no SDK configured by the application, every span and instrument is a no-op.

What a span shows: the operation, the collection (``gen_ai.memory.store.id``), a single
record's id, which scope dimensions were given (never their values), the retrieval mode, the
result count and top score. No text, query or user id appears unless the application asks:

* ``PGMEMORY_TELEMETRY_SENSITIVE_DATA=true`` (or a provider's
  ``enable_sensitive_telemetry_data``, for its recalls) adds the query text
  (``gen_ai.memory.query.text``) and the recalled texts (``gen_ai.memory.records``);
* ``PGMEMORY_TELEMETRY_USER_KEY`` adds ``pgmemory.user.pseudonym``, an HMAC-SHA256 of the user id
  under that key: stable across calls (a user's spans can be grouped) and meaningless without
  the key, which only the application holds.

A failed operation's span has status ERROR and ``error.type`` (the exception's class): never
its message, which may quote stored data.

Metrics: ``pgmemory.recall.duration`` (seconds, per search or recall), ``pgmemory.memories.written``
(memories added or imported) and ``pgmemory.erasures`` (users erased).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context, metrics, trace
from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER

from pgmemory.text.clean import bad_surrogate_index

if TYPE_CHECKING:
    from pgmemory.settings import Settings
    from pgmemory.store.records import MemoryScope

#: The instrumentation scope's name (the tracer's and the meter's).
SCOPE = "pgmemory"

# The GenAI semantic conventions' memory operations (``gen_ai.operation.name``).
SEARCH_MEMORY = "search_memory"
UPDATE_MEMORY = "update_memory"
DELETE_MEMORY = "delete_memory"
CREATE_MEMORY_STORE = "create_memory_store"
DELETE_MEMORY_STORE = "delete_memory_store"
#: The conventions' operation of an embedding call.
EMBEDDINGS = "embeddings"

_tracer = trace.get_tracer(SCOPE)
_meter = metrics.get_meter(SCOPE)
RECALL_DURATION = _meter.create_histogram(
    "pgmemory.recall.duration",
    unit="s",
    description="Time of a search or recall, embedding included.",
)
MEMORIES_WRITTEN = _meter.create_counter(
    "pgmemory.memories.written", unit="{memory}", description="Memories added or imported."
)
ERASURES = _meter.create_counter(
    "pgmemory.erasures", unit="{user}", description="Users erased (erase_user)."
)


T = TypeVar("T")


async def apart(make: Callable[[], Awaitable[T]]) -> T:
    """``await make()`` in a task with a context of its own (none of the caller's context
    variables, such as a shared transaction), but in the caller's trace."""
    parent = otel_context.get_current()

    async def run() -> T:
        token = otel_context.attach(parent)
        try:
            return await make()
        finally:
            otel_context.detach(token)

    return await asyncio.create_task(run(), context=contextvars.Context())


class Operation:
    """The span of one store operation, and what the operation reports into it."""

    def __init__(self, span: trace.Span, *, sensitive: bool, mode: str | None) -> None:
        self.span = span
        #: Whether texts may be recorded (the sensitive-data switch).
        self.sensitive = sensitive
        #: The retrieval mode, once known.
        self.mode = mode

    def retrieval_mode(self, mode: str) -> None:
        """The retrieval mode the operation resolved (its default, or the caller's)."""
        self.mode = mode
        self.span.set_attribute("pgmemory.retrieval.mode", mode)

    def query(self, text: str | None) -> None:
        """The query text, recorded only with the sensitive-data switch on."""
        if self.sensitive and text:
            self.span.set_attribute("gen_ai.memory.query.text", text)

    def results(self, scores: Sequence[float | None], texts: Sequence[str] = ()) -> None:
        """How many memories came back and the best score (their texts only if sensitive)."""
        if self.span is trace.INVALID_SPAN:  # untraced: nothing to fill
            return
        self.span.set_attribute("pgmemory.result.count", len(scores))
        known = [s for s in scores if s is not None]
        if known:
            self.span.set_attribute("pgmemory.result.top_score", float(max(known)))
        if self.sensitive and texts:
            self.span.set_attribute("gen_ai.memory.records", json.dumps(list(texts)))

    def written(self, ids: Sequence[Any], *, memories: bool = True) -> None:
        """What a write stored: the record's id when it is one, the count, and (for memories)
        the written-memories metric."""
        self.span.set_attribute("pgmemory.record.count", len(ids))
        if len(ids) == 1:
            self.span.set_attribute("gen_ai.memory.record.id", str(ids[0]))
        if memories and ids:
            MEMORIES_WRITTEN.add(len(ids))

    def count(self, name: str, value: int) -> None:
        """Another count the operation reports (``pgmemory.<name>``)."""
        self.span.set_attribute(f"pgmemory.{name}", value)


def operation(
    name: str,
    *,
    settings: Settings,
    collection: str | None = None,
    scope: MemoryScope | None = None,
    user_id: str | None = None,
    mode: str | None = None,
    kind: str = "memory",
    sensitive: bool = False,
) -> AbstractContextManager[Operation]:
    """A span for one store operation ``name`` (a GenAI memory operation), the current span
    its parent.

    Args:
        settings: The store's settings (the sensitive-data switch, the pseudonym key).
        collection: The collection, as ``gen_ai.memory.store.id``.
        scope: The scope: the names of its dimensions only (and the user's pseudonym).
        user_id: The user, when there is no scope (history, erasure): its pseudonym only.
        mode: The retrieval mode.
        kind: What is operated on: ``memory``, ``history``, ``facts``, ``audit``.
        sensitive: The call's own sensitive-data switch (a provider's).
    """
    timed = name == SEARCH_MEMORY and kind == "memory"
    if not _tracing():  # no SDK configured: no span to fill (the metrics still count)
        return _Untraced(Operation(trace.INVALID_SPAN, sensitive=False, mode=mode), timed)
    return _traced(
        f"{name} {collection}" if collection else f"{name} {kind}",
        _attributes(name, settings, collection, scope, user_id, mode, kind),
        sensitive=sensitive or settings.telemetry_sensitive_data,
        mode=mode,
        timed=timed,
    )


class _Untraced:
    """An operation without a span (a plain object, not a generator: a small search runs
    one per call); a memory search still records its duration."""

    __slots__ = ("began", "op", "timed")

    def __init__(self, op: Operation, timed: bool) -> None:
        self.op = op
        self.timed = timed
        self.began = 0.0

    def __enter__(self) -> Operation:
        self.began = time.perf_counter()
        return self.op

    def __exit__(self, *exc: object) -> None:
        if self.timed:
            _record_recall(self.began, self.op)


@contextmanager
def _traced(
    title: str, attributes: dict[str, Any], *, sensitive: bool, mode: str | None, timed: bool
) -> Iterator[Operation]:
    """:func:`operation` with an SDK configured: the operation's span."""
    began = time.perf_counter()
    op = Operation(trace.INVALID_SPAN, sensitive=False, mode=mode)
    try:
        with _span(title, attributes) as span:
            op.span, op.sensitive = span, sensitive
            yield op
    finally:
        if timed:
            _record_recall(began, op)


def _record_recall(began: float, op: Operation) -> None:
    """A memory search's duration, by its retrieval mode."""
    RECALL_DURATION.record(time.perf_counter() - began, {"pgmemory.retrieval.mode": op.mode or ""})


def _attributes(
    name: str,
    settings: Settings,
    collection: str | None,
    scope: MemoryScope | None,
    user_id: str | None,
    mode: str | None,
    kind: str,
) -> dict[str, Any]:
    """An operation span's attributes at its start (see :func:`operation`)."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": name, "pgmemory.kind": kind}
    if collection is not None:
        attributes["gen_ai.memory.store.id"] = collection
    as_dict = getattr(scope, "as_dict", None)  # not yet validated: maybe not a scope at all
    if callable(as_dict):
        attributes["pgmemory.scope.dimensions"] = sorted(as_dict())
        user_id = getattr(scope, "user_id", None) or user_id
    if mode is not None:
        attributes["pgmemory.retrieval.mode"] = mode
    pseudonym = _pseudonym(settings, user_id)
    if pseudonym is not None:
        attributes["pgmemory.user.pseudonym"] = pseudonym
    return attributes


@contextmanager
def embedding(model: str, texts: int) -> Iterator[None]:
    """A child span for one embedding call of ``texts`` texts with ``model``."""
    if not _tracing():
        yield
        return
    attributes = {
        "gen_ai.operation.name": EMBEDDINGS,
        "gen_ai.request.model": model,
        "pgmemory.embedding.texts": texts,
    }
    with _span(f"{EMBEDDINGS} {model}", attributes):
        yield


def sql(what: str) -> AbstractContextManager[object]:
    """A child span for SQL: ``what`` is ``statement`` (one round trip) or ``transaction``."""
    if not _tracing():
        return _NO_SPAN
    return _span(f"pgmemory.sql {what}", {"db.system.name": "postgresql"})


#: What :func:`sql` enters without an SDK (reusable: it holds nothing).
_NO_SPAN = nullcontext()


@contextmanager
def _span(title: str, attributes: dict[str, Any]) -> Iterator[trace.Span]:
    """A client span, the current span its parent; a failure inside it marks it failed with
    the exception's class only (no exception event: its message may quote stored data)."""
    with _tracer.start_as_current_span(
        title,
        kind=trace.SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            _failed(span, exc)
            raise


def _tracing() -> bool:
    """Whether the application configured a tracer provider (the API's default is a proxy
    that makes no span until one is set).

    Asked twice a search (its operation and its statement). While no provider is set,
    ``trace.get_tracer_provider()`` looks ``OTEL_PYTHON_TRACER_PROVIDER`` up in the environment
    on every call (a few µs of a small search's Python, in situ); so the API's global is read
    first, and only when one is set, or the environment names one (it is set from there on
    the first ask), is the API asked. Where the global is not found (another API version), the
    API answers every time.
    """
    if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None and not _PROVIDER_FROM_ENVIRONMENT:
        return False
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


#: What :func:`_tracing` reads when the API has no global of that name.
_UNKNOWN = object()
#: The environment names a tracer provider (read once: the API reads it on the first ask).
_PROVIDER_FROM_ENVIRONMENT = OTEL_PYTHON_TRACER_PROVIDER in os.environ


def _failed(span: trace.Span, exc: BaseException) -> None:
    """Mark ``span`` failed with the exception's class only (its message may quote data)."""
    kind = type(exc).__qualname__
    span.set_attribute("error.type", kind)
    span.set_status(trace.Status(trace.StatusCode.ERROR, kind))


def _pseudonym(settings: Settings, user_id: str | None) -> str | None:
    """The user's pseudonym under the application's key, or None: no key, no user, or an id
    with no UTF-8 form (a lone surrogate).

    The span opens before its operation checks its arguments, so the id is checked here before
    it is encoded: such an id gets no pseudonym, and the operation then refuses it with the
    store's own error (in this span), exactly as without a key.
    """
    key = settings.telemetry_user_key
    if key is None or not user_id or not isinstance(user_id, str):
        return None
    if bad_surrogate_index(user_id) >= 0:
        return None
    digest = hmac.new(key.get_secret_value().encode(), user_id.encode(), hashlib.sha256)
    return digest.hexdigest()[:32]
