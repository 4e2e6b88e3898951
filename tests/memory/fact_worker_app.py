"""An application module for ``pgmemory worker --app tests.memory.fact_worker_app:providers``:
its fact provider (queued), its chat client on the scripted server ``PGMEMORY_TEST_OPENAI_URL``
names. Used by ``test_fact_queue.py``, which starts the worker as a process of its own."""

from __future__ import annotations

import os

from agent_framework import AgentSession
from agent_framework.openai import OpenAIChatCompletionClient
from openai import AsyncOpenAI
from pydantic import BaseModel

from pgmemory import FactMemoryProvider, MemoryStore


class Profile(BaseModel):
    name: str | None = None
    city: str | None = None


def _no_user(session: AgentSession) -> str:
    raise RuntimeError("the worker takes each job's scope from the queue, never a session")


def providers(store: MemoryStore) -> list[FactMemoryProvider]:
    """The application's fact providers, built on the worker's open store."""
    client = OpenAIChatCompletionClient(
        model="test-model",
        async_client=AsyncOpenAI(
            base_url=os.environ["PGMEMORY_TEST_OPENAI_URL"], api_key="test", max_retries=0
        ),
    )
    return [FactMemoryProvider(store, client, Profile, user_id=_no_user, extraction="queued")]
