"""A two-turn conversation whose history lives in PostgreSQL, across a simulated restart.

Turn 1 runs, the session is saved as JSON and everything is closed; turn 2 opens a new store
and a new agent, restores the session from the JSON, and the model sees turn 1 again because
the history is read back from PostgreSQL.

Configuration comes from the environment (see ``pgmemory.settings.Settings``)::

    PGMEMORY_OPENAI_BASE_URL    any OpenAI-compatible endpoint (unset = api.openai.com)
    PGMEMORY_OPENAI_API_KEY     its key (a local server usually needs none); one of the two
    PGMEMORY_OPENAI_CHAT_MODEL  the model (default gpt-4o-mini)
    PGMEMORY_DATABASE_URL       PostgreSQL with pgvector (unset = the embedded server)

Run it with ``python examples/two_turn_chat.py``.
"""

from __future__ import annotations

import asyncio
import json

from agent_framework import Agent, AgentSession

from pgmemory import MemoryStore, PostgresHistoryProvider, chat_client

INSTRUCTIONS = "You are a friendly assistant. Answer in one or two sentences."
USER = "alice"  # the signed-in user; in an application, from its authentication


async def turn(saved_session: str | None, text: str) -> str:
    """Open a store, run one turn, close everything; return the session as JSON."""
    async with MemoryStore(migrate=True) as store:
        client = chat_client(store.settings)  # PGMEMORY_OPENAI_*
        history = PostgresHistoryProvider(store, user_id=USER)
        agent = Agent(client=client, instructions=INSTRUCTIONS, context_providers=[history])
        if saved_session is None:
            session = agent.create_session()
        else:
            session = AgentSession.from_dict(json.loads(saved_session))
        response = await agent.run(text, session=session)
        print(f"user:      {text}")
        print(f"assistant: {response.text}\n")
        return json.dumps(session.to_dict())


async def main() -> None:
    saved = await turn(None, "Hi! My name is Alice and I can't eat spicy food.")
    # ... the process could exit here; only `saved` (a small JSON text) needs to be kept ...
    await turn(saved, "What's my name, and what should I avoid ordering?")


if __name__ == "__main__":
    asyncio.run(main())
