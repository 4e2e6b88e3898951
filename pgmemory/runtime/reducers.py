"""Chat reducers keep a conversation's history within the model's context window.

A reducer takes the history and returns a shorter one. A history provider runs it either after
messages are added (the stored history shrinks) or before messages are retrieved (storage keeps
everything; only what the model sees shrinks); see ``reducer_trigger`` on the history providers.

Both reducers here keep every system message, and treat an assistant message that calls tools
together with the tool messages answering it as one unit that is kept or dropped whole, so the
model never sees a tool result without its call (which the OpenAI API rejects).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.messages import Message

#: When a history provider runs its reducer.
ReducerTrigger: TypeAlias = Literal["after_messages_added", "before_messages_retrieved"]
REDUCER_TRIGGERS: tuple[str, ...] = ("after_messages_added", "before_messages_retrieved")

#: Metadata flag set on the message a :class:`SummarizingReducer` writes.
SUMMARY_FLAG = "pgmemory.summary"

DEFAULT_SUMMARY_PROMPT = (
    "Summarize the conversation below for the assistant that continues it. Keep names, facts, "
    "preferences, decisions, open questions and the results of tool calls; drop small talk. "
    "If it starts with an earlier summary, merge that summary in. Write plain prose, at most a "
    "few short paragraphs, in the conversation's language."
)


@runtime_checkable
class ChatReducer(Protocol):
    """Anything with ``async reduce(messages) -> list[Message]``."""

    async def reduce(self, messages: Sequence[Message]) -> list[Message]: ...


def group_units(messages: Sequence[Message]) -> list[list[Message]]:
    """Split non-system messages into units: a tool-calling assistant message plus the
    messages answering its calls form one unit; every other message is a unit by itself."""
    units: list[list[Message]] = []
    open_calls: set[str] = set()
    for message in messages:
        results = {r.call_id for r in message.function_results}
        if results and units and open_calls & results:
            units[-1].append(message)
            open_calls -= results
            continue
        units.append([message])
        open_calls = {c.call_id for c in message.function_calls}
    return units


def _check_count(name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidInputError(f"{name}={value!r} must be an integer >= {minimum}")
    return value


def _split_recent(
    non_system: Sequence[Message], target: int
) -> tuple[list[Message], list[Message]]:
    """(older, recent): recent is the newest whole units holding at most ``target`` messages,
    but always at least the newest unit."""
    units = group_units(non_system)
    kept: list[list[Message]] = []
    count = 0
    for unit in reversed(units):
        if kept and count + len(unit) > target:
            break
        kept.append(unit)
        count += len(unit)
    kept.reverse()
    # A tool result whose call is already gone would be refused by the API: drop it too.
    while len(kept) > 1 and not kept[0][0].function_calls and kept[0][0].function_results:
        kept.pop(0)
    recent = [m for unit in kept for m in unit]
    older = [m for unit in units[: len(units) - len(kept)] for m in unit]
    return older, recent


class MessageCountingReducer:
    """Keep the system messages and the newest ``target`` other messages.

    Tool calls and their results are kept or dropped together, so the result may hold fewer
    than ``target`` messages (or, when the newest tool exchange alone is larger, more).
    """

    def __init__(self, target: int) -> None:
        self.target = _check_count("target", target, 1)

    async def reduce(self, messages: Sequence[Message]) -> list[Message]:
        non_system = [m for m in messages if m.role != "system"]
        if len(non_system) <= self.target:
            return list(messages)
        _, recent = _split_recent(non_system, self.target)
        keep = {id(m) for m in recent}
        return [m for m in messages if m.role == "system" or id(m) in keep]

    def __repr__(self) -> str:
        return f"MessageCountingReducer(target={self.target})"


def _transcript(messages: Sequence[Message]) -> str:
    lines: list[str] = []
    for m in messages:
        if m.metadata.get(SUMMARY_FLAG):
            lines.append(f"[earlier summary] {m.text}")
            continue
        who = m.role + (f" ({m.author_name})" if m.author_name else "")
        if m.text:
            lines.append(f"{who}: {m.text}")
        for call in m.function_calls:
            lines.append(f"{who} called {call.name}({call.arguments})")
        for result in m.function_results:
            lines.append(f"tool result: {result.text}")
    return "\n".join(lines)


class SummarizingReducer:
    """Fold older turns into one summary message written by the chat client.

    Nothing happens until the non-system messages exceed ``target + threshold``; then all but
    the newest ``target`` (whole tool exchanges kept together) are summarized, together with
    any earlier summary. The result is: the system messages, one assistant message flagged
    ``metadata["pgmemory.summary"] = True`` holding the summary, then the recent messages.
    The summary is assistant-authored text, not instructions (it quotes user content).
    """

    def __init__(
        self,
        client: Any,
        target: int,
        threshold: int = 0,
        *,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
    ) -> None:
        if not hasattr(client, "get_response"):
            raise InvalidInputError(
                f"client {client!r} has no get_response(); pass a chat client such as OpenAIChatClient"
            )
        self.client = client
        self.target = _check_count("target", target, 1)
        self.threshold = _check_count("threshold", threshold, 0)
        self.prompt = prompt

    async def reduce(self, messages: Sequence[Message]) -> list[Message]:
        system = [m for m in messages if m.role == "system"]
        non_system = [m for m in messages if m.role != "system"]
        if len(non_system) <= self.target + self.threshold:
            return list(messages)
        older, recent = _split_recent(non_system, self.target)
        if not older:
            return list(messages)
        response = await self.client.get_response(
            [Message("system", self.prompt), Message("user", _transcript(older))]
        )
        summary_text = response.text.strip()
        if not summary_text:
            return list(messages)
        summary = Message(
            "assistant",
            summary_text,
            created_at=older[-1].created_at,
            metadata={SUMMARY_FLAG: True, "summarized_messages": len(older)},
        )
        return [*system, summary, *recent]

    def __repr__(self) -> str:
        return f"SummarizingReducer(target={self.target}, threshold={self.threshold})"


def check_trigger(trigger: object) -> ReducerTrigger:
    """Validate a ``reducer_trigger`` value."""
    if trigger not in REDUCER_TRIGGERS:
        raise InvalidInputError(
            f"reducer_trigger {trigger!r} is not one of {', '.join(REDUCER_TRIGGERS)}"
        )
    return trigger  # type: ignore[return-value]


__all__ = [
    "DEFAULT_SUMMARY_PROMPT",
    "REDUCER_TRIGGERS",
    "SUMMARY_FLAG",
    "ChatReducer",
    "MessageCountingReducer",
    "ReducerTrigger",
    "SummarizingReducer",
    "check_trigger",
    "group_units",
]
