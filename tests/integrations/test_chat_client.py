"""One way to point the snippets and the examples at a model: ``PGMEMORY_OPENAI_*`` (issue 59).

``pgmemory.chat_client()`` is agent-framework's ``OpenAIChatCompletionClient`` on the endpoint
the settings name; with none, a pgmemory error names the variables to set, not the framework's
``'base_url', 'endpoint'``.
"""

from __future__ import annotations

import pytest
from agent_framework import Agent

import pgmemory
from pgmemory.errors import InvalidInputError
from pgmemory.integrations.agent_framework.client import ENDPOINT_VARIABLES
from pgmemory.settings import Settings
from tests.openai_server import OpenAIServer, text


def _settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_no_endpoint_is_a_pgmemory_error_naming_the_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", *ENDPOINT_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidInputError) as caught:
        pgmemory.chat_client()
    for name in ENDPOINT_VARIABLES:
        assert name in str(caught.value)
    assert "base_url" not in str(caught.value)


async def test_the_settings_endpoint_answers(
    openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/not-this-one")  # not read
    monkeypatch.setenv("PGMEMORY_OPENAI_BASE_URL", openai_server.url)  # no key: a local server
    monkeypatch.setenv("PGMEMORY_OPENAI_CHAT_MODEL", "local-model")
    client = pgmemory.chat_client()
    openai_server.queue(text("hello"))
    agent = Agent(client=client, instructions="Be brief.")
    assert (await agent.run("hi")).text == "hello"
    assert openai_server.requests[-1]["model"] == "local-model"
    await client.client.close()


def test_a_key_alone_is_api_openai_com(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/not-this-one")
    client = pgmemory.chat_client(_settings(openai_api_key="sk-test"), model="gpt-4o-mini")
    assert str(client.client.base_url) == "https://api.openai.com/v1/"
