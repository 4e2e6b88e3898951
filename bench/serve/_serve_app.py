"""The application bench/serve/serve.py puts under load, run under uvicorn in its own process.

It is the FastAPI example's shape (one store per process, opened in the lifespan with the
embedder warmed up; agent-framework's ``Agent`` with its ``OpenAIChatCompletionClient`` and
pgmemory's ``PostgresHistoryProvider`` + ``ChatHistoryMemoryProvider``, both bound to the
request's user; ``POST /chat`` runs one turn for the ``X-User-Id`` user), plus timers: every
turn records the time it spent embedding, in store calls, in the model's HTTP calls, and in
total, so the benchmark can say where a turn's time goes. ``POST /memory`` is the bare-store alternative (one add or
one search, no model, no history). ``GET /stats`` returns (and with ``reset=1`` clears) the
timers.

Configuration comes from the environment like any pgmemory application
(``PGMEMORY_DATABASE_URL``, ``PGMEMORY_OPENAI_BASE_URL``, ``PGMEMORY_EMBED_BATCHING``, ...);
the first line on stdout is ``PORT <n>`` once the socket is bound (127.0.0.1, a free port).
"""

from __future__ import annotations

import os
import sys
import time

# The repo root first (this checkout's pgmemory; serve.py also sets PYTHONPATH to it), with
# os.path: pathlib would be imported before the clock starts and left out of the start-up figure.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_T0 = time.perf_counter()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextvars  # noqa: E402
import hashlib  # noqa: E402
import inspect  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
from collections.abc import AsyncIterator, Awaitable, Callable  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import numpy as np  # noqa: E402
import uvicorn  # noqa: E402
from agent_framework import Agent, AgentSession  # noqa: E402
from agent_framework.openai import OpenAIChatCompletionClient  # noqa: E402
from fastapi import FastAPI, Header, Request  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from pgmemory import (  # noqa: E402
    ChatHistoryMemoryProvider,
    CollectionError,
    MemoryRecord,
    MemoryScope,
    MemoryStore,
    PostgresHistoryProvider,
    Settings,
    make_embedder,
)
from pgmemory.embedders import BatchingEmbedder, CachedEmbedder, warm_up  # noqa: E402

_IMPORTED = time.perf_counter()
COLLECTION = "serve_bench"
INSTRUCTIONS = "You are a helpful assistant. Use what you remember about the user."

#: The user of the request being served: what the providers' ``user_id`` resolver returns.
_user: contextvars.ContextVar[str] = contextvars.ContextVar("user", default="")


def request_user(session: AgentSession) -> str:
    """pgmemory's user binding: the request's ``X-User-Id``, never the session's state."""
    return _user.get()


#: The current turn's timers (seconds per bucket); None outside a turn.
_turn: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "turn", default=None
)


def _timed(bucket: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``method`` adding its wall time to the current turn's ``bucket`` (outermost call only)."""
    depth = f"_{bucket}_depth"

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        timers = _turn.get()
        if timers is None or timers.get(depth, 0) > 0:
            return await method(*args, **kwargs)
        timers[depth] = 1
        start = time.perf_counter()
        try:
            return await method(*args, **kwargs)
        finally:
            timers[bucket] += time.perf_counter() - start
            timers[depth] = 0

    return wrapper


class TimedEmbedder:
    """The store's embedder, with each ``embed()`` call's wall time added to the turn."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dimensions = inner.dimensions
        self.embed = _timed("embed", inner.embed)

    async def warm_up(self) -> None:
        """Warm the wrapped embedder."""
        await warm_up(self.inner)


class FreeEmbedder:
    """A zero-cost stand-in for the model (same id and size): the ceiling run's embedder.

    Vectors are pseudo-random unit vectors seeded by the text, so equal texts get equal
    vectors; what a turn costs without any embedding work is what it measures.
    """

    model_id = "google/universal-sentence-encoder-multilingual-3"
    dimensions = 512

    async def embed(self, texts: Any) -> np.ndarray:
        """Unit vectors derived from each text's hash."""
        rows = [
            np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8]))
            .standard_normal(self.dimensions)
            .astype(np.float32)
            for t in texts
        ]
        out = np.array(rows, dtype=np.float32).reshape(len(rows), self.dimensions)
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


