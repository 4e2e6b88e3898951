"""Driver errors come out as pgmemory errors that say what happened (issue 56).

A write's connection is lost on purpose, deterministically: a trigger the test creates makes
the write's backend sleep (``pg_sleep``) at a chosen point, and a separate connection of the
server's owner ends that backend (``pg_terminate_backend``) once ``pg_stat_activity`` shows it
sleeping there:

* before the COMMIT: a ``BEFORE INSERT`` trigger sleeps inside a statement of a shared
  transaction whose COMMIT is sent later; the client knows nothing was committed;
* during the COMMIT: a ``DEFERRABLE INITIALLY DEFERRED`` constraint trigger runs (and sleeps)
  while the server commits; the client has sent the commit and gets no reply, so for it the
  outcome is unknown (the server, killed before it committed, stored nothing);
* after the COMMIT: a proxy between the store and the server forwards everything until the
  server's reply to the commit, which it swallows before closing the connection; the server
  committed, the client gets no reply: the outcome is unknown, and the data is there.

In each case a retry with the same message ids stores each message once.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory import ChatHistoryMemoryProvider, MemoryRecord, MemoryScope, PostgresHistoryProvider
from pgmemory.errors import (
    ConnectionLostError,
    DatabaseError,
    DatabaseUnavailableError,
    PgMemoryError,
    StatementTimeoutError,
)
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore
from tests.agents import agent
from tests.conftest import unique
from tests.openai_server import OpenAIServer, text
from tests.servers import free_port

DIM = 3


# --- a backend that sleeps where the test says, and its end ---------------------------------


@contextlib.asynccontextmanager
async def sleeping_insert(
    owner: AsyncEngine, user: str, *, message_id: str | None = None, at_commit: bool = False
) -> AsyncIterator[None]:
    """While the block runs, inserting a chat message of ``user`` (only ``message_id``, if
    given) sleeps in the inserting backend: in the INSERT itself, or (``at_commit``) in a
    deferred constraint trigger, which the server runs while it commits."""
    name = f"pgmemory_test_sleep_{uuid.uuid4().hex[:10]}"
    condition = f"NEW.user_id = '{user}'"
    if message_id is not None:
        condition += f" AND NEW.message_id = '{message_id}'"
    returns = "NULL" if at_commit else "NEW"
    kind = (
        "CONSTRAINT TRIGGER {n} AFTER INSERT ON pgmemory_chat_messages "
        "DEFERRABLE INITIALLY DEFERRED"
        if at_commit
        else "TRIGGER {n} BEFORE INSERT ON pgmemory_chat_messages"
    ).format(n=name)
    async with owner.begin() as conn:
        await conn.execute(
            sa.text(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"IF {condition} THEN PERFORM pg_sleep(20); END IF; RETURN {returns}; END $$"
            )
        )
        await conn.execute(sa.text(f"CREATE {kind} FOR EACH ROW EXECUTE FUNCTION {name}()"))
    try:
        yield
    finally:
        async with owner.begin() as conn:
            await conn.execute(sa.text(f"DROP TRIGGER {name} ON pgmemory_chat_messages"))
            await conn.execute(sa.text(f"DROP FUNCTION {name}()"))


def _end_the_sleeper(server_url: str, database: str) -> int:
    """End the pgmemory backend of ``database`` that sleeps in ``pg_sleep`` (wait for it to
    start sleeping, then for it to be gone); returns its pid."""
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        deadline = time.monotonic() + 15
        with admin.connect() as conn:
            while True:
                pid = conn.execute(
                    sa.text(
                        "SELECT pid FROM pg_stat_activity WHERE datname = :db "
                        "AND application_name = 'pgmemory' AND wait_event = 'PgSleep'"
                    ),
                    {"db": database},
                ).scalar()
                if pid is not None:
                    break
                assert time.monotonic() < deadline, "no pgmemory backend started sleeping"
                time.sleep(0.01)
            ended = conn.execute(sa.text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
            assert ended.scalar_one(), "the sleeping backend did not end"
            return int(pid)
    finally:
        admin.dispose()


@contextlib.asynccontextmanager
async def ending_the_sleeper(server_url: str, store_url: str) -> AsyncIterator[None]:
    """While the block runs, a thread ends the store's sleeping backend once it sleeps."""
    database = make_url(store_url).database or ""
    ender = asyncio.ensure_future(asyncio.to_thread(_end_the_sleeper, server_url, database))
    try:
        yield
    finally:
        await ender  # raises when no backend slept


