"""The OpenTelemetry spans and metrics of memory operations (pgmemory.telemetry), read with the
SDK's in-memory span exporter and metric reader: names, parents, attributes, and that no text,
query or user id appears in them unless the application asks."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

import agent_framework as af
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pgmemory import (
    ChatHistoryMemoryProvider,
    MemoryRecord,
    MemoryScope,
    MemoryStore,
    PostgresHistoryProvider,
    Settings,
)
from pgmemory.admin import Admin
from pgmemory.errors import CollectionError, InvalidInputError, ScopeError
from tests.agents import agent
from tests.conftest import unique
from tests.openai_server import OpenAIServer, text

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def sdk() -> Iterator[None]:
    """The SDK as an application would configure it (once per process: the global providers
    cannot be replaced); the exporter stops keeping spans after this module."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    yield
    EXPORTER.shutdown()


@pytest.fixture(autouse=True)
def fresh() -> None:
    EXPORTER.clear()


def spans(operation: str | None = None) -> list[ReadableSpan]:
    found = list(EXPORTER.get_finished_spans())
    if operation is None:
        return found
    return [s for s in found if (s.attributes or {}).get("gen_ai.operation.name") == operation]


def everything_shown(found: list[ReadableSpan]) -> str:
    """Every span's name, attribute values, status and events, as one text."""
    parts: list[str] = []
    for s in found:
        parts += [s.name, str(s.status.description), *map(str, (s.attributes or {}).values())]
        parts += [str(e.attributes) for e in s.events]
    return "\n".join(parts)


def metric_points() -> dict[str, Any]:
    data = READER.get_metrics_data()
    points: dict[str, Any] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    return points


def total(name: str) -> float:
    return sum(p.value for p in metric_points().get(name, []))


async def test_a_search_joins_the_callers_trace_and_shows_no_text_or_user(
    store: MemoryStore, collection: str
) -> None:
    user = unique("alice")
    scope = MemoryScope(user_id=user)
    await store.add(
        collection,
        [MemoryRecord(content="I drink green tea every morning", scope=scope, message_id="m1")],
    )
    tracer = trace.get_tracer("the-application")
    with tracer.start_as_current_span("handle request") as parent:
        hits = await store.search(collection, scope, query="what do I drink in the morning?")
    assert hits
    (search,) = spans("search_memory")
    assert search.parent is not None
    assert search.parent.span_id == parent.get_span_context().span_id
    attributes = dict(search.attributes or {})
    assert attributes["gen_ai.memory.store.id"] == collection
    assert attributes["pgmemory.scope.dimensions"] == ("user_id",)
    assert attributes["pgmemory.retrieval.mode"] == "hybrid"
    assert attributes["pgmemory.result.count"] == len(hits)
    assert attributes["pgmemory.result.top_score"] == pytest.approx(hits[0].score)
    assert "pgmemory.user.pseudonym" not in attributes
    assert search.name == f"search_memory {collection}"
    # The embedding and the SQL round trip are its children.
    children = {
        s.name: s for s in spans() if s.parent and s.parent.span_id == search.context.span_id
    }
    assert f"embeddings {store.embedder.model_id}" in children
    # one round trip on one server; on Citus the search and its audit row in one transaction
    assert {"pgmemory.sql statement", "pgmemory.sql transaction"} & set(children)
    shown = everything_shown(spans())
    for private in (user, "green tea", "what do I drink", "morning"):
        assert private not in shown
    assert total("pgmemory.memories.written") >= 1
    durations = metric_points()["pgmemory.recall.duration"]
    assert sum(p.count for p in durations) >= 1


