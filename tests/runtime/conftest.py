"""Fixtures of the runtime tests: the scripted OpenAI-compatible server and a client on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from pgmemory.runtime.openai_client import OpenAIChatClient
from tests.openai_server import OpenAIServer


@pytest.fixture
def openai_server() -> Iterator[OpenAIServer]:
    """A fresh scripted chat-completions server for one test."""
    with OpenAIServer() as server:
        yield server


@pytest_asyncio.fixture
async def chat_client(openai_server: OpenAIServer) -> AsyncIterator[OpenAIChatClient]:
    """An :class:`OpenAIChatClient` talking to ``openai_server`` (no retries)."""
    client = OpenAIChatClient(
        model="test-model", base_url=openai_server.url, api_key="test", max_retries=0
    )
    try:
        yield client
    finally:
        await client.aclose()