# --- a proxy that swallows the commit's reply ---------------------------------------------------


class CommitReplyDropper:
    """A TCP proxy in front of the test server. Armed, it forwards nothing more from the
    server: it reads the server's reply up to its ReadyForQuery (the server has committed
    by then), and closes the client's connection without passing any of it on."""

    def __init__(self, server_url: str) -> None:
        url = make_url(server_url)
        host = str(url.query.get("host") or url.host or "localhost")
        self._unix = f"{host}/.s.PGSQL.{url.port or 5432}" if host.startswith("/") else None
        self._tcp = (host, url.port or 5432)
        self.armed = False
        self.dropped = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._clients: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> CommitReplyDropper:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def arm(self) -> None:
        """Swallow the server's next reply, and close the client's connection."""
        self.armed = True

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def url(self, store_url: str) -> str:
        """``store_url`` (its user, password and database) through this proxy."""
        url = make_url(store_url)
        query = {k: v for k, v in url.query.items() if k != "host"} | {"sslmode": "disable"}
        moved = url.set(host="127.0.0.1", port=self.port, query=query)
        return moved.render_as_string(hide_password=False)

    async def stop(self) -> None:
        """Refuse new connections and drop every open one."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._clients):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self._unix is not None:
            server_r, server_w = await asyncio.open_unix_connection(self._unix)
        else:
            server_r, server_w = await asyncio.open_connection(*self._tcp)
        self._clients.add(client_w)
        for pump in (self._forward(client_r, server_w), self._reply(server_r, client_w, server_w)):
            task = asyncio.ensure_future(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _reply(
        self,
        reader: asyncio.StreamReader,
        client: asyncio.StreamWriter,
        server: asyncio.StreamWriter,
    ) -> None:
        held = b""
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if not self.armed:
                    client.write(data)
                    await client.drain()
                    continue
                held += data
                if _ready_for_query(held):
                    self.armed = False
                    self.dropped += 1
                    client.transport.abort()
                    server.transport.abort()
                    return
        client.close()


def _ready_for_query(stream: bytes) -> bool:
    """Whether ``stream`` (server messages from a message boundary) holds a ReadyForQuery."""
    at = 0
    while at + 5 <= len(stream):
        kind = stream[at : at + 1]
        (length,) = struct.unpack("!i", stream[at + 1 : at + 5])
        if at + 1 + length > len(stream):
            return False
        if kind == b"Z":
            return True
        at += 1 + length
    return False


# --- what is stored -----------------------------------------------------------------------------


def _turn(user: str, session: str) -> tuple[list[dict[str, Any]], list[MemoryRecord]]:
    """A turn's history messages and memories, each with its message id."""
    messages = [
        {"message_id": "m1", "role": "user", "text": "I like green tea"},
        {"message_id": "m2", "role": "assistant", "text": "Noted."},
    ]
    scope = MemoryScope(user_id=user, session_id=session)
    memories = [
        MemoryRecord(content=str(m["text"]), scope=scope, message_id=str(m["message_id"]),
                     embedding=[1, 0, i])
        for i, m in enumerate(messages)
    ]  # fmt: skip
    return messages, memories


async def _write_turn(
    store: MemoryStore,
    collection: str,
    user: str,
    session: str,
    *,
    deferred: bool,
    before_commit: Callable[[], None] = lambda: None,
) -> None:
    """The turn's writes in one shared transaction (``before_commit`` called at its end)."""
    messages, memories = _turn(user, session)
    async with store.shared_transaction(deferred=deferred):
        await store.append_history(session, messages, user_id=user)
        await store.add(collection, memories)
        before_commit()


