"""What is stored for a framework message, and which stored rows recall leaves out as tool
traffic (tagged rows, and untagged rows written before the tag)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_framework import Content, Message

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from pgmemory.integrations.agent_framework.rendering import TOOL_KIND, render, tool_kind
from tests.conftest import unique

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_render_keeps_text_calls_and_results() -> None:
    call = Message("assistant", [Content.from_function_call("c1", "GetMenu", arguments={})])
    result = Message("tool", [Content.from_function_result("c1", result=["番茄炒蛋"])])
    said = Message("assistant", ["已为您下单。"])
    assert render(call) == "[called GetMenu with {}]"
    assert "番茄炒蛋" in render(result) and render(result).startswith("[tool result: ")
    assert render(said) == "已为您下单。"
    assert render(call, skip_call_ids={"c1"}) == ""
    assert (tool_kind(call), tool_kind(result), tool_kind(said)) == ("call", "result", None)


async def test_recall_leaves_tool_rows_out_tagged_or_not(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=unique("tools"))
    rows = [
        ("anything", "assistant", {TOOL_KIND: "call"}),
        ("[tool result: ok]", "tool", {}),
        # Rows stored before the tag: an assistant row of tool-call (or result) lines only.
        ('[called GetMenu with {}]\n[called PlaceOrder with {"a": 1}]', "assistant", {}),
        ("[tool result: 3 dishes]", "assistant", {}),
        ("I [called] my mum", "assistant", {}),
        ("[called GetMenu with {}]", "user", {}),
        ("Here you go.\n[called GetMenu with {}]", "assistant", {}),
    ]
    await store.add(
        collection,
        [
            MemoryRecord(
                content=c, role=r, metadata=m, scope=scope, created_at=T0 + timedelta(minutes=i)
            )
            for i, (c, r, m) in enumerate(rows)
        ],
    )
    shown = await store.recall(collection, scope, query="called", recent_turns=0, max_results=20)
    kept = {item.memory.content for item in shown.items}
    assert kept == {
        "I [called] my mum",
        "[called GetMenu with {}]",
        "Here you go.\n[called GetMenu with {}]",
    }
    everything = await store.recall(
        collection, scope, query="called", recent_turns=0, max_results=20, include_tools=True
    )
    assert len(everything.items) == len(rows)