async def test_texts_and_a_pseudonym_only_when_the_application_asks(
    store_url: str, embedder: Any, collection: str
) -> None:
    user = unique("bob")
    scope = MemoryScope(user_id=user)
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        telemetry_sensitive_data=True,
        telemetry_user_key="the application's key",
    )
    async with MemoryStore(store_url, settings=settings, embedder=embedder) as store:
        await store.add(collection, [MemoryRecord(content="bob likes jazz", scope=scope)])
        EXPORTER.clear()
        await store.search(collection, scope, query="music bob likes")
    (search,) = spans("search_memory")
    attributes = dict(search.attributes or {})
    assert attributes["gen_ai.memory.query.text"] == "music bob likes"
    assert "bob likes jazz" in str(attributes["gen_ai.memory.records"])
    expected = hmac.new(b"the application's key", user.encode(), hashlib.sha256).hexdigest()
    assert attributes["pgmemory.user.pseudonym"] == expected[:32]
    assert user not in everything_shown(spans())


async def test_writes_deletes_erasure_prune_and_collections(
    store: MemoryStore, owner_engine: Any
) -> None:
    name = unique("tel")
    user = unique("carol")
    scope = MemoryScope(user_id=user, session_id="s1")
    erased_before = total("pgmemory.erasures")
    await store.create_collection(name, dimensions=3, embedding_model="test")
    ids = await store.add(name, [MemoryRecord(content="one", scope=scope, embedding=[1, 0, 0])])
    imported = await store.import_records(
        name,
        [MemoryRecord(content=f"row {i}", scope=scope, embedding=[0, 1, 0]) for i in range(3)],
    )
    await store.append_history("s1", [{"message_id": "h1", "role": "user", "t": 1}], user_id=user)
    await store.read_history("s1", user_id=user)
    await store.delete(name, ids=ids, scope=scope)
    await store.erase_user(user)
    await store.drop_collection(name)

    by_op = [
        (
            s.attributes["gen_ai.operation.name"],
            s.attributes["pgmemory.kind"],
            s.attributes.get("gen_ai.memory.store.id"),
        )
        for s in spans()
        if s.attributes and "pgmemory.kind" in s.attributes
    ]
    assert by_op == [
        ("create_memory_store", "memory", name),
        ("update_memory", "memory", name),
        ("update_memory", "memory", name),
        ("update_memory", "history", None),
        ("search_memory", "history", None),
        ("delete_memory", "memory", name),
        ("delete_memory", "user", None),
        ("delete_memory_store", "memory", name),
    ]
    add, bulk = spans("update_memory")[:2]
    assert add.attributes and add.attributes["gen_ai.memory.record.id"] == str(ids[0])
    assert bulk.attributes and bulk.attributes["pgmemory.record.count"] == imported == 3
    erase = next(s for s in spans("delete_memory") if s.attributes["pgmemory.kind"] == "user")
    assert erase.attributes and erase.attributes["pgmemory.erased.history_messages"] == 1
    assert total("pgmemory.erasures") == erased_before + 1
    assert user not in everything_shown(spans())

    # The owner's prune of the audit is one too (the role may not prune).
    async with MemoryStore(str(owner_engine.url.render_as_string(hide_password=False))) as owner:
        EXPORTER.clear()
        counts = await Admin(owner).prune_audit(datetime_in_the_past())
    (prune,) = spans("delete_memory")
    assert prune.attributes and prune.attributes["pgmemory.kind"] == "audit"
    assert prune.attributes["pgmemory.pruned.recall_audit"] == counts["recall_audit"]


def datetime_in_the_past() -> Any:
    from datetime import UTC, datetime

    return datetime(2001, 1, 1, tzinfo=UTC)


async def test_a_failed_operation_names_the_error_class_only(store: MemoryStore) -> None:
    missing = unique("no-such-collection")
    with pytest.raises(CollectionError):
        await store.search(missing, MemoryScope(user_id="u"), query="anything")
    (search,) = spans("search_memory")
    assert search.status.status_code is StatusCode.ERROR
    assert search.status.description == "CollectionError"
    assert search.attributes and search.attributes["error.type"] == "CollectionError"
    assert search.events == ()  # no exception event: its message could quote stored data


