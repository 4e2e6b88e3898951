"""What is stored for a framework message, and which stored rows recall leaves out as tool
traffic (tagged rows, and untagged rows written before the tag)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from agent_framework import Content, Message

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from pgmemory.integrations.agent_framework.rendering import TOOL_KIND, render, tool_kind
from pgmemory.text.clean import readable_json
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


def test_escaped_json_results_and_arguments_are_rendered_readable_and_nothing_else_changes() -> (
    None
):
    """What agent-framework makes of a tool's non-str result (``json.dumps`` defaults: every
    non-ASCII character escaped) is stored as readable UTF-8 JSON, the same value; text that is
    not exactly that form is kept as it came."""
    menu = ["番茄炒蛋", {"note": 'say "hi"\\ 😀'}]
    escaped = json.dumps(menu)
    readable = json.dumps(menu, ensure_ascii=False)
    assert "\\u" in escaped and readable_json(escaped) == readable
    assert json.loads(readable_json(escaped)) == menu
    result = Message("tool", [Content.from_function_result("c1", result=escaped)])
    assert render(result) == f"[tool result: {readable}]"
    call = Message("assistant", [Content.from_function_call("c1", "Order", arguments=escaped)])
    assert render(call) == f"[called Order with {readable}]"
    for kept in (
        "plain text with a \\u00e9 in it",  # not JSON
        '{"a":"\\u00e9"}',  # JSON, but not json.dumps' own spacing: kept as written
        json.dumps(["\ud800"]),  # a lone surrogate has no readable (UTF-8) form
        "[" * 100_000 + '"\\u00e9"' + "]" * 100_000,  # nested past what json reads
        readable,
    ):
        assert readable_json(kept) == kept


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