async def _stored(store: MemoryStore, collection: str, user: str, session: str) -> tuple[int, int]:
    """(history messages, memories) of the turn's session."""
    scope = MemoryScope(user_id=user, session_id=session)
    return (
        await store.count_history(session, user_id=user),
        await store.count(collection, scope),
    )


@pytest.fixture
async def collection_3d(store: MemoryStore) -> str:
    name = f"d_{uuid.uuid4().hex[:10]}"
    await store.create_collection(name, dimensions=DIM, embedding_model="test")
    return name


def _says_nothing_personal(error: BaseException, *values: str) -> None:
    """``error`` names none of ``values``, and its cause is the driver's error (raised once:
    translated at one boundary, not again above it)."""
    for value in values:
        assert value not in str(error) and value not in repr(error), value
    cause = error.__cause__
    assert isinstance(cause, (DBAPIError, psycopg.Error)), repr(cause)
    assert not isinstance(cause, PgMemoryError), repr(cause)


# --- (a) before the COMMIT ----------------------------------------------------------------------


async def test_a_write_killed_before_its_commit_is_not_stored_and_its_retry_stores_it_once(
    store: MemoryStore,
    store_url: str,
    server_url: str,
    owner_engine: AsyncEngine,
    collection_3d: str,
) -> None:
    user, session = unique("u"), unique("s")
    messages, memories = _turn(user, session)
    async with sleeping_insert(owner_engine, user, message_id="m2"):
        with pytest.raises(ConnectionLostError) as raised:
            async with ending_the_sleeper(server_url, store_url), store.shared_transaction():
                await store.add(collection_3d, memories)  # sent: the transaction is open
                await store.append_history(session, messages, user_id=user)  # sleeps
    lost = raised.value
    print(f"{type(lost).__name__}: {lost}")
    assert (lost.step, lost.outcome) == ("statement", "not stored")
    assert "not stored" in str(lost) and "same message ids" in str(lost)
    _says_nothing_personal(lost, user, session, "green tea")
    # what callers caught before stays true: SQLAlchemy's class, the driver's error inside
    assert isinstance(lost, DBAPIError) and lost.connection_invalidated
    assert isinstance(lost.__cause__, DBAPIError) and isinstance(lost.orig, psycopg.Error)
    assert await _stored(store, collection_3d, user, session) == (0, 0)
    for _ in range(2):  # the retry, and a retry of the retry
        await _write_turn(store, collection_3d, user, session, deferred=False)
        assert await _stored(store, collection_3d, user, session) == (2, 2)


# --- (b) during the COMMIT ----------------------------------------------------------------------


@pytest.mark.parametrize("deferred", [True, False], ids=["deferred", "joined"])
async def test_a_write_killed_during_its_commit_has_an_unknown_outcome_and_a_safe_retry(
    store: MemoryStore,
    store_url: str,
    server_url: str,
    owner_engine: AsyncEngine,
    collection_3d: str,
    deferred: bool,
) -> None:
    """Deferred: the turn's rows and its commit are one round trip (what an agent turn
    sends); joined: the rows are sent first, then COMMIT on its own."""
    user, session = unique("u"), unique("s")
    async with sleeping_insert(owner_engine, user, at_commit=True):
        with pytest.raises(ConnectionLostError) as raised:
            async with ending_the_sleeper(server_url, store_url):
                await _write_turn(store, collection_3d, user, session, deferred=deferred)
    lost = raised.value
    print(f"{type(lost).__name__}: {lost}")
    assert (lost.step, lost.outcome) == ("commit", "unknown")
    assert "unknown" in str(lost) and "same message ids" in str(lost)
    _says_nothing_personal(lost, user, session)
    # The server was ended while it committed: it stored nothing (the client cannot know that).
    assert await _stored(store, collection_3d, user, session) == (0, 0)
    for _ in range(2):
        await _write_turn(store, collection_3d, user, session, deferred=deferred)
        assert await _stored(store, collection_3d, user, session) == (2, 2)


# --- after the COMMIT ---------------------------------------------------------------------------


