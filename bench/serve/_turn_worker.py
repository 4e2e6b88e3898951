"""One side of bench/serve/turn_ab.py: a checkout's default providers, driven hook by hook.

Run by turn_ab.py as ``python _turn_worker.py`` with ``PYTHONPATH`` naming the checkout whose
``pgmemory`` it measures (the current one, or an older one extracted with ``git archive``), so
it imports nothing of ``bench`` but ``bench/_common/pgmemory_af.py``, loaded by path. It reads
one JSON command a line on stdin and answers one JSON line on stdout (diagnostics on stderr).

Providers: the default pair, ``PostgresHistoryProvider`` + ``ChatHistoryMemoryProvider``
(storage scope user + session, search scope the user), through the checkout's default runtime:

* ``own``: pgmemory's own runtime (``pgmemory.Agent``; as at 026b354): recall is the agent's
  ``_prepare`` (every provider's ``before_run`` in list order), store its ``_finish`` (every
  ``after_run`` inside the providers' units of work);
* ``af``: ``agent_framework.Agent``: recall is each provider's ``before_run`` in list order with
  the provider-scoped state, as the framework's run does; store is the framework's own
  ``Agent._run_after_providers`` (reverse order), built by ``pgmemory_af.pgmemory_providers``.

Embedding: a deterministic hash embedder (512-d unit vectors seeded by the text), the same on
both sides, so the figures are the providers' SQL and Python, not a model.

Statements are counted by a PostgreSQL wire-protocol proxy in this process (a Unix socket in a
temporary folder, forwarding to the real server): every simple ``Query`` and every extended
``Execute`` the client sends is a statement reaching the server, whatever sent it (SQLAlchemy,
psycopg directly, a pipeline); ``Sync`` + ``Query`` messages are the round trips. Counted turns
go through a second store opened on the proxy and are never timed.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import random
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

COLLECTION = "turn_ab"
DIMS = 512
INSTRUCTIONS = "You are a helpful assistant. Use what you remember about the user."
_PROSE = (
    "I usually cook dinner around seven and I can't eat anything spicy because of my stomach; "
    "my daughter starts school in September and we are looking for a flat closer to the park. "
    "Can you remind me what I said about the budget meeting, the dentist appointment, the "
    "train tickets to Lyon, my sister's birthday present and the new project at work?"
)
VOCABULARY = _PROSE.split()
_AF_HELPER = Path(__file__).resolve().parents[1] / "_common" / "pgmemory_af.py"


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# --- embedder -------------------------------------------------------------------------------


def hash_vector(text: str) -> np.ndarray:
    """A unit vector seeded by the text's hash (equal texts, equal vectors)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32)
    return v / np.linalg.norm(v)


class HashEmbedder:
    """The store's embedder on both sides: no model, deterministic."""

    model_id = "bench/hash-512"
    dimensions = DIMS

    async def embed(self, texts: Any) -> np.ndarray:
        return np.array([hash_vector(t) for t in texts], dtype=np.float32).reshape(-1, DIMS)


def seed_text(user: str, i: int) -> str:
    rng = random.Random(f"{user}/{i}")
    return " ".join(rng.choices(VOCABULARY, k=18))


# --- statement counting proxy -----------------------------------------------------------------


class Counts:
    """Statements and round trips per bucket, and the kinds of statements seen."""

    def __init__(self) -> None:
        self.bucket = "(idle)"
        self.statements: Counter[str] = Counter()
        self.round_trips: Counter[str] = Counter()
        self.kinds: dict[str, Counter[str]] = {}

    def statement(self, sql: str) -> None:
        self.statements[self.bucket] += 1
        words = sql.strip().split(None, 1)
        kind = words[0].upper() if words else "?"
        self.kinds.setdefault(self.bucket, Counter())[kind] += 1

    def reset(self) -> None:
        self.statements.clear()
        self.round_trips.clear()
        self.kinds.clear()


