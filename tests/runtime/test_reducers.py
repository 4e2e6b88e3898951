"""Reducers: system messages stay, tool calls never lose their results, summaries fold turns."""

from __future__ import annotations

import pytest

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.messages import FunctionCallContent, FunctionResultContent, Message
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.reducers import (
    SUMMARY_FLAG,
    MessageCountingReducer,
    SummarizingReducer,
    group_units,
)
from tests.openai_server import OpenAIServer, text


def conversation() -> list[Message]:
    return [
        Message("system", "rules"),
        Message("user", "u1"),
        Message("assistant", "a1"),
        Message("user", "what is on the menu and the weather?"),
        Message(
            "assistant",
            contents=[
                FunctionCallContent("c1", "GetMenu", "{}"),
                FunctionCallContent("c2", "Weather", "{}"),
            ],
        ),
        Message("tool", contents=[FunctionResultContent("c1", "menu")]),
        Message("tool", contents=[FunctionResultContent("c2", "sunny")]),
        Message("assistant", "a2"),
    ]


def _calls_have_results(messages: list[Message]) -> bool:
    calls = {c.call_id for m in messages for c in m.function_calls}
    results = {r.call_id for m in messages for r in m.function_results}
    return calls == results


def test_group_units_keeps_parallel_results_with_their_call() -> None:
    units = group_units(conversation()[1:])
    assert [len(u) for u in units] == [1, 1, 1, 3, 1]


@pytest.mark.parametrize("target", [1, 2, 3, 4, 5, 6, 7])
async def test_counting_reducer_never_splits_tool_pairs(target: int) -> None:
    reduced = await MessageCountingReducer(target).reduce(conversation())
    assert reduced[0].text == "rules"
    assert _calls_have_results(reduced)
    assert reduced[-1].text == "a2"
    non_system = [m for m in reduced if m.role != "system"]
    assert len(non_system) <= max(target, 1)


async def test_counting_reducer_exact_cut() -> None:
    reduced = await MessageCountingReducer(4).reduce(conversation())
    # the 3-message tool exchange and the final answer fit; the question before does not
    assert [m.role for m in reduced] == ["system", "assistant", "tool", "tool", "assistant"]
    reduced = await MessageCountingReducer(3).reduce(conversation())
    assert [m.text for m in reduced] == ["rules", "a2"]  # the tool exchange does not fit whole


async def test_counting_reducer_drops_orphan_results_and_keeps_short_histories() -> None:
    msgs = [
        Message("tool", contents=[FunctionResultContent("gone", "x")]),
        Message("assistant", "a"),
    ]
    assert [m.text for m in await MessageCountingReducer(5).reduce(msgs)] == [
        "",
        "a",
    ]  # short: untouched
    assert [m.text for m in await MessageCountingReducer(1).reduce(msgs)] == ["a"]
    with pytest.raises(InvalidInputError, match="target=0"):
        MessageCountingReducer(0)


async def test_summarizing_reducer_folds_older_turns(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    reducer = SummarizingReducer(chat_client, target=2, threshold=1)
    short = conversation()[:4]
    assert await reducer.reduce(short) == short  # 3 non-system <= 2 + 1: nothing to do
    assert openai_server.requests == []

    openai_server.queue(text("Earlier: the user asked about menu and weather; menu given; sunny."))
    reduced = await reducer.reduce(conversation())
    assert [m.role for m in reduced] == ["system", "assistant", "assistant"]
    summary = reduced[1]
    assert summary.metadata[SUMMARY_FLAG] is True and summary.text.startswith("Earlier:")
    assert reduced[2].text == "a2"
    prompt = openai_server.last_request["messages"]
    assert prompt[0]["role"] == "system"
    assert "GetMenu" in prompt[1]["content"] and "tool result: sunny" in prompt[1]["content"]

    # a later reduction merges the earlier summary
    openai_server.queue(text("Merged summary."))
    longer = [*reduced, Message("user", "u3"), Message("assistant", "a3"), Message("user", "u4")]
    again = await reducer.reduce(longer)
    assert [m.text for m in again] == ["rules", "Merged summary.", "a3", "u4"]
    assert "[earlier summary] Earlier:" in openai_server.last_request["messages"][1]["content"]
