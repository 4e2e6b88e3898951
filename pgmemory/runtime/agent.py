"""The agent: a chat client, instructions, tools and an ordered list of context providers.

One run:

1. the caller's input becomes ``external`` messages in a fresh :class:`SessionContext`;
2. every provider's ``before_run`` runs in list order (each sees what earlier ones added);
3. the model is called with the system message (instructions), the request messages and the
   tools; while it asks for tools, the agent calls them (in parallel) and calls the model again,
   at most ``max_tool_iterations`` rounds (:mod:`pgmemory.runtime.tool_loop`, the same loop
   for :meth:`Agent.run` and :meth:`Agent.run_stream`);
4. every provider's ``after_run`` runs in list order with the response, inside the providers'
   units of work (:meth:`ContextProvider.unit_of_work`): if any of them fails, every unit rolls
   back (the turn is stored whole or not at all) and :class:`AfterRunError` is raised; or, if
   the model call failed, every ``after_run`` runs with ``context.exception`` set (default
   providers then store nothing), after which the exception propagates.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, aclosing
from types import TracebackType
from typing import Any

from pgmemory.errors import InvalidInputError, PgMemoryError
from pgmemory.runtime.chat import ChatClient, ToolChoice
from pgmemory.runtime.history import HistoryProvider, InMemoryHistoryProvider
from pgmemory.runtime.messages import AgentInput, as_messages
from pgmemory.runtime.providers import ContextProvider, SessionContext
from pgmemory.runtime.responses import AgentResponse, AgentResponseUpdate
from pgmemory.runtime.session import AgentSession
from pgmemory.runtime.tool_loop import tool_loop
from pgmemory.runtime.tools import Tool, ToolLike, as_tools, merge_tools

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOOL_ITERATIONS = 10


class AfterRunError(PgMemoryError):
    """One or more providers' ``after_run`` failed after the model had answered.

    Every provider's ``after_run`` still ran, inside the providers' units of work, which were
    then rolled back: what the database-backed providers would have stored of the turn is not
    kept, so a retried run stores it once. ``errors`` holds each failure as (provider source
    id, exception), in provider order, and ``response`` the model's answer, so the caller can
    still use it. The message names only providers, exception types and counts: the
    exceptions' own messages may carry user text, so they are left to ``errors``.
    """

    def __init__(self, response: AgentResponse, errors: list[tuple[str, Exception]]) -> None:
        self.response = response
        self.errors = errors
        details = "; ".join(f"{source}: {type(exc).__name__}" for source, exc in errors)
        super().__init__(
            f"{len(errors)} context provider failure(s) after the model answered ({details}); "
            "every provider's after_run ran and their units of work were rolled back; the "
            "answer is in this error's .response and the exceptions in .errors"
        )


def _check_iterations(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"max_tool_iterations={value!r} must be an integer >= 1")
    return value


class Agent:
    """An LLM agent with tools and context providers.

    ``client`` is a chat client (:class:`~pgmemory.runtime.openai_client.OpenAIChatClient`),
    ``instructions`` the system prompt, ``tools`` plain callables or :class:`Tool` objects,
    ``context_providers`` hooks run in order around every model call. Without a provider that
    loads history, an :class:`InMemoryHistoryProvider` is put first.
    """

    def __init__(
        self,
        client: ChatClient,
        instructions: str | None = None,
        *,
        name: str | None = None,
        tools: Sequence[ToolLike] = (),
        context_providers: Sequence[ContextProvider] = (),
        max_tool_iterations: int = DEFAULT_MAX_TOOL_ITERATIONS,
        tool_choice: ToolChoice | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not hasattr(client, "get_response"):
            raise InvalidInputError(f"client {client!r} is not a chat client (no get_response())")
        if instructions is not None and not isinstance(instructions, str):
            raise InvalidInputError(
                f"instructions must be a string, got {type(instructions).__name__}"
            )
        _check_iterations(max_tool_iterations)
        self.client = client
        self.instructions = instructions
        self.name = name
        self.tools: list[Tool] = as_tools(tools)
        self.max_tool_iterations = max_tool_iterations
        self.tool_choice = tool_choice
        self.options: dict[str, Any] = dict(options or {})
        self.context_providers: list[ContextProvider] = self._check_providers(context_providers)

    @staticmethod
    def _check_providers(providers: Sequence[ContextProvider]) -> list[ContextProvider]:
        result = list(providers)
        for provider in result:
            if not isinstance(provider, ContextProvider):
                raise InvalidInputError(
                    f"context provider {provider!r} does not derive from ContextProvider"
                )
        loaders = [p for p in result if isinstance(p, HistoryProvider) and p.load_messages]
        if len(loaders) > 1:
            names = ", ".join(repr(p.source_id) for p in loaders)
            raise InvalidInputError(
                f"history providers {names} all load messages; only one may. Pass "
                "load_messages=False to the others (they will still record the conversation)"
            )
        if not loaders:
            result.insert(0, InMemoryHistoryProvider())
        for attr in ("source_id", "state_key"):
            seen: dict[str, ContextProvider] = {}
            for provider in result:
                value = getattr(provider, attr)
                if value in seen:
                    raise InvalidInputError(
                        f"context providers {seen[value]!r} and {provider!r} share {attr} {value!r}; "
                        f"give one a distinct {attr}=..."
                    )
                seen[value] = provider
        return result

    # -- sessions --------------------------------------------------------------------------

    def create_session(self, session_id: str | None = None) -> AgentSession:
        """A new, empty session (``session_id`` defaults to a new UUID)."""
        return AgentSession(session_id)

    def deserialize_session(self, data: Mapping[str, Any] | str) -> AgentSession:
        """Rebuild a session from ``session.to_dict()`` output or its JSON text."""
        return AgentSession.from_dict(data)

    # -- running ---------------------------------------------------------------------------

    def _state_for(self, session: AgentSession, provider: ContextProvider) -> dict[str, Any]:
        state = session.state.setdefault(provider.state_key, {})
        if not isinstance(state, dict):
            raise InvalidInputError(
                f"session.state[{provider.state_key!r}] is a {type(state).__name__}, but provider "
                f"{provider!r} keeps a dict there; give the provider another state_key"
            )
        return state

    async def _prepare(
        self, input: Any, session: AgentSession | None, tools: Sequence[ToolLike]
    ) -> tuple[AgentSession, SessionContext]:
        if session is None:
            session = self.create_session()
        elif not isinstance(session, AgentSession):
            raise InvalidInputError(
                f"session must be an AgentSession (agent.create_session()), got {session!r}"
            )
        messages = as_messages(input)
        if not messages:
            raise InvalidInputError(
                "agent input is empty; pass a string, a Message, a mapping such as "
                "{'role': 'user', 'content': '...'}, or a list of those"
            )
        run_tools = merge_tools(self.tools, as_tools(tools))
        context = SessionContext(
            session_id=session.session_id,
            input_messages=messages,
            instructions=self.instructions,
            tools=run_tools,
        )
        for provider in self.context_providers:
            await provider.before_run(
                agent=self,
                session=session,
                context=context,
                state=self._state_for(session, provider),
            )
        return session, context

    async def _finish(self, session: AgentSession, context: SessionContext) -> None:
        """Every provider's after_run inside the providers' units of work: all kept, or none.

        Every after_run runs even when an earlier one fails; then, if anything failed (a hook,
        or entering or leaving a unit of work), every unit is left with the error (rolled
        back) and :class:`AfterRunError` is raised.
        """
        errors: list[tuple[str, Exception]] = []
        try:
            async with AsyncExitStack() as units:
                for provider in self.context_providers:
                    try:
                        unit = provider.unit_of_work(context)
                        if unit is not None:
                            await units.enter_async_context(
                                _TrackedUnit(provider.source_id, unit, errors)
                            )
                    except Exception as exc:
                        errors.append((provider.source_id, exc))
                for provider in self.context_providers:
                    try:
                        await provider.after_run(
                            agent=self,
                            session=session,
                            context=context,
                            state=self._state_for(session, provider),
                        )
                    except Exception as exc:
                        errors.append((provider.source_id, exc))
                if errors:
                    raise _RollBack
        except _RollBack:
            pass
        except Exception as exc:
            if not any(exc is known for _, known in errors):
                errors.append(("unit of work", exc))
        if errors:
            assert context.response is not None
            # Not chained to the causes: their messages may carry user text (see AfterRunError).
            raise AfterRunError(context.response, errors) from None

    async def _fail(
        self, session: AgentSession, context: SessionContext, exc: BaseException
    ) -> None:
        context.exception = exc
        for provider in self.context_providers:
            try:
                await provider.after_run(
                    agent=self,
                    session=session,
                    context=context,
                    state=self._state_for(session, provider),
                )
            except Exception as failure:  # the model's exception is the one the caller must see
                logger.error(
                    "after_run of %s failed while handling a failed run (%s)",
                    provider.source_id,
                    type(failure).__name__,
                )

    def _limit(self, max_tool_iterations: int | None) -> int:
        if max_tool_iterations is None:
            return self.max_tool_iterations
        return _check_iterations(max_tool_iterations)

    def _steps(
        self,
        context: SessionContext,
        *,
        stream: bool,
        tool_choice: ToolChoice | None,
        response_format: Any,
        max_tool_iterations: int,
        options: Mapping[str, Any] | None,
    ) -> AsyncGenerator[AgentResponseUpdate | AgentResponse, None]:
        """The run's tool loop, with the agent's tool choice and options as defaults."""
        return tool_loop(
            self.client,
            context,
            stream=stream,
            tool_choice=tool_choice if tool_choice is not None else self.tool_choice,
            response_format=response_format,
            options={**self.options, **dict(options or {})},
            max_tool_iterations=max_tool_iterations,
            author_name=self.name,
        )

    async def run(
        self,
        input: AgentInput,
        session: AgentSession | None = None,
        *,
        tools: Sequence[ToolLike] = (),
        tool_choice: ToolChoice | None = None,
        response_format: Any = None,
        max_tool_iterations: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> AgentResponse:
        """Run the agent on ``input``: a string, a :class:`Message`, a mapping in OpenAI message
        shape (``{"role": "user", "content": "hi"}``), or a list of those.

        Without ``session`` the run uses a fresh throwaway session. ``tools`` adds tools for
        this run only; ``response_format`` (e.g. a pydantic model) asks for structured output,
        parsed into ``AgentResponse.value``. When the model still asks for tools after
        ``max_tool_iterations`` rounds it is asked once more with tool_choice "none"; if it
        insists, :class:`ToolLoopLimitError` is raised.

        Raises:
            InvalidInputError: ``input`` is of another type, or empty.
            AfterRunError: a provider failed after the model answered; the answer is in its
                ``response``, the failures in its ``errors``, and nothing of the turn was kept
                by the providers with a unit of work.
        """
        session, context = await self._prepare(input, session, tools)
        response: AgentResponse | None = None
        try:
            steps = self._steps(
                context,
                stream=False,
                tool_choice=tool_choice,
                response_format=response_format,
                max_tool_iterations=self._limit(max_tool_iterations),
                options=options,
            )
            async with aclosing(steps):
                async for step in steps:
                    if isinstance(step, AgentResponse):
                        response = step
        except Exception as exc:
            await self._fail(session, context, exc)
            raise
        assert response is not None  # the loop ends with the response or raises
        context.response = response
        await self._finish(session, context)
        return response

    async def run_stream(
        self,
        input: AgentInput,
        session: AgentSession | None = None,
        *,
        tools: Sequence[ToolLike] = (),
        tool_choice: ToolChoice | None = None,
        response_format: Any = None,
        max_tool_iterations: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[AgentResponseUpdate | AgentResponse]:
        """Like :meth:`run`, yielding :class:`AgentResponseUpdate` pieces as they arrive and
        the final :class:`AgentResponse` last (after the providers' ``after_run``).

        Providers' ``after_run`` only runs if the stream is consumed to the end.
        """
        session, context = await self._prepare(input, session, tools)
        steps = self._steps(
            context,
            stream=True,
            tool_choice=tool_choice,
            response_format=response_format,
            max_tool_iterations=self._limit(max_tool_iterations),
            options=options,
        )
        response: AgentResponse | None = None
        try:
            async with aclosing(steps):
                async for step in steps:
                    if isinstance(step, AgentResponse):
                        response = step
                    else:
                        yield step
        except Exception as exc:
            await self._fail(session, context, exc)
            raise
        assert response is not None  # the loop ends with the response or raises
        context.response = response
        await self._finish(session, context)
        yield response

    def __repr__(self) -> str:
        return (
            f"Agent(name={self.name!r}, tools={[t.name for t in self.tools]}, "
            f"providers={[p.source_id for p in self.context_providers]})"
        )


class _RollBack(Exception):
    """Raised inside the units of work to leave them with an error (they roll back)."""


class _TrackedUnit:
    """A provider's unit of work that notes its own failure on leaving (e.g. a failed commit)."""

    def __init__(
        self,
        source_id: str,
        unit: AbstractAsyncContextManager[object],
        errors: list[tuple[str, Exception]],
    ) -> None:
        self._source_id = source_id
        self._unit = unit
        self._errors = errors

    async def __aenter__(self) -> object:
        return await self._unit.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        try:
            return await self._unit.__aexit__(exc_type, exc, traceback)
        except Exception as failure:
            if failure is not exc:
                self._errors.append((self._source_id, failure))
            raise


__all__ = ["Agent", "AgentResponse", "AgentResponseUpdate"]
