"""The application bench/serve/serve.py puts under load, run under uvicorn in its own process.

One FastAPI application for every memory (``BENCH_MEMORY``), so only the memory differs:
agent-framework's ``Agent`` with its ``OpenAIChatCompletionClient`` (talking to the scripted
chat server), ``POST /chat`` running one turn for the ``X-User-Id`` user, sessions kept in the
process (``agent.create_session()``, looked up by id), and the memory as context providers:

* ``pgmemory``: ``PostgresHistoryProvider`` + ``ChatHistoryMemoryProvider`` (built in
  ``bench/_common/pgmemory_af.py``), one store per process opened in the lifespan with the
  default embedder (USE, its micro-batching on or off by ``PGMEMORY_EMBED_BATCHING``) warmed
  up; the user comes from the request (a resolver reading the handler's context variable).
* ``mem0``: mem0's ``AsyncMemory`` on its pgvector store (``BENCH_PEER_URL``), ``infer=False``,
  behind a minimal provider of the benchmark's own (agent-framework's ``Mem0ContextProvider``
  fixes the user at construction and calls ``add`` without ``infer=False``, i.e. with an LLM);
  history: the framework's ``InMemoryHistoryProvider`` (mem0 keeps none).
* ``langgraph``: LangGraph's ``AsyncPostgresStore`` with its vector index, behind a minimal
  provider of the benchmark's own; history: ``InMemoryHistoryProvider``.
* ``none``: ``InMemoryHistoryProvider`` only.

The peers embed with the same USE model as their libraries call an embedder: mem0 one text per
call in a worker thread (its LangChain embedder route), LangGraph a list per put or search;
no batching across requests, no cache. The peers run in their own virtualenvs
(bench/.peers/serve-<name>/), with this checkout on ``PYTHONPATH`` for the USE model.

Timers: every turn records the time it spent embedding, in memory-library calls (``store``),
in the chat client, and in total, so the benchmark can say where a turn's time goes.
``POST /memory`` (pgmemory only) is the bare-store alternative (one add or one search, no
model, no history). ``POST /seed`` gives the peers their users' memories through their own
API. ``GET /stats`` returns (and with ``reset=1`` clears) the timers.

Configuration comes from the environment (``PGMEMORY_DATABASE_URL``,
``PGMEMORY_OPENAI_BASE_URL``, ``PGMEMORY_EMBED_BATCHING``, ``BENCH_MEMORY``,
``BENCH_PEER_URL``, ...); the first line on stdout is ``PORT <n>`` once the socket is bound
(127.0.0.1, a free port).
"""

from __future__ import annotations

import os
import sys
import time

# The repo root first (this checkout's pgmemory; serve.py also sets PYTHONPATH to it), with
# os.path: pathlib would be imported before the clock starts and left out of the start-up figure.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

_T0 = time.perf_counter()
MEMORY = os.environ.get("BENCH_MEMORY", "pgmemory")
if MEMORY == "mem0":  # before mem0 is imported: no telemetry, its files in a temporary folder
    import tempfile

    os.environ["MEM0_TELEMETRY"] = "False"
    os.environ["MEM0_DIR"] = tempfile.mkdtemp(prefix="mem0-serve-")
if MEMORY != "pgmemory":  # a peer library must not reach the network (loopback and Unix only)
    import socket as _socket

    _connect = _socket.socket.connect

    def _loopback_only(self: _socket.socket, address: object) -> object:
        host = address[0] if isinstance(address, tuple) else None
        if self.family != _socket.AF_UNIX and host not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"network disabled by the benchmark: connect to {address!r}")
        return _connect(self, address)  # type: ignore[arg-type]

    _socket.socket.connect = _loopback_only  # type: ignore[assignment]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextvars  # noqa: E402
import hashlib  # noqa: E402
import inspect  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import uuid  # noqa: E402
from collections.abc import AsyncIterator, Awaitable, Callable  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from typing import Annotated, Any  # noqa: E402

import agent_framework as af  # noqa: E402
import numpy as np  # noqa: E402
import uvicorn  # noqa: E402
from agent_framework.openai import OpenAIChatCompletionClient  # noqa: E402
from fastapi import FastAPI, Header, Request  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from pgmemory import Settings  # noqa: E402

_IMPORTED = time.perf_counter()
COLLECTION = "serve_bench"
INSTRUCTIONS = "You are a helpful assistant. Use what you remember about the user."
#: Memories a peer's provider recalls per turn: pgmemory's ChatHistoryMemoryProvider default.
PEER_TOP_K = 3
#: Memories the peers' providers recalled (a check that their search answers), in /stats.
RECALLED = [0]
MEMORIES_PROMPT = "## Memories\nConsider the following memories when answering user questions:"

