"""A FastAPI chat service whose agent remembers each user, across sessions and restarts.

    pip install 'pgmemory-agents[embedded,use,agent-framework]' fastapi uvicorn
    PGMEMORY_OPENAI_BASE_URL=... PGMEMORY_OPENAI_API_KEY=... uvicorn examples.fastapi_app:app

One :class:`~pgmemory.MemoryStore` per process, opened in the lifespan (its pool serves every
request), with the embedder loaded at start-up so the first request does not pay for it. The
agent is agent-framework's ``Agent``; pgmemory's providers are its history and memory. The
user id comes from the application's authentication — here the ``X-User-Id`` header stands in
for it — never from the request body or the session: the providers' ``user_id`` resolver reads
what the endpoint bound for this request, and memory scopes and chat history are keyed by it.

``POST /chat {"message": "...", "session_id": null}`` answers and returns the session id to send
back for the next turn. Bad input is a 400, a scope problem a 403.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from agent_framework import Agent, AgentSession
from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from pgmemory import (
    ChatHistoryMemoryProvider,
    InvalidInputError,
    MemoryStore,
    PostgresHistoryProvider,
    ScopeError,
    Settings,
    chat_client,
)

COLLECTION = "chat_memory"
INSTRUCTIONS = "You are a helpful assistant. Use what you remember about the user."
#: The authenticated user of the request being served (set by the endpoint).
REQUEST_USER: contextvars.ContextVar[str] = contextvars.ContextVar("request_user")


def bound_user(session: AgentSession) -> str:
    """pgmemory's user binding: the request's authenticated user, never the session's state."""
    return REQUEST_USER.get()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the store and the model client once per process; warm the embedder."""
    settings = Settings()
    store = await MemoryStore(settings=settings, migrate=True).open()
    client = chat_client(settings)  # PGMEMORY_OPENAI_BASE_URL / _API_KEY / _CHAT_MODEL
    try:
        await store.embedder.embed(["warm-up"])  # load the local model now, not on a request
        memory = ChatHistoryMemoryProvider(store, COLLECTION, user_id=bound_user)
        history = PostgresHistoryProvider(store, user_id=bound_user)
        app.state.agent = Agent(
            client=client, instructions=INSTRUCTIONS, context_providers=[history, memory]
        )
        yield
    finally:
        await client.client.close()
        await store.close()


app = FastAPI(title="chat with memory", lifespan=lifespan)


@app.exception_handler(InvalidInputError)
async def bad_input(request: Request, exc: InvalidInputError) -> JSONResponse:
    """pgmemory's input errors name the bad value and the fix: a 400 for the client."""
    return JSONResponse({"detail": str(exc)}, status_code=400)


@app.exception_handler(ScopeError)
async def bad_scope(request: Request, exc: ScopeError) -> JSONResponse:
    """A missing or mismatched scope is an authorisation problem, not a server error."""
    return JSONResponse({"detail": str(exc)}, status_code=403)


def current_user(x_user_id: Annotated[str, Header()]) -> str:
    """Stand-in for real authentication: the user id the application trusts."""
    return x_user_id


class ChatRequest(BaseModel):
    """One user turn."""

    message: str
    session_id: str | None = None


class ChatReply(BaseModel):
    """The agent's answer and the session to continue."""

    session_id: str
    reply: str


@app.post("/chat")
async def chat(
    body: ChatRequest, request: Request, user_id: Annotated[str, Depends(current_user)]
) -> ChatReply:
    """Run one agent turn for the authenticated user."""
    if body.session_id is not None and not body.session_id.strip():
        raise InvalidInputError("session_id is blank; send null to start a new session")
    REQUEST_USER.set(user_id)  # what the providers' user_id resolver reads for this request
    session = AgentSession(session_id=body.session_id)
    response = await request.app.state.agent.run(body.message, session=session)
    return ChatReply(session_id=session.session_id, reply=response.text)