class _Parser:
    """The client side of one connection's wire protocol, counting what it sends."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.buffer = b""
        self.started = False
        self.statements: dict[bytes, str] = {}  # prepared statement name -> SQL
        self.portals: dict[bytes, str] = {}  # portal name -> SQL

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    return
                (length,) = struct.unpack("!I", self.buffer[:4])
                if len(self.buffer) < length:
                    return
                (code,) = struct.unpack("!I", self.buffer[4:8])
                self.buffer = self.buffer[length:]
                if code not in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not yet
                    self.started = True
                continue
            if len(self.buffer) < 5:
                return
            kind = self.buffer[:1]
            (length,) = struct.unpack("!I", self.buffer[1:5])
            if len(self.buffer) < 1 + length:
                return
            body = self.buffer[5 : 1 + length]
            self.buffer = self.buffer[1 + length :]
            self.message(kind, body)

    def message(self, kind: bytes, body: bytes) -> None:
        c = self.counts
        if kind == b"Q":
            sql = body.rstrip(b"\0").decode(errors="replace")
            c.round_trips[c.bucket] += 1
            for part in (p for p in sql.split(";") if p.strip()):
                c.statement(part)
        elif kind == b"P":
            name, rest = body.split(b"\0", 1)
            self.statements[name] = rest.split(b"\0", 1)[0].decode(errors="replace")
        elif kind == b"B":
            portal, rest = body.split(b"\0", 1)
            name = rest.split(b"\0", 1)[0]
            self.portals[portal] = self.statements.get(name, "?")
        elif kind == b"E":
            portal = body.split(b"\0", 1)[0]
            c.statement(self.portals.get(portal, "?"))
        elif kind == b"S":
            c.round_trips[c.bucket] += 1


class Proxy:
    """A Unix-socket proxy in front of the server, feeding every client byte to a parser."""

    def __init__(self, counts: Counts, upstream: tuple[str, int]) -> None:
        self.counts = counts
        self.upstream = upstream
        self.folder = tempfile.mkdtemp(prefix="turn-ab-proxy-")
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = os.path.join(self.folder, f".s.PGSQL.{self.upstream[1]}")
        self.server = await asyncio.start_unix_server(self.handle, path=path)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, port = self.upstream
        if host.startswith("/"):
            return await asyncio.open_unix_connection(os.path.join(host, f".s.PGSQL.{port}"))
        return await asyncio.open_connection(host, port)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await self._open()
        parser = _Parser(self.counts)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, parse: bool) -> None:
            try:
                while data := await src.read(65536):
                    if parse:
                        parser.feed(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


def proxied(url: str, folder: str) -> tuple[str, tuple[str, int]]:
    """``url`` through the proxy's folder, and the upstream (host or socket folder, port)."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    host = u.query.get("host") or u.host or "localhost"
    if isinstance(host, tuple):
        host = host[0]
    port = int(u.port or u.query.get("port") or 5432)
    query = {k: v for k, v in u.query.items() if k not in ("host", "port")}
    query["host"] = folder
    query["sslmode"] = "disable"
    return (
        u.set(host=None, port=port, query=query).render_as_string(hide_password=False),
        (host, port),
    )


# --- sides ------------------------------------------------------------------------------------


def _settings() -> Any:
    from pgmemory import Settings

    return Settings(_env_file=None)  # type: ignore[call-arg]


class Side:
    """The providers of one checkout on one store, and how its runtime drives them."""

    flavour = ""

    def __init__(self, store: Any, counts: Counts | None) -> None:
        self.store = store
        self.counts = counts

    def names(self) -> list[str]:
        return [type(p).__name__ for p in self.providers]

    def _wrap(self, provider: Any, hook: str) -> None:
        """Count what ``provider.<hook>`` sends under (its class, hook)."""
        counts = self.counts
        if counts is None:
            return
        method = getattr(provider, hook)
        label = f"{type(provider).__name__}/{hook}"

        async def counted(*args: Any, **kwargs: Any) -> Any:
            outer, counts.bucket = counts.bucket, label
            try:
                return await method(*args, **kwargs)
            finally:
                for _ in range(3):
                    await asyncio.sleep(0)  # let the proxy read what was sent
                counts.bucket = outer

        setattr(provider, hook, counted)

    def _wrap_all(self) -> None:
        for p in self.providers:
            self._wrap(p, "before_run")
            self._wrap(p, "after_run")