#: The current turn's timers (seconds per bucket); None outside a turn.
_turn: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "turn", default=None
)
#: The request's user (what the application's auth would bind), read by the providers.
_user: contextvars.ContextVar[str | None] = contextvars.ContextVar("user", default=None)


def current_user(session: Any = None) -> str:
    """The user the handler bound for this request (the providers' resolver)."""
    user = _user.get()
    if not user:
        raise RuntimeError("no user bound for this request")
    return user


def _add(bucket: str, seconds: float) -> None:
    timers = _turn.get()
    if timers is not None:
        timers[bucket] += seconds


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


def _timed_call(bucket: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """A method returning an awaitable (agent-framework's ``get_response``), timed when awaited."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = method(*args, **kwargs)
        if not inspect.isawaitable(result):
            return result

        async def timed() -> Any:
            start = time.perf_counter()
            try:
                return await result
            finally:
                _add(bucket, time.perf_counter() - start)

        return timed()

    return wrapper


class TimedEmbedder:
    """pgmemory's embedder, with each ``embed()`` call's wall time added to the turn."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dimensions = inner.dimensions
        self.embed = _timed("embed", inner.embed)

    async def warm_up(self) -> None:
        """Warm the wrapped embedder."""
        from pgmemory.embedders import warm_up

        await warm_up(self.inner)


class FreeEmbedder:
    """A zero-cost stand-in for the model (same id and size): the ceiling run's embedder.

    Vectors are pseudo-random unit vectors seeded by the text, so equal texts get equal
    vectors; what a turn costs without any embedding work is what it measures.
    """

    model_id = "google/universal-sentence-encoder-multilingual-3"
    dimensions = 512

    def embed_sync(self, texts: Any) -> np.ndarray:
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

    async def embed(self, texts: Any) -> np.ndarray:
        """As :meth:`embed_sync`."""
        return self.embed_sync(texts)


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


def _batcher(embedder: Any) -> Any:
    """The BatchingEmbedder in an embedder chain, if any."""
    if MEMORY != "pgmemory":
        return None
    from pgmemory.embedders import BatchingEmbedder

    while embedder is not None:
        if isinstance(embedder, BatchingEmbedder):
            return embedder
        embedder = getattr(embedder, "inner", None)
    return None


def _cache(embedder: Any) -> Any:
    """The CachedEmbedder in an embedder chain, if any."""
    if MEMORY != "pgmemory":
        return None
    from pgmemory.embedders import CachedEmbedder

    while embedder is not None:
        if isinstance(embedder, CachedEmbedder):
            return embedder
        embedder = getattr(embedder, "inner", None)
    return None


def _peer_model() -> Any:
    """The USE model itself for a peer (no batching, no cache), or the free stand-in."""
    if os.environ.get("BENCH_FREE_EMBEDDER") == "1":
        return FreeEmbedder()
    from pgmemory.embedders.use import USEEmbedder

    return USEEmbedder()


def _timed_sync_embed(model: Any) -> Callable[[list[str]], list[list[float]]]:
    """``model.embed_sync`` as lists, its wall time added to the turn (in any thread: the
    callers copy the context into their worker threads)."""

    def embed(texts: list[str]) -> list[list[float]]:
        start = time.perf_counter()
        try:
            return [v.tolist() for v in model.embed_sync(list(texts))]
        finally:
            _add("embed", time.perf_counter() - start)

    return embed


def _input_text(context: af.SessionContext) -> str:
    return "\n".join(m.text for m in context.input_messages if m and m.text and m.text.strip())


def _turn_messages(context: af.SessionContext) -> list[tuple[str, str]]:
    """(role, text) of the turn's input and response messages with text."""
    messages = list(context.input_messages)
    if context.response is not None:
        messages += list(context.response.messages)
    return [
        (str(m.role), m.text)
        for m in messages
        if str(m.role) in ("user", "assistant") and m.text and m.text.strip()
    ]


# --- the peers' providers (the benchmark's own, minimal) --------------------------------------


class Mem0Memory(af.ContextProvider):
    """mem0 as agent-framework memory: search the user's memories before the run, add the
    turn's messages after it (``infer=False``: stored as they are, no LLM). As
    agent-framework's own ``Mem0ContextProvider`` does, with the user per request."""

    def __init__(self, memory: Any) -> None:
        super().__init__("mem0")
        self.memory = memory

    async def before_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        query = _input_text(context)
        if not query:
            return
        found = await self.memory.search(
            query, filters={"user_id": current_user()}, top_k=PEER_TOP_K
        )
        results = found.get("results", [])
        RECALLED[0] += len(results)
        lines = "\n".join(str(r.get("memory", "")) for r in results)
        if lines:
            context.extend_messages(
                self.source_id, [af.Message("user", [f"{MEMORIES_PROMPT}\n{lines}"])]
            )

    async def after_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        messages = [{"role": r, "content": t} for r, t in _turn_messages(context)]
        if messages:
            await self.memory.add(messages, user_id=current_user(), infer=False)


class LangGraphMemory(af.ContextProvider):
    """LangGraph's PostgresStore as agent-framework memory: a vector search of the user's
    namespace before the run, the turn's messages put (one ``abatch``) after it."""

    def __init__(self, store: Any) -> None:
        super().__init__("langgraph")
        self.store = store

    async def before_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        query = _input_text(context)
        if not query:
            return
        items = await self.store.asearch(
            ("memories", current_user()), query=query, limit=PEER_TOP_K
        )
        RECALLED[0] += len(items)
        lines = "\n".join(str(item.value.get("text", "")) for item in items)
        if lines:
            context.extend_messages(
                self.source_id, [af.Message("user", [f"{MEMORIES_PROMPT}\n{lines}"])]
            )

    async def after_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        from langgraph.store.base import PutOp

        ops = [
            PutOp(("memories", current_user()), uuid.uuid4().hex, {"text": text, "role": role})
            for role, text in _turn_messages(context)
        ]
        if ops:
            await self.store.abatch(ops)


# --- the memories -----------------------------------------------------------------------------


async def open_pgmemory(settings: Settings, stack: Any, app: FastAPI) -> list[Any]:
    from bench._common.pgmemory_af import pgmemory_providers, provider_api
    from pgmemory import CollectionError, MemoryStore, make_embedder
    from pgmemory.embedders import CachedEmbedder

    free = os.environ.get("BENCH_FREE_EMBEDDER") == "1"
    base = CachedEmbedder(FreeEmbedder()) if free else make_embedder(settings)
    MODEL_CPU.wrap(base)
    embedder = TimedEmbedder(base)
    store = await MemoryStore(settings=settings, embedder=embedder).open()  # type: ignore[arg-type]
    stack.push_async_callback(store.close)
    app.state.opened = time.perf_counter()
    await embedder.warm_up()
    for name, _ in inspect.getmembers(type(store), inspect.iscoroutinefunction):
        if not name.startswith("_") and name not in {"open", "close"}:
            setattr(store, name, _timed("store", getattr(store, name)))
    try:
        await store.get_collection(COLLECTION)
    except CollectionError:
        await store.create_collection(COLLECTION)
    app.state.embedder = embedder
    app.state.store = store
    app.state.provider_api = provider_api()
    return pgmemory_providers(store, COLLECTION, current_user)


async def open_mem0(settings: Settings, stack: Any, app: FastAPI) -> list[Any]:
    from langchain_core.embeddings import Embeddings
    from mem0 import AsyncMemory
    from mem0.configs.base import MemoryConfig

    model = _peer_model()
    MODEL_CPU.wrap(model)
    embed = _timed_sync_embed(model)

    class UseEmbeddings(Embeddings):
        """The USE model behind mem0's documented custom-embedder route (LangChain)."""

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embed(texts)

        def embed_query(self, text: str) -> list[float]:
            return embed([text])[0]

    url = os.environ["BENCH_PEER_URL"]
    config = MemoryConfig(
        vector_store={"provider": "pgvector", "config": {
            "connection_string": url, "collection_name": "serve_mem0",
            "embedding_model_dims": 512, "minconn": 8, "maxconn": 10,
        }},
        embedder={"provider": "langchain", "config": {"model": UseEmbeddings()}},
        llm={"provider": "openai", "config": {"api_key": "offline-placeholder-never-called"}},
        history_db_path=os.path.join(os.environ["MEM0_DIR"], "history.db"),
    )  # fmt: skip
    memory = AsyncMemory(config)
    await asyncio.to_thread(memory.vector_store._ensure_collection)
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "CREATE INDEX IF NOT EXISTS serve_mem0_user ON serve_mem0 ((payload->>'user_id'))"
        )
    await asyncio.to_thread(model.embed_sync, ["warm-up"])
    app.state.opened = time.perf_counter()
    memory.search = _timed("store", memory.search)  # type: ignore[method-assign]
    memory.add = _timed("store", memory.add)  # type: ignore[method-assign]

    def close() -> None:
        memory.close()
        memory.vector_store.connection_pool.close()

    stack.callback(close)
    app.state.peer = memory

    async def seed(user: str, texts: list[str]) -> None:
        for text in texts:
            await memory.add([{"role": "user", "content": text}], user_id=user, infer=False)

    app.state.seed = seed
    return [af.InMemoryHistoryProvider(), Mem0Memory(memory)]


