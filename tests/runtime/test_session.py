"""Sessions round-trip exactly (also through JSON text); the typed provider-state helper."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from pydantic import BaseModel

from pgmemory.errors import InvalidInputError
from pgmemory.runtime.agent import Agent
from pgmemory.runtime.history import InMemoryHistoryProvider
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.session import AgentSession, ProviderSessionState
from tests.openai_server import OpenAIServer, text


class Scope(BaseModel):
    user_id: str
    calls: int = 0


class ScopedProvider:
    """Stands in for a provider: owns a typed state helper."""

    def __init__(self) -> None:
        self.initialized = 0
        self.state = ProviderSessionState(self._init, owner=self)

    def _init(self, session: AgentSession) -> Scope:
        self.initialized += 1
        user = session.state.get("user_id")
        if not user:
            raise InvalidInputError("session.state['user_id'] is required")
        return Scope(user_id=user)


def test_typed_state_initialises_once_and_saves() -> None:
    provider = ScopedProvider()
    assert provider.state.state_key == "ScopedProvider"
    assert provider.state.state_type is Scope
    session = AgentSession("s1")
    session.state["user_id"] = "alice"
    first = provider.state.get_or_initialize(session)
    assert first == Scope(user_id="alice") and provider.initialized == 1
    assert session.state["ScopedProvider"] == {"user_id": "alice", "calls": 0}
    first.calls += 1
    assert provider.state.get_or_initialize(session).calls == 0  # a copy: save to keep changes
    provider.state.save(session, first)
    again = provider.state.get_or_initialize(session)
    assert again.calls == 1 and provider.initialized == 1


def test_typed_state_survives_a_json_round_trip() -> None:
    provider = ScopedProvider()
    session = AgentSession()
    session.state["user_id"] = "bob"
    provider.state.save(session, Scope(user_id="bob", calls=5))
    restored = AgentSession.from_dict(json.loads(json.dumps(session.to_dict())))
    assert restored == session
    assert provider.state.get_or_initialize(restored) == Scope(user_id="bob", calls=5)
    assert provider.initialized == 0


def test_dataclass_and_untyped_state() -> None:
    @dataclass
    class Counter:
        n: int = 0

    helper = ProviderSessionState(lambda s: Counter(), state_key="counter", state_type=Counter)
    session = AgentSession()
    c = helper.get_or_initialize(session)
    c.n = 3
    helper.save(session, c)
    assert session.state["counter"] == {"n": 3}
    plain = ProviderSessionState(lambda s: {"ids": []}, state_key="plain")
    assert plain.get_or_initialize(session) == {"ids": []}
    plain.clear(session)
    assert not plain.has_state(session)


def test_blank_keys_and_non_json_state_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="state_key '  ' is blank"):
        ProviderSessionState(lambda s: {}, state_key="  ")
    with pytest.raises(InvalidInputError, match="needs state_key"):
        ProviderSessionState(lambda s: {})
    with pytest.raises(InvalidInputError, match="session_id '' is blank"):
        AgentSession("")
    session = AgentSession()
    session.state["when"] = object()
    with pytest.raises(InvalidInputError, match=r"session.state\['when'\] holds a object"):
        session.to_dict()
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        AgentSession.from_dict("{nope")
    with pytest.raises(InvalidInputError, match="expected 'pgmemory.session/1'"):
        AgentSession.from_dict({"type": "other", "session_id": "x"})


async def test_agent_session_round_trip_through_json_text_keeps_history(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    agent = Agent(chat_client, "Be brief.")
    session = agent.create_session("conv-1")
    session.state["user_id"] = "alice"
    openai_server.queue(text("Hi Alice."), text("You are Alice."))
    await agent.run("My name is Alice.", session)

    blob = json.dumps(session.to_dict())
    restored = agent.deserialize_session(blob)
    assert restored.to_dict() == session.to_dict()
    assert restored.session_id == "conv-1" and restored.state["user_id"] == "alice"

    # a "restarted" agent with the same configuration resumes the conversation
    agent2 = Agent(chat_client, "Be brief.")
    response = await agent2.run("What is my name?", restored)
    assert response.text == "You are Alice."
    sent = [(m["role"], m["content"]) for m in openai_server.last_request["messages"]]
    assert sent == [
        ("system", "Be brief."),
        ("user", "My name is Alice."),
        ("assistant", "Hi Alice."),
        ("user", "What is my name?"),
    ]
    history = InMemoryHistoryProvider().messages(restored)
    assert [m.text for m in history] == [
        "My name is Alice.",
        "Hi Alice.",
        "What is my name?",
        "You are Alice.",
    ]
