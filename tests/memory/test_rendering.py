"""What is stored for a framework message, and which stored rows recall leaves out as tool
traffic (tagged rows, and untagged rows written before the tag)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from agent_framework import Content, Message

from pgmemory import MemoryScope
from pgmemory.integrations.agent_framework.rendering import (
    TOOL_KIND,
    is_tool_memory,
    render,
    tool_kind,
)
from pgmemory.store.records import Memory


def stored(content: str, role: str = "assistant", **metadata: Any) -> Memory:
    return Memory(
        id=uuid.uuid4(),
        collection="c",
        scope=MemoryScope(user_id="u"),
        role=role,
        content=content,
        author_name=None,
        message_id=None,
        source_type="external",
        source_id=None,
        embedding_model="m",
        created_at=datetime.now(UTC),
        expires_at=None,
        metadata=dict(metadata),
    )


def test_render_keeps_text_calls_and_results() -> None:
    call = Message("assistant", [Content.from_function_call("c1", "GetMenu", arguments={})])
    result = Message("tool", [Content.from_function_result("c1", result=["番茄炒蛋"])])
    said = Message("assistant", ["已为您下单。"])
    assert render(call) == "[called GetMenu with {}]"
    assert "番茄炒蛋" in render(result) and render(result).startswith("[tool result: ")
    assert render(said) == "已为您下单。"
    assert render(call, skip_call_ids={"c1"}) == ""
    assert (tool_kind(call), tool_kind(result), tool_kind(said)) == ("call", "result", None)


def test_tool_rows_are_recognised_tagged_or_not() -> None:
    assert is_tool_memory(stored("anything", **{TOOL_KIND: "call"}))
    assert is_tool_memory(stored("[tool result: ok]", role="tool"))
    # Rows stored before the tag: an assistant row made only of tool-call lines.
    assert is_tool_memory(stored('[called GetMenu with {}]\n[called PlaceOrder with {"a": 1}]'))
    assert not is_tool_memory(stored("I [called] my mum"))
    assert not is_tool_memory(stored("[called GetMenu with {}]", role="user"))
    assert not is_tool_memory(stored("Here you go.\n[called GetMenu with {}]"))
