"""Messages: contents, source stamping (copies only) and the JSON round trip."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.messages import (
    FunctionCallContent,
    FunctionResultContent,
    Message,
    TextContent,
    as_messages,
    external_only,
    filter_by_source,
)


def test_short_form_defaults() -> None:
    m = Message("user", "hello")
    assert m.text == "hello"
    assert m.source_type == "external" and m.source_id is None
    assert len(m.message_id) == 36
    assert m.created_at.tzinfo is not None


def test_with_source_returns_a_stamped_copy_and_leaves_the_original() -> None:
    original = Message("user", "hi", author_name="alice")
    stamped = original.with_source("context_provider", "memory", origin_session_id="s1")
    assert (original.source_type, original.source_id, original.origin_session_ids) == (
        "external",
        None,
        (),
    )
    assert (stamped.source_type, stamped.source_id, stamped.origin_session_ids) == (
        "context_provider",
        "memory",
        ("s1",),
    )
    assert stamped.message_id == original.message_id and stamped.text == "hi"
    with pytest.raises(AttributeError):
        original.role = "system"  # type: ignore[misc]


def test_round_trip_is_exact_and_json_native() -> None:
    m = Message(
        "assistant",
        "Let me look.",
        contents=[
            FunctionCallContent("c1", "GetMenu", {"kind": "热菜"}),
        ],
        author_name="waiter",
        created_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        source_type="chat_history",
        source_id="history",
        origin_session_ids=["s-1"],
        metadata={"k": [1, 2]},
    )
    data = json.loads(json.dumps(m.to_dict()))
    again = Message.from_dict(data)
    assert again == m
    assert again.function_calls[0].parse_arguments() == {"kind": "热菜"}
    result = Message("tool", contents=[FunctionResultContent("c1", result={"dishes": 7})])
    assert Message.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert result.function_results[0].text == '{"dishes": 7}'


def test_from_dict_accepts_role_and_text_only() -> None:
    m = Message.from_dict({"role": "user", "text": "hey"})
    assert m.text == "hey" and m.contents == (TextContent("hey"),)


def test_bad_values_are_named() -> None:
    with pytest.raises(InvalidInputError, match="'robot'"):
        Message("robot", "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="'somewhere'"):
        Message("user", "x").with_source("somewhere")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        FunctionCallContent("c", "f", "{oops").parse_arguments()
    with pytest.raises(
        InvalidInputError, match="item 0 is of type int; pass a str, a Message, a mapping"
    ):
        as_messages([3])  # type: ignore[list-item]


def test_blank_and_filters() -> None:
    blank = Message("assistant", "  ")
    assert blank.is_blank
    mixed = [
        Message("user", "a"),
        Message("user", "b").with_source("context_provider", "p"),
        Message("user", "c").with_source("chat_history", "h"),
    ]
    assert [m.text for m in external_only(mixed)] == ["a"]
    assert [m.text for m in filter_by_source(mixed, ["chat_history", "context_provider"])] == [
        "b",
        "c",
    ]


def test_as_messages_forms() -> None:
    m = Message("system", "rules")
    assert [x.text for x in as_messages("hi")] == ["hi"]
    assert as_messages(m) == [m]
    assert [x.role for x in as_messages(["a", m])] == ["user", "system"]