async def open_langgraph(settings: Settings, stack: Any, app: FastAPI) -> list[Any]:
    from langgraph.store.base import PutOp
    from langgraph.store.postgres.aio import AsyncPostgresStore

    model = _peer_model()
    MODEL_CPU.wrap(model)
    embed_sync = _timed_sync_embed(model)

    async def embed(texts: list[str]) -> list[list[float]]:
        return await asyncio.to_thread(embed_sync, texts)

    manager = AsyncPostgresStore.from_conn_string(
        os.environ["BENCH_PEER_URL"],
        pool_config={"min_size": 8, "max_size": 10},
        index={"dims": 512, "embed": embed, "fields": ["text"]},
    )
    store = await stack.enter_async_context(manager)
    await store.setup()
    await embed(["warm-up"])
    app.state.opened = time.perf_counter()
    store.asearch = _timed("store", store.asearch)  # type: ignore[method-assign]
    store.abatch = _timed("store", store.abatch)  # type: ignore[method-assign]
    app.state.peer = store

    async def seed(user: str, texts: list[str]) -> None:
        await store.abatch(
            [
                PutOp(("memories", user), uuid.uuid4().hex, {"text": t, "role": "user"})
                for t in texts
            ]
        )

    app.state.seed = seed
    return [af.InMemoryHistoryProvider(), LangGraphMemory(store)]


