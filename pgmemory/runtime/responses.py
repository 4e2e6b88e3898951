"""What a run returns: the whole response, or its streamed updates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pgmemory.runtime.messages import Content, Message


@dataclass(slots=True)
class AgentResponse:
    """The outcome of one run.

    ``messages`` are every message the agent produced, in order: assistant messages that call
    tools, the tool results, and the final answer. ``text`` is the final answer's text.
    ``value`` is the parsed structured output when the run asked for a ``response_format``.
    """

    messages: list[Message]
    value: Any = None
    usage: dict[str, int] = field(default_factory=dict)
    session_id: str | None = None

    @property
    def text(self) -> str:
        """The text of the last assistant message ('' if there is none)."""
        for message in reversed(self.messages):
            if message.role == "assistant" and message.text:
                return message.text
        return ""

    def __str__(self) -> str:
        return self.text


@dataclass(slots=True)
class AgentResponseUpdate:
    """A piece of a streamed run: a text delta of an assistant message, or contents (function
    calls the model made, results of tools the agent ran)."""

    text: str = ""
    contents: list[Content] = field(default_factory=list)
    role: str = "assistant"
    message_id: str | None = None

    def __str__(self) -> str:
        return self.text
