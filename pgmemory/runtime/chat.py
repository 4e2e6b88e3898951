"""What a chat client is: the protocol the agent and the reducers call, and its reply types.

:class:`~pgmemory.runtime.openai_client.OpenAIChatClient` is the implementation pgmemory ships;
anything with the same methods can stand in for it. ``Agent.run`` and the reducers call only
``get_response``; ``Agent.run_stream`` calls ``get_streaming_response``, and
``parse_structured`` when the run asks for a ``response_format``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from pgmemory.runtime.messages import FunctionCallContent, Message, TextContent
from pgmemory.runtime.tools import Tool

#: ``"auto"`` (default), ``"none"``, ``"required"``, or the name of one tool the model must call.
ToolChoice: TypeAlias = Literal["auto", "none", "required"] | str


@dataclass(slots=True)
class ChatResponse:
    """One model reply: normally a single assistant message (text and/or function calls).

    ``value`` holds the parsed structured output when a ``response_format`` was requested.
    ``usage`` is the token count the server reported (``prompt_tokens``, ``completion_tokens``,
    ``total_tokens``), if any.
    """

    messages: list[Message]
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    value: Any = None
    response_id: str | None = None

    @property
    def text(self) -> str:
        """Text of the reply's messages, joined with newlines."""
        return "\n".join(m.text for m in self.messages if m.text)

    @property
    def function_calls(self) -> list[FunctionCallContent]:
        """Every function call the reply asks for."""
        return [c for m in self.messages for c in m.function_calls]

    @classmethod
    def from_updates(cls, updates: Iterable[ChatResponseUpdate]) -> ChatResponse:
        """Assemble the complete reply from streamed updates."""
        text_parts: list[str] = []
        calls: list[FunctionCallContent] = []
        finish_reason = model = response_id = None
        usage: dict[str, int] = {}
        message_id: str | None = None
        author_name: str | None = None
        for update in updates:
            text_parts.append(update.text)
            calls.extend(update.function_calls)
            finish_reason = update.finish_reason or finish_reason
            model = update.model or model
            response_id = update.response_id or response_id
            message_id = message_id or update.message_id
            author_name = author_name or update.author_name
            if update.usage:
                usage = dict(update.usage)
        text = "".join(text_parts)
        contents: list[Any] = [TextContent(text)] if text else []
        contents.extend(calls)
        message = Message(
            "assistant", contents=contents, message_id=message_id, author_name=author_name
        )
        return cls(
            messages=[message],
            finish_reason=finish_reason,
            model=model,
            usage=usage,
            response_id=response_id,
        )


@dataclass(slots=True)
class ChatResponseUpdate:
    """A piece of a streamed reply: a text delta, and/or complete function calls (sent once
    their arguments have fully arrived), and on the last piece the finish reason and usage."""

    text: str = ""
    function_calls: list[FunctionCallContent] = field(default_factory=list)
    finish_reason: str | None = None
    model: str | None = None
    usage: dict[str, int] | None = None
    response_id: str | None = None
    message_id: str | None = None
    author_name: str | None = None


@runtime_checkable
class ChatClient(Protocol):
    """A chat model the agent can call."""

    async def get_response(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice | None = None,
        response_format: Any = None,
        options: Mapping[str, Any] | None = None,
    ) -> ChatResponse:
        """Send ``messages`` (and the tools the model may call) and return the reply."""
        ...

    def get_streaming_response(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice | None = None,
        response_format: Any = None,
        options: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[ChatResponseUpdate]:
        """Like :meth:`get_response`, yielding the reply as it is generated.

        A streamed reply carries no parsed structured output: the agent assembles the reply
        (:meth:`ChatResponse.from_updates`) and calls :meth:`parse_structured` on its text.
        """
        ...

    def parse_structured(self, text: str, response_format: Any) -> Any:
        """Parse a reply's text into ``response_format``, as :meth:`get_response` fills
        ``ChatResponse.value``.

        Args:
            text: the reply's text.
            response_format: what was requested (a pydantic model, any type pydantic
                validates, or a raw ``response_format`` dict).

        Returns:
            The parsed value (``None`` for a format that is not parsed, such as ``"text"``).

        Raises:
            StructuredOutputError: the text does not match the format.
        """
        ...


__all__ = ["ChatClient", "ChatResponse", "ChatResponseUpdate", "ToolChoice"]