async def open_none(settings: Settings, stack: Any, app: FastAPI) -> list[Any]:
    app.state.opened = time.perf_counter()
    return [af.InMemoryHistoryProvider()]


OPENERS = {
    "pgmemory": open_pgmemory,
    "mem0": open_mem0,
    "langgraph": open_langgraph,
    "none": open_none,
}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the memory, warm the embedder, build the agent; time each step."""
    from contextlib import AsyncExitStack

    started = time.perf_counter()
    settings = Settings()
    app.state.embedder = None
    app.state.seed = None
    async with AsyncExitStack() as stack:
        providers = await OPENERS[MEMORY](settings, stack, app)
        warmed = time.perf_counter()
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else "bench"
        openai = AsyncOpenAI(
            base_url=settings.openai_base_url, api_key=key, max_retries=settings.openai_max_retries
        )
        stack.push_async_callback(openai.close)
        client = OpenAIChatCompletionClient(model=settings.openai_chat_model, async_client=openai)
        client.get_response = _timed_call("model", client.get_response)  # type: ignore[method-assign]
        app.state.agent = af.Agent(client, INSTRUCTIONS, context_providers=providers)
        app.state.sessions = {}
        app.state.turns = []
        app.state.cpu = time.process_time()
        app.state.model_cpu = MODEL_CPU.seconds
        app.state.startup = {
            "memory": MEMORY,
            "providers": [type(p).__name__ for p in providers],
            "provider_api": getattr(app.state, "provider_api", None),
            "imports_s": _IMPORTED - _T0,
            "open_s": app.state.opened - started,
            "warm_up_s": warmed - app.state.opened,
            "lifespan_s": time.perf_counter() - started,
            "batching": _batcher(app.state.embedder) is not None if MEMORY == "pgmemory" else None,
            "free_embedder": os.environ.get("BENCH_FREE_EMBEDDER") == "1",
            "python": sys.executable,
        }
        yield


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
    state = request.app.state
    try:
        session = state.sessions.get(body.session_id) if body.session_id else None
        if session is None:
            session = state.agent.create_session()
            session.state["user_id"] = x_user_id  # pgmemory's integration before issue 22
        response = await state.agent.run(body.message, session=session)
        state.sessions[session.session_id] = session
    finally:
        _user.reset(bound)
        _turn.reset(token)
    timers["turn"] = time.perf_counter() - start
    state.turns.append((timers["turn"], timers["embed"], timers["store"], timers["model"]))
    return ChatReply(session_id=session.session_id, reply=response.text)


class MemoryRequest(BaseModel):
    """One store operation of the ``memory`` scenario (no model, no history)."""

    message: str
    op: str = "search"


@app.post("/memory")
async def memory(
    body: MemoryRequest, request: Request, x_user_id: Annotated[str, Header()]
) -> dict[str, int]:
    """Add the message as a memory, or search the user's memories with it (pgmemory only)."""
    from pgmemory import MemoryRecord, MemoryScope

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


class SeedRequest(BaseModel):
    """A peer's seed memories: ``texts`` for each user."""

    users: dict[str, list[str]]


@app.post("/seed")
async def seed(body: SeedRequest, request: Request) -> dict[str, int]:
    """Store the users' memories through the peer's own API (8 users at a time)."""
    seed_user = request.app.state.seed
    if seed_user is None:
        return {"rows": 0}
    gate = asyncio.Semaphore(8)

    async def one(user: str, texts: list[str]) -> None:
        async with gate:
            await seed_user(user, texts)

    await asyncio.gather(*(one(u, t) for u, t in body.users.items()))
    return {"rows": sum(len(t) for t in body.users.values())}


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
        "peer_recalled_memories": RECALLED[0] if MEMORY in ("mem0", "langgraph") else None,
    }
    if reset:
        RECALLED[0] = 0
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