class OwnRuntime(Side):
    """pgmemory's own runtime (pgmemory.Agent), as the default path was before issue 22."""

    flavour = "own"

    def __init__(self, store: Any, counts: Counts | None) -> None:
        super().__init__(store, counts)
        from pgmemory import ChatHistoryMemoryProvider, MemoryScope, PostgresHistoryProvider
        from pgmemory.runtime.agent import Agent

        class NoModel:
            async def get_response(self, *args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("the A/B never calls the model")

        def per_user(session: Any) -> Any:
            user = session.state["user_id"]
            return ChatHistoryMemoryProvider.State(
                storage_scope=MemoryScope(user_id=user, session_id=session.session_id),
                search_scope=MemoryScope(user_id=user),
            )

        self.providers = [
            PostgresHistoryProvider(store),
            ChatHistoryMemoryProvider(store, COLLECTION, state_initializer=per_user),
        ]
        self._wrap_all()
        self.agent = Agent(NoModel(), INSTRUCTIONS, context_providers=self.providers)

    async def recall(self, user: str, session_id: str, text: str) -> Any:
        from pgmemory.runtime.session import AgentSession

        session = AgentSession(session_id, state={"user_id": user})
        _, context = await self.agent._prepare(text, session, ())
        return session, context

    async def store_turn(self, turn: Any, reply: str) -> None:
        from pgmemory.runtime.agent import AgentResponse
        from pgmemory.runtime.messages import Message

        session, context = turn
        context.response = AgentResponse(
            messages=[Message("assistant", reply)], session_id=session.session_id
        )
        await self.agent._finish(session, context)


class FrameworkRuntime(Side):
    """``agent_framework.Agent`` with the checkout's agent-framework providers."""

    flavour = "af"

    def __init__(self, store: Any, counts: Counts | None) -> None:
        super().__init__(store, counts)
        import agent_framework as af
        from agent_framework.openai import OpenAIChatCompletionClient

        spec = importlib.util.spec_from_file_location("pgmemory_af", _AF_HELPER)
        assert spec is not None and spec.loader is not None
        helper = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helper)
        self.api = helper.provider_api()
        self.users: dict[str, str] = {}
        self.providers = helper.pgmemory_providers(
            store, COLLECTION, lambda session: self.users[session.session_id]
        )
        self._wrap_all()
        client = OpenAIChatCompletionClient(
            model="never-called", base_url="http://127.0.0.1:9/v1", api_key="offline"
        )
        self.agent = af.Agent(client, INSTRUCTIONS, context_providers=self.providers)
        self.af = af

    async def recall(self, user: str, session_id: str, text: str) -> Any:
        af = self.af
        self.users[session_id] = user
        session = af.AgentSession(session_id=session_id)
        session.state["user_id"] = user  # the integration before issue 22 reads it here
        context = af.SessionContext(
            session_id=session_id, input_messages=[af.Message("user", [text])]
        )
        for provider in self.agent.context_providers:
            if isinstance(provider, af.HistoryProvider) and not provider.load_messages:
                continue
            await provider.before_run(
                agent=self.agent,
                session=session,
                context=context,
                state=session.state.setdefault(provider.source_id, {}),
            )
        return session, context

    async def store_turn(self, turn: Any, reply: str) -> None:
        af = self.af
        session, context = turn
        context._response = af.AgentResponse(messages=[af.Message("assistant", [reply])])
        await self.agent._run_after_providers(session=session, context=context)


def make_side(flavour: str, store: Any, counts: Counts | None) -> Side:
    if flavour == "auto":
        try:
            import agent_framework  # noqa: F401

            import pgmemory.integrations.agent_framework  # noqa: F401

            flavour = "af"
        except ImportError:
            flavour = "own"
    return (OwnRuntime if flavour == "own" else FrameworkRuntime)(store, counts)


# --- commands ---------------------------------------------------------------------------------