async def test_a_provider_turn_is_spans_under_the_agents_run(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    user = unique("dora")
    memory = ChatHistoryMemoryProvider(store, collection, user_id=user)
    history = PostgresHistoryProvider(store, user_id=user)
    assistant = agent(openai_server, history, memory)
    openai_server.queue(text("Noted."))
    tracer = trace.get_tracer("the-application")
    EXPORTER.clear()  # the collection's creation by the fixture
    with tracer.start_as_current_span("invoke_agent") as run:
        await assistant.run("I moved to Lyon last spring", session=assistant.create_session())
    ours = [s for s in spans() if s.attributes and "pgmemory.kind" in s.attributes]
    kinds = {(s.attributes["gen_ai.operation.name"], s.attributes["pgmemory.kind"]) for s in ours}
    assert ("search_memory", "memory") in kinds  # the recall
    assert ("update_memory", "memory") in kinds  # the turn's messages stored
    assert ("update_memory", "history") in kinds
    trace_id = run.get_span_context().trace_id
    outside = [s.name for s in ours if s.context.trace_id != trace_id]
    assert not outside, outside
    assert user not in everything_shown(spans()) and "Lyon" not in everything_shown(spans())
    assert isinstance(assistant, af.Agent)


@pytest.mark.parametrize("call", ["read_history", "append_history", "erase_user"])
async def test_a_user_id_with_a_lone_surrogate_is_refused_as_without_the_pseudonym_key(
    store_url: str, embedder: Any, call: str
) -> None:
    """The user id is checked before anything encodes it: with the pseudonym key set, an id
    holding a lone surrogate (no UTF-8 form) gets the same clean refusal as without it, in a
    failed span that shows neither the id nor a pseudonym of it."""
    bad = "a\ud800"

    async def refusal(settings: Settings) -> BaseException:
        async with MemoryStore(store_url, settings=settings, embedder=embedder) as store:
            EXPORTER.clear()
            with pytest.raises(Exception) as raised:
                if call == "read_history":
                    await store.read_history("s1", user_id=bad)
                elif call == "append_history":
                    await store.append_history(
                        "s1", [{"message_id": "m1", "role": "user"}], user_id=bad
                    )
                else:
                    await store.erase_user(bad)
            return raised.value

    plain = await refusal(Settings(_env_file=None))  # type: ignore[call-arg]
    keyed = await refusal(
        Settings(_env_file=None, telemetry_user_key="the application's key")  # type: ignore[call-arg]
    )
    assert isinstance(plain, (ScopeError, InvalidInputError))
    assert type(keyed) is type(plain) and str(keyed) == str(plain)
    (span,) = [s for s in spans() if s.attributes and "pgmemory.kind" in s.attributes]
    assert span.attributes and span.attributes["error.type"] == type(plain).__qualname__
    assert "pgmemory.user.pseudonym" not in span.attributes
    assert bad not in everything_shown(spans()) and bad not in str(keyed)


_ASK_TRACING = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
import pgmemory.telemetry as telemetry
print(telemetry._tracing(), isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider))
trace.set_tracer_provider(TracerProvider())
print(telemetry._tracing())
"""


@pytest.mark.parametrize("environment", [None, "sdk_tracer_provider"])
def test_tracing_is_known_as_the_api_knows_it(environment: str | None) -> None:
    """The quick check of whether spans are made (the API's global, read directly) agrees with
    the API: no span before a provider is set, spans once one is, and a provider named in the
    environment (``OTEL_PYTHON_TRACER_PROVIDER``, set by the API on its first ask) counts from
    the first operation. In a fresh interpreter: the global can be set once per process."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    if environment is not None:
        env["OTEL_PYTHON_TRACER_PROVIDER"] = environment
    out = subprocess.run(
        [sys.executable, "-c", _ASK_TRACING], env=env, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == ("True False" if environment else "False True")
    assert out[1] == "True"
