"""A FastAPI chat service whose agent remembers each user, across sessions and restarts.

    pip install 'pgmemory[embedded,use]' fastapi uvicorn
    PGMEMORY_OPENAI_BASE_URL=... PGMEMORY_OPENAI_API_KEY=... uvicorn examples.fastapi_app:app

One :class:`~pgmemory.MemoryStore` per process, opened in the lifespan (its pool serves every
request), with the embedder loaded at start-up so the first request does not pay for it. The
user id comes from the application's authentication — here the ``X-User-Id`` header stands in
for it — never from the request body: memory scopes and chat history are keyed by it.

``POST /chat {"message": "...", "session_id": null}`` answers and returns the session id to send
back for the next turn. Bad input is a 400, a scope problem a 403.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from pgmemory import (
    Agent,
    AgentSession,
    ChatHistoryMemoryProvider,
    CollectionError,
    InvalidInputError,
    MemoryScope,
    MemoryStore,
    OpenAIChatClient,
    PostgresHistoryProvider,
    ScopeError,
    Settings,
)

COLLECTION = "chat_memory"
INSTRUCTIONS = "You are a helpful assistant. Use what you remember about the user."


def per_user(session: AgentSession) -> ChatHistoryMemoryProvider.State:
    """Memory scopes from the user id the application bound to the session."""
    user_id = session.state["user_id"]
    return ChatHistoryMemoryProvider.State(
        storage_scope=MemoryScope(user_id=user_id, session_id=session.session_id),
        search_scope=MemoryScope(user_id=user_id),
    )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the store and the model client once per process; warm the embedder."""
    settings = Settings()
    store = await MemoryStore(settings=settings, migrate=True).open()
    client = OpenAIChatClient.from_settings(settings)
    try:
        await store.embedder.embed(["warm-up"])  # load the local model now, not on a request
        try:
            await store.get_collection(COLLECTION)
        except CollectionError:
            await store.create_collection(COLLECTION)
        memory = ChatHistoryMemoryProvider(store, COLLECTION, state_initializer=per_user)
        history = PostgresHistoryProvider(store)
        app.state.agent = Agent(client, INSTRUCTIONS, context_providers=[history, memory])
        yield
    finally:
        await client.aclose()
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
    session = AgentSession(body.session_id, state={"user_id": user_id})
    response = await request.app.state.agent.run(body.message, session)
    return ChatReply(session_id=session.session_id, reply=response.text)