def pin_migrations() -> str:
    """``pgmemory.migrations`` from the same checkout as ``pgmemory`` (an editable install's
    finder would otherwise map it to the installed checkout's folder, whatever PYTHONPATH
    says, and run that checkout's migrations on this side's database)."""
    import pgmemory

    folder = Path(pgmemory.__file__).resolve().parents[1] / "migrations"
    if (folder / "__init__.py").is_file():
        spec = importlib.util.spec_from_file_location(
            "pgmemory.migrations", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["pgmemory.migrations"] = module
        spec.loader.exec_module(module)
    migrations = importlib.import_module("pgmemory.migrations")
    return str(Path(migrations.__file__ or "").parent)


class Worker:
    def __init__(self) -> None:
        self.counts = Counts()
        self.proxy: Proxy | None = None

    async def migrate(self, url: str) -> dict[str, Any]:
        """This checkout's migrations on ``url`` (in a thread: alembic runs its own loop)."""
        from pgmemory.store import migrate

        folder = pin_migrations()
        await asyncio.to_thread(migrate.upgrade, url)
        return {"migrations": folder, "head": migrate.head_revision()}

    async def app_role(self, url: str, name: str) -> dict[str, Any]:
        """A least-privilege application role on ``url``'s database, made by this checkout's
        own ``Admin.create_app_role`` (as ``pgmemory db roles`` would), and its URL."""
        from sqlalchemy.engine import make_url

        from pgmemory import MemoryStore
        from pgmemory.admin import Admin

        password = f"{name}-bench-password"
        async with MemoryStore(url, settings=_settings(), embedder=HashEmbedder()) as owner:  # type: ignore[arg-type]
            await Admin(owner).create_app_role(name, password)
        role_url = make_url(url).set(username=name, password=password)
        return {"url": role_url.render_as_string(hide_password=False), "role": name}

    async def setup(self, url: str, flavour: str) -> dict[str, Any]:
        import pgmemory
        from pgmemory import MemoryStore

        self.store = await MemoryStore(url, settings=_settings(), embedder=HashEmbedder()).open()  # type: ignore[arg-type]
        await self.store.create_collection(COLLECTION)  # the embedder's model and size
        self.side = make_side(flavour, self.store, None)
        _, upstream = proxied(url, "")
        self.proxy = Proxy(self.counts, upstream)
        await self.proxy.start()
        counted_url, _ = proxied(url, self.proxy.folder)
        self.counted_store = await MemoryStore(
            counted_url,
            settings=_settings(),
            embedder=HashEmbedder(),  # type: ignore[arg-type]
        ).open()
        self.counted = make_side(self.side.flavour, self.counted_store, self.counts)
        return {
            "pgmemory": pgmemory.__file__,
            "flavour": self.side.flavour,
            "api": getattr(self.side, "api", "pgmemory.Agent"),
            "providers": self.side.names(),
        }

    async def seed(self, users: list[str], size: int) -> dict[str, Any]:
        from pgmemory import MemoryRecord, MemoryScope

        records = [
            MemoryRecord(
                content=seed_text(u, i),
                scope=MemoryScope(user_id=u, session_id=f"seed-{u}-{i // 20}"),
                role="user" if i % 2 == 0 else "assistant",
                embedding=hash_vector(seed_text(u, i)),
            )
            for u in users
            for i in range(size)
        ]
        t = time.perf_counter()
        await self.store.import_records(COLLECTION, records)
        return {"rows": len(records), "seconds": time.perf_counter() - t}

    async def turn(
        self, user: str, session_id: str, text: str, reply: str, counted: bool
    ) -> dict[str, Any]:
        side = self.counted if counted else self.side
        if counted:
            self.counts.reset()
            self.counts.bucket = "(runtime)/before_run"
        t0 = time.perf_counter()
        turn = await side.recall(user, session_id, text)
        t1 = time.perf_counter()
        if counted:
            self.counts.bucket = "(runtime)/after_run"
        await side.store_turn(turn, reply)
        t2 = time.perf_counter()
        out: dict[str, Any] = {"recall_ms": (t1 - t0) * 1000, "store_ms": (t2 - t1) * 1000}
        if counted:
            for _ in range(5):
                await asyncio.sleep(0.01)  # anything sent after the hooks returned
            out["statements"] = dict(self.counts.statements)
            out["round_trips"] = dict(self.counts.round_trips)
            out["kinds"] = {k: dict(v) for k, v in self.counts.kinds.items()}
            context = turn[1]
            out["injected"] = sum(len(v) for v in _context_messages(context).values())
        return out

    async def close(self) -> dict[str, Any]:
        for name in ("store", "counted_store"):
            if hasattr(self, name):
                await getattr(self, name).close()
        if self.proxy is not None:
            await self.proxy.close()
        return {}


def _context_messages(context: Any) -> dict[str, list[Any]]:
    messages = getattr(context, "context_messages", None)
    if isinstance(messages, dict):
        return messages
    return {"all": list(context.get_messages())} if hasattr(context, "get_messages") else {}


async def main() -> None:
    worker = Worker()
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        command = json.loads(line)
        op = command.pop("op")
        try:
            answer = await getattr(worker, op)(**command)
            reply: dict[str, Any] = {"ok": True, **answer}
        except Exception as exc:  # reported to the parent, which stops the run
            import traceback

            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
        if op == "close":
            break


if __name__ == "__main__":
    asyncio.run(main())