class _ModelCpu:
    """CPU seconds the local model's threads spent embedding (any thread, summed)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._lock = threading.Lock()

    def wrap(self, embedder: Any) -> None:
        """Time the innermost ``embed_sync`` of an embedder chain (both modes call it)."""
        chain = embedder
        while getattr(embedder, "inner", None) is not None:
            embedder = embedder.inner
        method = getattr(embedder, "embed_sync", None)
        if method is None:
            return

        def timed(texts: list[str]) -> Any:
            start = time.thread_time()
            try:
                return method(texts)
            finally:
                with self._lock:
                    self.seconds += time.thread_time() - start

        embedder.embed_sync = timed
        batcher = _batcher(chain)
        if batcher is not None:
            batcher._sync = timed  # it took the bound method when it was built


MODEL_CPU = _ModelCpu()


def _batcher(embedder: Any) -> BatchingEmbedder | None:
    """The BatchingEmbedder in an embedder chain, if any."""
    while embedder is not None:
        if isinstance(embedder, BatchingEmbedder):
            return embedder
        embedder = getattr(embedder, "inner", None)
    return None


def _cache(embedder: Any) -> CachedEmbedder | None:
    """The CachedEmbedder in an embedder chain, if any."""
    while embedder is not None:
        if isinstance(embedder, CachedEmbedder):
            return embedder
        embedder = getattr(embedder, "inner", None)
    return None


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the store, warm the embedder, build the agent; time each step."""
    started = time.perf_counter()
    settings = Settings()
    free = os.environ.get("BENCH_FREE_EMBEDDER") == "1"
    base = CachedEmbedder(FreeEmbedder()) if free else make_embedder(settings)
    MODEL_CPU.wrap(base)
    embedder = TimedEmbedder(base)
    store = await MemoryStore(settings=settings, embedder=embedder).open()  # type: ignore[arg-type]
    opened = time.perf_counter()
    await warm_up(store.embedder)
    warmed = time.perf_counter()
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    openai = AsyncOpenAI(
        base_url=settings.openai_base_url,
        api_key=key or "unset",
        max_retries=settings.openai_max_retries,
        timeout=settings.openai_timeout_s,
    )
    # The model's time is its HTTP calls: the framework's own work around them is "ours".
    openai.chat.completions.create = _timed("model", openai.chat.completions.create)  # type: ignore[method-assign]
    client = OpenAIChatCompletionClient(model=settings.openai_chat_model, async_client=openai)
    for name, _ in inspect.getmembers(type(store), inspect.iscoroutinefunction):
        if not name.startswith("_") and name not in {"open", "close"}:
            setattr(store, name, _timed("store", getattr(store, name)))
    try:
        try:
            await store.get_collection(COLLECTION)
        except CollectionError:
            await store.create_collection(COLLECTION)
        # The default scopes: stored per user and session, recalled per user.
        memory = ChatHistoryMemoryProvider(store, COLLECTION, user_id=request_user)
        history = PostgresHistoryProvider(store, user_id=request_user)
        app.state.agent = Agent(
            client=client, instructions=INSTRUCTIONS, context_providers=[history, memory]
        )
        app.state.embedder = embedder
        app.state.store = store
        app.state.turns = []
        app.state.cpu = time.process_time()
        app.state.model_cpu = MODEL_CPU.seconds
        app.state.startup = {
            "imports_s": _IMPORTED - _T0,
            "open_s": opened - started,
            "warm_up_s": warmed - opened,
            "lifespan_s": time.perf_counter() - started,
            "batching": _batcher(embedder) is not None,
            "free_embedder": free,
        }
        yield
    finally:
        await openai.close()
        await store.close()


app = FastAPI(title="pgmemory serve bench", lifespan=lifespan)


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
    body: ChatRequest, request: Request, x_user_id: Annotated[str, Header()]
) -> ChatReply:
    """Run one agent turn for the user, timing where it goes."""
    timers = {"embed": 0.0, "store": 0.0, "model": 0.0}
    token = _turn.set(timers)
    bound = _user.set(x_user_id)
    start = time.perf_counter()
    try:
        session = AgentSession(session_id=body.session_id)
        response = await request.app.state.agent.run(body.message, session=session)
    finally:
        _turn.reset(token)
        _user.reset(bound)
    timers["turn"] = time.perf_counter() - start
    request.app.state.turns.append(
        (timers["turn"], timers["embed"], timers["store"], timers["model"])
    )
    return ChatReply(session_id=session.session_id, reply=response.text)


class MemoryRequest(BaseModel):
    """One store operation of the ``memory`` scenario (no model, no history)."""

    message: str
    op: str = "search"


@app.post("/memory")
async def memory(
    body: MemoryRequest, request: Request, x_user_id: Annotated[str, Header()]
) -> dict[str, int]:
    """Add the message as a memory, or search the user's memories with it (one embedding)."""
    timers = {"embed": 0.0, "store": 0.0, "model": 0.0}
    token = _turn.set(timers)
    start = time.perf_counter()
    store = request.app.state.store
    scope = MemoryScope(user_id=x_user_id)
    try:
        if body.op == "add":
            found = len(
                await store.add(COLLECTION, [MemoryRecord(content=body.message, scope=scope)])
            )
        else:
            found = len(await store.search(COLLECTION, scope, query=body.message, limit=5))
    finally:
        _turn.reset(token)
    timers["turn"] = time.perf_counter() - start
    request.app.state.turns.append(
        (timers["turn"], timers["embed"], timers["store"], timers["model"])
    )
    return {"rows": found}


@app.get("/health")
async def health() -> dict[str, str]:
    """Liveness (also what the load generator opens its connections with)."""
    return {"status": "ok"}


@app.get("/stats")
async def stats(request: Request, reset: bool = False) -> dict[str, Any]:
    """Per-turn timers (ms) since the last reset, CPU seconds used, batching and cache counts."""
    state = request.app.state
    batcher = _batcher(state.embedder)
    cache = _cache(state.embedder)
    now = time.process_time()
    out = {
        "turns": [[round(v * 1000, 3) for v in row] for row in state.turns],
        "cpu_s": now - state.cpu,
        "model_cpu_s": MODEL_CPU.seconds - state.model_cpu,
        "batches": batcher.batches if batcher else None,
        "batched_texts": batcher.texts if batcher else None,
        "largest_batch": batcher.largest_batch if batcher else None,
        "cache_hits": cache.hits if cache else None,
        "cache_misses": cache.misses if cache else None,
        "startup": state.startup,
    }
    if reset:
        state.turns = []
        state.cpu = now
        state.model_cpu = MODEL_CPU.seconds
    return out


def main() -> None:
    """Bind a free loopback port, print it, serve until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=2048)
    args = parser.parse_args()
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets that say they are TCP,
    # and without it every response waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    # A long keep-alive: at 200 clients a connection can sit idle longer than uvicorn's 5 s
    # default between two turns, and a client reusing it as the server closes it fails.
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        backlog=args.backlog,
        lifespan="on",
        timeout_keep_alive=600,
    )
    server = uvicorn.Server(config)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
