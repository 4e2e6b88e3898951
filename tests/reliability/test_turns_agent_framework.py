"""Turns never half-happen inside agent-framework's ``Agent`` either.

The framework calls ``after_run`` in reverse list order and stops at the first error;
pgmemory's providers of one agent run theirs together, all or nothing. The real framework
agent and its OpenAI client talk to the scripted server over HTTP.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

af = pytest.importorskip("agent_framework", reason="needs the 'agent-framework' extra")
from agent_framework.openai import OpenAIChatCompletionClient  # noqa: E402

from pgmemory import MemoryScope  # noqa: E402
from pgmemory.integrations.agent_framework import (  # noqa: E402
    ChatHistoryMemoryProvider,
    PostgresHistoryProvider,
)
from pgmemory.store.store import MemoryStore  # noqa: E402
from tests.openai_server import OpenAIServer, text  # noqa: E402


class Crash(af.ContextProvider):
    """A framework provider that fails its after_run while armed."""

    def __init__(self) -> None:
        super().__init__("crash")
        self.armed = True

    async def after_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        if self.armed:
            raise RuntimeError("crashed")


def per_user(session: Any) -> ChatHistoryMemoryProvider.State:
    user_id = session.state["user_id"]
    return ChatHistoryMemoryProvider.State(
        storage_scope=MemoryScope(user_id=user_id, session_id=session.session_id),
        search_scope=MemoryScope(user_id=user_id),
    )


def agent_with(store: MemoryStore, server: OpenAIServer, collection: str, *middle: Any) -> Any:
    client = OpenAIChatCompletionClient(model="test-model", base_url=server.url, api_key="test")
    return af.Agent(
        client,
        "Be brief.",
        context_providers=[
            PostgresHistoryProvider(store),
            *middle,
            ChatHistoryMemoryProvider(store, collection, state_initializer=per_user),
        ],
    )


async def kept(store: MemoryStore, collection: str, session: Any) -> tuple[int, int]:
    user = session.state["user_id"]
    return (
        await store.count_history(session.session_id, user_id=user),
        await store.count(collection, MemoryScope(user_id=user)),
    )


async def test_a_framework_provider_crashing_between_ours_keeps_none_of_the_turn(
    store: MemoryStore, collection: str, openai_server: OpenAIServer
) -> None:
    crash = Crash()
    agent = agent_with(store, openai_server, collection, crash)
    session = agent.create_session()
    session.state["user_id"] = f"alice-{uuid.uuid4().hex[:6]}"
    openai_server.queue(text("Noted."))
    with pytest.raises(RuntimeError, match="crashed"):
        await agent.run("I cannot eat peanuts", session=session)
    assert await kept(store, collection, session) == (0, 0)

    crash.armed = False
    openai_server.queue(text("Noted."))
    await agent.run("I cannot eat peanuts", session=session)
    assert await kept(store, collection, session) == (2, 2)


async def test_a_failing_pgmemory_provider_rolls_back_the_others(
    store: MemoryStore,
    collection: str,
    openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = agent_with(store, openai_server, collection)
    session = agent.create_session()
    session.state["user_id"] = f"bob-{uuid.uuid4().hex[:6]}"

    async def add_fails(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the database went away")

    with monkeypatch.context() as patch:
        patch.setattr(store, "add", add_fails)
        openai_server.queue(text("Noted."))
        with pytest.raises(ConnectionError):
            await agent.run("I cannot eat peanuts", session=session)
    # The history was appended first (list order) and rolled back with the failed memory.
    assert await kept(store, collection, session) == (0, 0)

    openai_server.queue(text("Noted."))
    await agent.run("I cannot eat peanuts", session=session)
    assert await kept(store, collection, session) == (2, 2)