async def test_a_commit_whose_reply_is_lost_is_stored_and_its_retry_stores_each_message_once(
    store_url: str, server_url: str
) -> None:
    user, session = unique("u"), unique("s")
    collection = f"d_{uuid.uuid4().hex[:10]}"
    async with (
        CommitReplyDropper(server_url) as proxy,
        MemoryStore(proxy.url(store_url)) as store,
    ):
        await store.create_collection(collection, dimensions=DIM, embedding_model="test")
        with pytest.raises(ConnectionLostError) as raised:
            await _write_turn(
                store, collection, user, session, deferred=True, before_commit=proxy.arm
            )
        assert proxy.dropped == 1
        lost = raised.value
        print(f"{type(lost).__name__}: {lost}")
        assert (lost.step, lost.outcome) == ("commit", "unknown")
        _says_nothing_personal(lost, user, session)
        # The server committed before its reply was dropped: the turn is stored ...
        assert await _stored(store, collection, user, session) == (2, 2)
        # ... and a retry with the same message ids stores nothing twice.
        await _write_turn(store, collection, user, session, deferred=True)
        assert await _stored(store, collection, user, session) == (2, 2)


# --- (c) a wrong URL ----------------------------------------------------------------------------


@pytest.mark.parametrize("migrate", [False, True], ids=["open", "migrate"])
async def test_a_wrong_port_names_the_setting_and_hides_the_password(migrate: bool) -> None:
    port = free_port()  # nothing listens there
    url = f"postgresql://bob:s3cr3t-pw@127.0.0.1:{port}/db"
    settings = Settings(_env_file=None, connect_timeout_s=2)  # type: ignore[call-arg]
    with pytest.raises(DatabaseUnavailableError) as raised:
        async with MemoryStore(url, settings=settings, migrate=migrate) as store:
            await store.count("notes", MemoryScope(user_id="alice"))
    error = raised.value
    print(f"{type(error).__name__}: {error}")
    assert str(error).startswith(f"cannot connect to PostgreSQL at 127.0.0.1:{port}")
    assert "PGMEMORY_DATABASE_URL" in str(error) and "bob:***@127.0.0.1" in str(error)
    _says_nothing_personal(error, "s3cr3t-pw")
    assert error.step == "connect" and error.outcome == "not stored"
    assert isinstance(error, sa.exc.OperationalError)  # as before: the driver's class
    assert isinstance(error.__cause__, DBAPIError)


async def test_a_missing_database_is_named_with_its_fix(database_url: str) -> None:
    url = make_url(database_url).set(database="pgmemory_no_such_database")
    with pytest.raises(DatabaseUnavailableError) as raised:
        async with MemoryStore(url.render_as_string(hide_password=False)):
            pass
    print(f"{type(raised.value).__name__}: {raised.value}")
    _says_nothing_personal(raised.value)
    assert "database 'pgmemory_no_such_database' does not exist" in str(raised.value)
    assert "PGMEMORY_DATABASE_URL" in str(raised.value)


async def test_a_server_gone_after_opening_names_the_setting_for_every_verb(
    store_url: str, server_url: str
) -> None:
    """Once open, a call that needs a new connection and cannot make one (the fast path's
    raw checkout, and SQLAlchemy's) gets the same error, naming the URL, password hidden."""
    collection = f"d_{uuid.uuid4().hex[:10]}"
    scope = MemoryScope(user_id=unique("u"))
    async with (
        CommitReplyDropper(server_url) as proxy,
        MemoryStore(proxy.url(store_url)) as store,
    ):
        await store.create_collection(collection, dimensions=DIM, embedding_model="test")
        port = proxy.port
        await store.database.connections.held.close()
        await proxy.stop()
        await store.engine.dispose()
        calls = {
            "add": lambda: store.add(collection, [MemoryRecord(content="x", scope=scope,
                                                               embedding=[1, 0, 0])]),
            "search": lambda: store.search(collection, scope, vector=[1, 0, 0]),
            "count": lambda: store.count(collection, scope),
            "history": lambda: store.append_history(
                "s", [{"message_id": "m", "role": "user"}], user_id=scope.user_id or ""
            ),
        }  # fmt: skip
        for name, call in calls.items():
            with pytest.raises(DatabaseUnavailableError) as raised:
                await call()
            print(f"{name}: {type(raised.value).__name__}: {raised.value}")
            assert f"127.0.0.1:{port}" in str(raised.value), name
            assert "PGMEMORY_DATABASE_URL" in str(raised.value), name
            assert raised.value.outcome == "not stored", name
            if make_url(store_url).password:
                password = make_url(store_url).password
                _says_nothing_personal(raised.value, *([str(password)] if password else []))


