"""Context providers: order and visibility, stamping, filters, tools, failures."""

from __future__ import annotations

from typing import Any

import pytest

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.agent import Agent
from pgmemory.runtime.messages import Message
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.providers import ContextProvider, SessionContext
from pgmemory.runtime.session import AgentSession
from tests.openai_server import OpenAIServer, call, error, text, tool_calls


class Recorder(ContextProvider):
    """Adds an instruction and a message, and records what it saw."""

    def __init__(self, source_id: str, log: list[Any]) -> None:
        super().__init__(source_id)
        self.log = log

    async def before_run(self, *, agent, session, context, state) -> None:  # type: ignore[override]
        seen = [(m.source_id, m.text) for m in context.get_messages()]
        self.log.append(("before", self.source_id, seen, context.instructions))
        context.extend_instructions(self, f"note from {self.source_id}")
        context.extend_messages(self, Message("user", f"context from {self.source_id}"))
        state["runs"] = state.get("runs", 0) + 1

    async def after_run(self, *, agent, session, context, state) -> None:  # type: ignore[override]
        self.log.append(
            (
                "after",
                self.source_id,
                [m.text for m in self.storable_messages(context)],
                type(context.exception).__name__ if context.exception else None,
            )
        )


async def test_providers_run_in_order_and_see_earlier_additions(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    log: list[Any] = []
    agent = Agent(
        chat_client, "Base.", context_providers=[Recorder("first", log), Recorder("second", log)]
    )
    session = agent.create_session()
    openai_server.queue(text("ok"))
    await agent.run("question", session)

    assert log[0] == ("before", "first", [], "Base.")
    assert log[1] == (
        "before",
        "second",
        [("first", "context from first")],
        "Base.\n\nnote from first",
    )
    # after_run in list order, storing only external request messages plus the response
    assert log[2] == ("after", "first", ["question", "ok"], None)
    assert log[3] == ("after", "second", ["question", "ok"], None)

    sent = openai_server.last_request["messages"]
    assert sent[0] == {"role": "system", "content": "Base.\n\nnote from first\n\nnote from second"}
    assert [m["content"] for m in sent[1:]] == [
        "context from first",
        "context from second",
        "question",
    ]
    assert session.state["first"] == {"runs": 1} and session.state["second"] == {"runs": 1}


async def test_extend_messages_stamps_copies(chat_client: OpenAIChatClient) -> None:
    context = SessionContext(session_id="s", input_messages=[Message("user", "hi")])
    mine = Message("user", "memory")
    stamped = context.extend_messages("memory-provider", mine)
    assert mine.source_type == "external"
    assert (
        stamped[0].source_type == "context_provider" and stamped[0].source_id == "memory-provider"
    )
    context.extend_messages("hist", [Message("assistant", "old")], source_type="chat_history")
    assert [m.text for m in context.request_messages] == ["old", "memory", "hi"]
    assert [m.text for m in context.get_messages(source_types="context_provider")] == ["memory"]
    assert [m.text for m in context.get_messages(sources=["hist"], include_input=True)] == ["old"]
    assert [m.text for m in context.get_messages(exclude_sources=["hist"], include_input=True)] == [
        "memory",
        "hi",
    ]


async def test_default_filters_search_and_store_only_external_messages() -> None:
    provider = ContextProvider("p")
    context = SessionContext(
        session_id="s",
        input_messages=[
            Message("user", "caller"),
            Message("user", "old").with_source("chat_history", "h"),
        ],
    )
    context.extend_messages("other", Message("user", "injected"))
    assert [m.text for m in provider.search_messages(context)] == ["caller"]
    assert [m.text for m in provider.storable_messages(context)] == ["caller"]
    permissive = ContextProvider("q", search_input_filter=lambda ms: list(ms))
    assert [m.text for m in permissive.search_messages(context)] == ["injected", "caller", "old"]


async def test_provider_tools_reach_the_model(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    class ToolProvider(ContextProvider):
        async def before_run(self, *, agent, session, context, state) -> None:  # type: ignore[override]
            def lookup(term: str) -> str:
                """Look something up."""
                return f"found {term}"

            context.extend_tools(self, lookup)

    agent = Agent(chat_client, context_providers=[ToolProvider("tools")])
    openai_server.queue(tool_calls(call("lookup", {"term": "x"})), text("done"))
    response = await agent.run("go")
    assert openai_server.requests[0]["tools"][0]["function"]["name"] == "lookup"
    assert response.messages[1].function_results[0].result == "found x"


async def test_failed_model_call_reaches_after_run_then_propagates(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    import openai

    log: list[Any] = []
    agent = Agent(chat_client, context_providers=[Recorder("rec", log)])
    session = agent.create_session()
    openai_server.queue(error(400, "model exploded"))
    with pytest.raises(openai.BadRequestError, match="model exploded"):
        await agent.run("hello", session)
    assert log[-1] == ("after", "rec", [], "BadRequestError")
    # the default in-memory history stored nothing for the failed run
    assert session.state["in_memory_history"] == {}


def test_duplicate_source_ids_and_bad_providers_are_refused(chat_client: OpenAIChatClient) -> None:
    with pytest.raises(InvalidInputError, match="share source_id 'x'"):
        Agent(chat_client, context_providers=[ContextProvider("x"), ContextProvider("x")])
    with pytest.raises(InvalidInputError, match="share state_key 'k'"):
        Agent(
            chat_client,
            context_providers=[
                ContextProvider("a", state_key="k"),
                ContextProvider("b", state_key="k"),
            ],
        )
    with pytest.raises(InvalidInputError, match="does not derive from ContextProvider"):
        Agent(chat_client, context_providers=[object()])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="source_id '' is blank"):
        ContextProvider("")


async def test_session_state_given_to_hooks_is_the_providers_slot(
    chat_client: OpenAIChatClient,
) -> None:
    agent = Agent(chat_client)
    session = AgentSession()
    provider = ContextProvider("p", state_key="pkey")
    assert agent._state_for(session, provider) is session.state["pkey"]
