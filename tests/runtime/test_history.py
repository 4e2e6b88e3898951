"""History providers: the automatic in-memory one, the one-loader rule, audit recording,
reducer triggers."""

from __future__ import annotations

from typing import Any

import pytest

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.agent import Agent
from pgmemory.runtime.history import HistoryProvider, InMemoryHistoryProvider
from pgmemory.runtime.messages import Message
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.providers import ContextProvider
from pgmemory.runtime.reducers import MessageCountingReducer
from tests.openai_server import OpenAIServer, text


class Injector(ContextProvider):
    async def before_run(self, *, agent, session, context, state) -> None:  # type: ignore[override]
        context.extend_messages(self, Message("user", "a memory"))


def test_in_memory_history_is_added_only_when_nothing_loads(chat_client: OpenAIChatClient) -> None:
    agent = Agent(chat_client)
    assert isinstance(agent.context_providers[0], InMemoryHistoryProvider)
    audit = InMemoryHistoryProvider("audit", load_messages=False)
    agent = Agent(chat_client, context_providers=[audit])
    assert [p.source_id for p in agent.context_providers] == ["in_memory_history", "audit"]
    primary = InMemoryHistoryProvider("primary")
    agent = Agent(chat_client, context_providers=[primary, audit])
    assert agent.context_providers == [primary, audit]


def test_two_loading_providers_are_refused(chat_client: OpenAIChatClient) -> None:
    with pytest.raises(
        InvalidInputError, match="'a', 'b' all load messages; only one may.*load_messages=False"
    ):
        Agent(
            chat_client,
            context_providers=[InMemoryHistoryProvider("a"), InMemoryHistoryProvider("b")],
        )


async def test_audit_provider_records_context_messages_without_loading(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    primary = InMemoryHistoryProvider("primary")
    audit = InMemoryHistoryProvider("audit", load_messages=False, store_context_messages=True)
    agent = Agent(chat_client, context_providers=[primary, Injector("memory"), audit])
    session = agent.create_session()
    openai_server.queue(text("one"), text("two"))
    await agent.run("first", session)
    await agent.run("second", session)

    assert [m.text for m in primary.messages(session)] == ["first", "one", "second", "two"]
    audited = audit.messages(session)
    assert [(m.text, m.source_type, m.source_id) for m in audited] == [
        ("a memory", "context_provider", "memory"),
        ("first", "external", None),
        ("one", "external", None),
        ("a memory", "context_provider", "memory"),
        ("second", "external", None),
        ("two", "external", None),
    ]
    # the model saw the history once (from the primary) and it was stamped chat_history
    sent = [m["content"] for m in openai_server.last_request["messages"]]
    assert sent == ["first", "one", "a memory", "second"]


async def test_loaded_history_is_stamped_chat_history(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    seen: list[Any] = []

    class Spy(ContextProvider):
        async def before_run(self, *, agent, session, context, state) -> None:  # type: ignore[override]
            seen.extend((m.text, m.source_type, m.source_id) for m in context.get_messages())

    agent = Agent(chat_client, context_providers=[InMemoryHistoryProvider("h"), Spy("spy")])
    session = agent.create_session()
    openai_server.queue(text("one"), text("two"))
    await agent.run("first", session)
    await agent.run("second", session)
    assert seen == [("first", "chat_history", "h"), ("one", "chat_history", "h")]


async def test_store_options(openai_server: OpenAIServer, chat_client: OpenAIChatClient) -> None:
    inputs_only = InMemoryHistoryProvider("in", load_messages=False, store_outputs=False)
    outputs_only = InMemoryHistoryProvider("out", load_messages=False, store_inputs=False)
    agent = Agent(chat_client, context_providers=[inputs_only, outputs_only])
    session = agent.create_session()
    openai_server.queue(text("answer"))
    await agent.run("ask", session)
    assert [m.text for m in inputs_only.messages(session)] == ["ask"]
    assert [m.text for m in outputs_only.messages(session)] == ["answer"]


async def test_reducer_after_messages_added_shrinks_storage(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    history = InMemoryHistoryProvider(
        reducer=MessageCountingReducer(2), reducer_trigger="after_messages_added"
    )
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()
    openai_server.queue(text("r1"), text("r2"))
    await agent.run("q1", session)
    await agent.run("q2", session)
    assert [m.text for m in history.messages(session)] == ["q2", "r2"]


async def test_reducer_before_messages_retrieved_keeps_storage(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    history = InMemoryHistoryProvider(reducer=MessageCountingReducer(2))
    agent = Agent(chat_client, context_providers=[history])
    session = agent.create_session()
    openai_server.queue(text("r1"), text("r2"), text("r3"))
    for q in ("q1", "q2", "q3"):
        await agent.run(q, session)
    assert len(history.messages(session)) == 6
    assert [m["content"] for m in openai_server.last_request["messages"]] == ["q2", "r2", "q3"]


def test_bad_history_options_are_named() -> None:
    with pytest.raises(InvalidInputError, match="reducer_trigger 'sometimes'"):
        InMemoryHistoryProvider(reducer_trigger="sometimes")  # type: ignore[arg-type]

    class ReadOnly(HistoryProvider):
        pass

    with pytest.raises(InvalidInputError, match="cannot apply a reducer after messages are added"):
        ReadOnly("ro", reducer=MessageCountingReducer(3), reducer_trigger="after_messages_added")