# --- (d) an agent-framework turn ----------------------------------------------------------------


async def test_an_agent_turn_whose_connection_dies_mid_write_raises_the_pgmemory_error(
    store: MemoryStore,
    store_url: str,
    server_url: str,
    owner_engine: AsyncEngine,
    collection: str,
    openai_server: OpenAIServer,
) -> None:
    user = unique("alice")
    memory = ChatHistoryMemoryProvider(store, collection, user_id=user)
    history = PostgresHistoryProvider(store, user_id=user)
    runner = agent(openai_server, history, memory)
    session = runner.create_session(session_id=unique("s"))
    openai_server.queue(text("Noted."))
    async with sleeping_insert(owner_engine, user):
        with pytest.raises(PgMemoryError) as raised:
            async with ending_the_sleeper(server_url, store_url):
                await runner.run("I like green tea", session=session)
    lost = raised.value
    print(f"{type(lost).__name__}: {lost}")
    assert isinstance(lost, ConnectionLostError) and not isinstance(lost, psycopg.Error)
    assert (lost.step, lost.outcome) == ("commit", "unknown")
    _says_nothing_personal(lost, user, "green tea")
    assert await store.count_history(session.session_id, user_id=user) == 0
    # The next turn is stored.
    openai_server.queue(text("Noted again."))
    await runner.run("I like black tea too", session=session)
    assert await store.count_history(session.session_id, user_id=user) == 2


# --- the other driver errors --------------------------------------------------------------------


async def test_a_statement_timeout_names_the_setting(
    store_url: str, owner_engine: AsyncEngine
) -> None:
    user = unique("u")
    settings = Settings(_env_file=None, statement_timeout_ms=100)  # type: ignore[call-arg]
    async with sleeping_insert(owner_engine, user), MemoryStore(store_url, settings=settings) as s:
        with pytest.raises(StatementTimeoutError) as raised:
            await s.append_history("s", [{"message_id": "m", "role": "user"}], user_id=user)
        # the server refused it: nothing of it is stored
        assert await s.count_history("s", user_id=user) == 0
    print(f"{type(raised.value).__name__}: {raised.value}")
    assert "PGMEMORY_STATEMENT_TIMEOUT_MS" in str(raised.value)
    assert raised.value.outcome == "not stored"
    assert isinstance(raised.value, sa.exc.OperationalError)
    _says_nothing_personal(raised.value, user)


async def test_a_refused_write_is_a_database_error_of_the_drivers_class_and_pickles(
    store: MemoryStore, collection: str, poisoned_memories: str
) -> None:
    scope = MemoryScope(user_id=unique("u"))
    with pytest.raises(DatabaseError, match="poisoned row") as raised:
        await store.add(collection, [MemoryRecord(content=poisoned_memories, scope=scope)])
    error = raised.value
    print(f"{type(error).__name__}: {error}")
    assert error.outcome == "not stored" and error.step == "statement"
    assert isinstance(error, DBAPIError) and not error.connection_invalidated
    assert "P0001" in str(error)
    _says_nothing_personal(error, scope.user_id or "")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert (copy.step, copy.outcome) == (error.step, error.outcome)


def test_the_errors_are_pgmemory_errors() -> None:
    for kind in (ConnectionLostError, DatabaseUnavailableError, StatementTimeoutError):
        assert issubclass(kind, DatabaseError) and issubclass(kind, PgMemoryError)
