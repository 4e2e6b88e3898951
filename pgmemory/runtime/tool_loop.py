"""The tool loop of one agent run, and what a run produces.

The loop sends the system message (the context's instructions), the request messages and the
tools to the model; while the model asks for tools it calls them (in parallel) and calls the
model again, at most ``max_tool_iterations`` rounds. After that many rounds the model is asked
once more with tool choice ``"none"``; if it still asks for tools, :class:`ToolLoopLimitError`
is raised. A call to a declaration-only tool (no function) ends the loop: the caller answers it.

:func:`tool_loop` is the one implementation: an async generator that yields
:class:`AgentResponseUpdate` pieces and, last, the :class:`AgentResponse`. ``Agent.run``
drains it; ``Agent.run_stream`` forwards it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from pgmemory.errors import ToolLoopLimitError
from pgmemory.runtime.chat import ChatClient, ChatResponse, ChatResponseUpdate, ToolChoice
from pgmemory.runtime.messages import FunctionCallContent, FunctionResultContent, Message
from pgmemory.runtime.providers import SessionContext
from pgmemory.runtime.responses import AgentResponse, AgentResponseUpdate
from pgmemory.runtime.tools import Tool

# Tool failures are reported on the agent's logger, where they have always been.
logger = logging.getLogger("pgmemory.runtime.agent")


async def tool_loop(
    client: ChatClient,
    context: SessionContext,
    *,
    stream: bool,
    tool_choice: ToolChoice | None,
    response_format: Any,
    options: Mapping[str, Any],
    max_tool_iterations: int,
    author_name: str | None = None,
) -> AsyncGenerator[AgentResponseUpdate | AgentResponse, None]:
    """Run the model and the tools it asks for until it answers.

    Args:
        client: the chat model.
        context: the run's context, as the providers left it (instructions, request messages,
            tools, session id).
        stream: ask the model for a streamed reply and yield its text deltas and function
            calls as they arrive; otherwise one complete reply per round.
        tool_choice: the tool choice of every round but the one after the last allowed.
        response_format: structured output to request; its parsed value becomes
            ``AgentResponse.value``.
        options: request options for every model call.
        max_tool_iterations: how many rounds of tool calls are allowed.
        author_name: stamped on assistant messages that carry no author name.

    Yields:
        :class:`AgentResponseUpdate` pieces (streamed model output if ``stream``, and the
        results of every tool round), then the final :class:`AgentResponse`.

    Raises:
        ToolLoopLimitError: the model still asked for tools after ``max_tool_iterations``
            rounds and one more call with tool choice ``"none"``.
    """
    tools = {t.name: t for t in context.tools}
    produced: list[Message] = []
    usage: dict[str, int] = {}
    rounds = 0
    while True:
        last_round = rounds >= max_tool_iterations
        messages = _model_messages(context, produced)
        request: dict[str, Any] = {
            "tools": list(tools.values()),
            "tool_choice": "none" if last_round and tools else tool_choice,
            "response_format": response_format,
            "options": options,
        }
        if stream:
            updates: list[ChatResponseUpdate] = []
            async for update in client.get_streaming_response(messages, **request):
                updates.append(update)
                if update.text or update.function_calls:
                    yield AgentResponseUpdate(
                        text=update.text,
                        contents=list(update.function_calls),
                        message_id=update.message_id,
                    )
            reply = ChatResponse.from_updates(updates)
            if response_format is not None and not reply.function_calls:
                reply.value = client.parse_structured(reply.text, response_format)
        else:
            reply = await client.get_response(messages, **request)
        _add_usage(usage, reply.usage)
        produced.extend(_named(m, author_name) for m in reply.messages)
        calls = reply.function_calls
        if not calls or _declaration_only(calls, tools):
            yield AgentResponse(
                produced, value=reply.value, usage=usage, session_id=context.session_id
            )
            return
        if last_round:
            raise ToolLoopLimitError(
                f"the model still asked for tools ({', '.join(c.name for c in calls)}) after "
                f"{max_tool_iterations} rounds; raise max_tool_iterations=... or check the tools"
            )
        rounds += 1
        results = await _run_tools(calls, tools)
        produced.extend(results)
        for message in results:
            yield AgentResponseUpdate(
                contents=list(message.contents), role="tool", message_id=message.message_id
            )


async def _run_tools(
    calls: Sequence[FunctionCallContent], tools: Mapping[str, Tool]
) -> list[Message]:
    """Answer ``calls`` in parallel: one ``tool`` message per call, in the calls' order.

    An unknown tool, invalid arguments or a tool that raises becomes an error result the model
    sees; nothing here raises.
    """
    return list(await asyncio.gather(*(_call_tool(c, tools) for c in calls)))


async def _call_tool(call: FunctionCallContent, tools: Mapping[str, Tool]) -> Message:
    tool = tools.get(call.name)
    if tool is None:
        result = FunctionResultContent(
            call.call_id,
            error=f"unknown tool {call.name!r}; available tools: {', '.join(sorted(tools)) or 'none'}",
        )
    else:
        try:
            value = await tool.invoke(call.parse_arguments())
            result = FunctionResultContent(call.call_id, result=value)
        except Exception as exc:  # the model sees the failure and may recover
            logger.warning("tool %r failed: %s", call.name, type(exc).__name__)
            result = FunctionResultContent(call.call_id, error=f"{type(exc).__name__}: {exc}")
    return Message("tool", contents=[result])


def _model_messages(context: SessionContext, produced: Sequence[Message]) -> list[Message]:
    system = [Message("system", context.instructions)] if context.instructions else []
    return [*system, *context.request_messages, *produced]


def _declaration_only(calls: Sequence[FunctionCallContent], tools: Mapping[str, Tool]) -> bool:
    return any(tools.get(c.name) is not None and tools[c.name].fn is None for c in calls)


def _named(message: Message, author_name: str | None) -> Message:
    if author_name and message.role == "assistant" and not message.author_name:
        return message.replace(author_name=author_name)
    return message


def _add_usage(total: dict[str, int], usage: Mapping[str, int]) -> None:
    for key, value in usage.items():
        total[key] = total.get(key, 0) + int(value)


__all__ = ["AgentResponse", "AgentResponseUpdate", "tool_loop"]
