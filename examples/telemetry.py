"""One memory turn (recall before, store after) traced with OpenTelemetry, printed as a tree.

    pip install 'pgmemory-agents[local]' opentelemetry-sdk
    python examples/telemetry.py

The application configures the OpenTelemetry SDK (here an in-memory exporter, printed at the
end; in production an OTLP exporter to your collector) and pgmemory's spans join its trace.
No text, query or user id is in them; `PGMEMORY_TELEMETRY_SENSITIVE_DATA=true` adds the texts,
`PGMEMORY_TELEMETRY_USER_KEY` a pseudonym of the user.
"""

from __future__ import annotations

import asyncio

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pgmemory import MemoryRecord, MemoryScope, MemoryStore

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

SHOWN = ("pgmemory.retrieval.mode", "pgmemory.result.count", "pgmemory.record.count")


def tree(spans: list[ReadableSpan]) -> None:
    """Print the spans as an indented tree with their durations and main attributes."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def show(span: ReadableSpan, depth: int) -> None:
        ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
        attributes = span.attributes or {}
        shown = " ".join(f"{k.split('.')[-1]}={attributes[k]}" for k in SHOWN if k in attributes)
        print(f"{'  ' * depth}{span.name:<{64 - 2 * depth}} {ms:6.2f} ms  {shown}".rstrip())
        for child in sorted(
            children.get(span.context.span_id, []), key=lambda s: s.start_time or 0
        ):
            show(child, depth + 1)

    for root in children.get(None, []):
        show(root, 0)


async def main() -> None:
    tracer = trace.get_tracer("my-app")
    scope = MemoryScope(user_id="alice", session_id="s1")
    async with MemoryStore() as store:
        await store.create_collection("telemetry_example")
        await store.add(
            "telemetry_example", [MemoryRecord(content="I can't eat spicy food", scope=scope)]
        )
        for said in ("order me dinner", "and a dessert"):  # the second turn's is printed
            exporter.clear()
            with tracer.start_as_current_span("turn"):
                await store.recall("telemetry_example", MemoryScope(user_id="alice"), query=said)
                await store.add("telemetry_example", [MemoryRecord(content=said, scope=scope)])
    tree(list(exporter.get_finished_spans()))


if __name__ == "__main__":
    asyncio.run(main())
