"""Every statement pgmemory sends on its search, recall and write paths, as the server receives
it, against a golden file per deployment (issue 56, "must hold: statements at the wire").

One fixed script (:data:`STEPS`) runs through a wire-protocol proxy (``tests/wire_proxy.py``):
opening the store, a batch ``add``, a search in each mode with and without its audit row,
``recall`` (what the providers inject), ``record_recall``, appending and reading chat history,
one agent-framework turn through ``PostgresHistoryProvider`` + ``ChatHistoryMemoryProvider``
(on the scripted OpenAI-protocol server), ``delete`` and ``erase_user``. For each statement the
golden file holds the connection and round trip it went on, how it was sent (simple query,
unnamed or named ``Parse``, or a prepared statement run again), the parameter types its
``Parse`` declared (named through ``pg_type``), and its SQL with each whitespace run made one
space; nothing else of the SQL is touched. The script's ids are fixed, so no literal needs
rewriting; prepared statements' names are never recorded.

Deployments, one golden file each under ``tests/golden/``:

* ``read-committed``: one server at its default isolation;
* ``repeatable-read``: one server whose database defaults to REPEATABLE READ
  (``default_transaction_isolation``: pgmemory has no isolation setting of its own, it reads
  the server's);
* ``replicas``: a primary and a streaming hot standby (``read_urls``); before each step the
  standby has replayed everything, so which server serves a read does not depend on timing;
* ``citus``: a coordinator and two workers, only under ``PGMEMORY_TEST_CITUS`` (``make
  test-citus``); the single-server and replica files are listed as not applicable there.

On a difference the test prints a unified diff; ``PGMEMORY_UPDATE_GOLDEN=1`` rewrites the files
instead (then review the diff in git: it is what the change does to the wire).
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import os
import re
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from agent_framework import Agent
from agent_framework.openai import OpenAIChatCompletionClient
from openai import AsyncOpenAI
from sqlalchemy.engine import make_url

from pgmemory import (
    ChatHistoryMemoryProvider,
    MemoryRecord,
    MemoryScope,
    PostgresHistoryProvider,
    Settings,
)
from pgmemory.store import migrate
from pgmemory.store.modes import SearchMode
from pgmemory.store.store import MemoryStore
from tests.citus import cluster as citus_cluster
from tests.openai_server import OpenAIServer, text
from tests.wire_proxy import Sent, WireProxy

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE_ENV = "PGMEMORY_UPDATE_GOLDEN"
COLLECTION = "golden"
USER = "alice"
SESSION = "session-1"
DIMENSIONS = 512
WIDTH = 100
#: Longest wait for the standby to replay what the primary wrote.
REPLAY_TIMEOUT_S = 30.0


class HashEmbedder:
    """A deterministic stand-in embedder: a text's unit vector drawn from its hash."""

    model_id = "golden/hash-512"
    dimensions = DIMENSIONS

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = []
        for content in texts:
            seed = int.from_bytes(hashlib.sha256(content.encode()).digest()[:8], "big")
            v = np.random.default_rng(seed).standard_normal(DIMENSIONS).astype(np.float32)
            vectors.append(v / np.linalg.norm(v))
        return np.stack(vectors).reshape(-1, DIMENSIONS)


# --- the script -------------------------------------------------------------------------------


@dataclass
class Script:
    """What the steps share: the store (opened by the first step) and what earlier steps made."""

    url: str
    read_urls: list[str]
    settings: Settings
    openai_server: OpenAIServer
    store: MemoryStore | None = None
    ids: list[uuid.UUID] | None = None

    @property
    def opened(self) -> MemoryStore:
        assert self.store is not None
        return self.store


SCOPE = MemoryScope(user_id=USER)


async def _open(s: Script) -> None:
    store = MemoryStore(s.url, settings=s.settings, embedder=HashEmbedder(), read_urls=s.read_urls)
    s.store = await store.open()


async def _create_collection(s: Script) -> None:
    await s.opened.create_collection(COLLECTION)


async def _add(s: Script) -> None:
    texts = [
        ("user", "I can't eat anything spicy"),
        ("assistant", "Noted: nothing spicy for you"),
        ("user", "My sister's birthday is in May"),
    ]
    records = [
        MemoryRecord(
            content=content,
            scope=MemoryScope(user_id=USER, session_id=SESSION),
            role=role,
            message_id=f"m{i}",
        )
        for i, (role, content) in enumerate(texts, start=1)
    ]
    s.ids = await s.opened.add(COLLECTION, records, actor="golden")
    assert len(s.ids) == 3


def _search(mode: SearchMode, audit: bool) -> Callable[[Script], Awaitable[None]]:
    async def step(s: Script) -> None:
        hits = await s.opened.search(
            COLLECTION,
            SCOPE,
            query="spicy food",
            mode=mode,
            limit=2,
            audit=audit,
        )
        assert hits

    return step


async def _recall(s: Script) -> None:
    recalled = await s.opened.recall(COLLECTION, SCOPE, query="what can I eat?")
    assert recalled.items


async def _record_recall(s: Script) -> None:
    assert s.ids is not None
    await s.opened.record_recall(
        COLLECTION, SCOPE, memory_ids=s.ids[:2], scores=[0.9, 0.8], query="spicy food"
    )


async def _append_history(s: Script) -> None:
    messages = [
        {"message_id": "h1", "role": "user", "text": "hello"},
        {"message_id": "h2", "role": "assistant", "text": "hi"},
    ]
    assert await s.opened.append_history(SESSION, messages, user_id=USER) == 2


async def _read_history(s: Script) -> None:
    assert len(await s.opened.read_history(SESSION, user_id=USER)) == 2


async def _provider_turn(s: Script) -> None:
    memory = ChatHistoryMemoryProvider(s.opened, COLLECTION, user_id=USER)
    history = PostgresHistoryProvider(s.opened, user_id=USER)
    client = AsyncOpenAI(base_url=s.openai_server.url, api_key="test", max_retries=0)
    agent = Agent(
        client=OpenAIChatCompletionClient(model="test-model", async_client=client),
        context_providers=[history, memory],
        instructions="Be brief.",
    )
    s.openai_server.queue(text("Nothing spicy, then."))
    try:
        session = agent.create_session(session_id="turn")
        reply = await agent.run("What should I order?", session=session)
    finally:
        await client.close()
    assert reply.text == "Nothing spicy, then."


async def _delete(s: Script) -> None:
    assert s.ids is not None
    assert await s.opened.delete(COLLECTION, ids=[s.ids[0]], scope=SCOPE) == 1


async def _erase_user(s: Script) -> None:
    erased = await s.opened.erase_user(USER)
    assert erased["memories"] > 0


#: The script: (what the golden file calls the step, the step).
STEPS: list[tuple[str, Callable[[Script], Awaitable[None]]]] = [
    ("MemoryStore.open", _open),
    ("create_collection", _create_collection),
    ("add: a batch of 3 records", _add),
    ("search mode=vector audit=True", _search("vector", True)),
    ("search mode=vector audit=False", _search("vector", False)),
    ("search mode=text audit=True", _search("text", True)),
    ("search mode=text audit=False", _search("text", False)),
    ("search mode=hybrid audit=True", _search("hybrid", True)),
    ("search mode=hybrid audit=False", _search("hybrid", False)),
    ("recall (the providers' injection)", _recall),
    ("record_recall", _record_recall),
    ("append_history: 2 messages", _append_history),
    ("read_history", _read_history),
    ("agent-framework turn: PostgresHistoryProvider + ChatHistoryMemoryProvider", _provider_turn),
    ("delete: 1 id in the user's scope", _delete),
    ("erase_user", _erase_user),
]


async def run_script(
    proxy: WireProxy,
    url: str,
    openai_server: OpenAIServer,
    *,
    read_urls: Sequence[str] = (),
    settle: Callable[[], Awaitable[None]] | None = None,
    **settings: Any,
) -> list[tuple[str, list[Sent]]]:
    """Run :data:`STEPS` on ``url`` through ``proxy``; what each step sent."""
    routed = await proxy.route(url, "primary")
    replicas = [await proxy.route(r, f"replica{i}") for i, r in enumerate(read_urls, start=1)]
    config = Settings(_env_file=None, **settings)
    script = Script(routed, replicas, config, openai_server)
    captured: list[tuple[str, list[Sent]]] = []
    try:
        for name, step in STEPS:
            if settle is not None:
                await settle()
            with proxy.recording() as sent:
                await step(script)
            captured.append((name, sent))
    finally:
        if script.store is not None:
            await script.store.close()
    return captured


# --- the golden file --------------------------------------------------------------------------


def type_names(url: str, captured: list[tuple[str, list[Sent]]]) -> dict[int, str]:
    """The parameter type OIDs of the capture, named by ``pg_type`` (one query)."""
    oids = sorted({o for _, sent in captured for s in sent for o in s.param_oids or () if o})
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT oid::int, format_type(oid, NULL) FROM pg_type WHERE oid = ANY(:o)"),
                {"o": oids},
            ).all()
    finally:
        engine.dispose()
    names = {0: "unspecified"}
    names.update({oid: name for oid, name in rows})
    return names


def render(deployment: str, captured: list[tuple[str, list[Sent]]], types: dict[int, str]) -> str:
    """The golden file's text: a header, then one block per step."""
    lines = [
        f"# What pgmemory sends to the server, deployment {deployment!r}",
        "# (tests/package/test_statements_at_wire.py; to regenerate after a meant change:",
        f"# {UPDATE_ENV}=1 pytest tests/package/test_statements_at_wire.py, then review the diff).",
        "#",
        "# [connection rtN] how: connection = server#n, numbered in the order they opened;",
        "# rtN = the step's Nth round trip (a Sync, or a simple query); how = query (simple",
        "# protocol), parse (unnamed Parse, then Execute), prepare (named Parse, then Execute),",
        "# prepared (a statement prepared before: Bind and Execute only), parse only (a Parse",
        "# that no Execute followed before the Sync: not counted as a statement). Then the Parse's",
        "# parameter types and the SQL as sent, each whitespace run made one space.",
    ]
    total = 0
    for number, (name, sent) in enumerate(captured, start=1):
        trips: dict[tuple[str, int], int] = {}
        for s in sent:
            trips.setdefault((s.connection, s.round_trip), len(trips) + 1)
        executed = sum(1 for s in sent if s.how != "parse only")
        total += executed
        only = len(sent) - executed
        extra = f" (and {only} parse only)" if only else ""
        lines += [
            "",
            f"== {number}. {name}: {executed} statements{extra}, {len(trips)} round trips ==",
        ]
        for s in sent:
            lines.append(f"[{s.connection} rt{trips[(s.connection, s.round_trip)]}] {s.how}")
            parsed = trips.get((s.connection, s.parsed_in or 0))
            if s.how == "prepared" and parsed is not None:
                lines.append(f"  the statement parsed in rt{parsed}")
                continue
            if s.param_oids is not None:
                params = ", ".join(
                    f"${i} {types.get(o, f'oid {o}')}" for i, o in enumerate(s.param_oids, 1)
                )
                lines += textwrap.wrap(
                    params or "none", WIDTH, initial_indent="  params: ", subsequent_indent="    "
                )
            lines += textwrap.wrap(
                re.sub(r"\s+", " ", s.sql).strip(),
                WIDTH,
                initial_indent="  sql: ",
                subsequent_indent="    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
    lines += ["", f"== total: {total} statements =="]
    return "\n".join(lines) + "\n"


def check_golden(deployment: str, captured: list[tuple[str, list[Sent]]], url: str) -> None:
    """Compare the capture with ``tests/golden/statements-<deployment>.txt`` (or rewrite it)."""
    got = render(deployment, captured, type_names(url, captured))
    path = GOLDEN / f"statements-{deployment}.txt"
    want = path.read_text() if path.exists() else ""
    if got == want:
        return
    if os.environ.get(UPDATE_ENV):
        path.parent.mkdir(exist_ok=True)
        path.write_text(got)
        return
    diff = "".join(
        difflib.unified_diff(
            want.splitlines(keepends=True),
            got.splitlines(keepends=True),
            fromfile=f"{path.relative_to(GOLDEN.parents[1])} (golden)",
            tofile="sent now",
        )
    )
    pytest.fail(
        f"what pgmemory sends on deployment {deployment!r} differs from {path.name}"
        f"{'' if want else ' (missing)'}:\n{diff}\n"
        f"If the change is meant, regenerate the golden files with {UPDATE_ENV}=1 "
        "pytest tests/package/test_statements_at_wire.py (PGMEMORY_TEST_CITUS=1 for the Citus "
        "one) and review their diff.",
        pytrace=False,
    )


# --- deployments ------------------------------------------------------------------------------


def _migrated(url: str, *statements: str) -> str:
    migrate.upgrade(url)
    if statements:
        engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))
        engine.dispose()
    return url


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
async def test_one_server(fresh_database: str, openai_server: OpenAIServer, isolation: str) -> None:
    name = make_url(fresh_database).database
    url = _migrated(
        fresh_database,
        f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{isolation}'",
    )
    async with WireProxy() as proxy:
        captured = await run_script(proxy, url, openai_server)
    check_golden(isolation.replace(" ", "-"), captured, url)


@dataclass
class Pair:
    """The script's database on a primary and its hot standby, and the two servers' own
    ``postgres`` databases (for the replay checks: their WAL positions are the server's)."""

    primary_url: str
    standby_url: str
    primary: sa.Engine
    standby: sa.Engine

    def replayed(self) -> bool:
        """Whether the standby has replayed all the WAL the primary has written so far."""
        with self.primary.connect() as conn:
            target = conn.execute(sa.text("SELECT pg_current_wal_lsn()")).scalar_one()
        with self.standby.connect() as conn:
            return bool(
                conn.execute(
                    sa.text("SELECT pg_last_wal_replay_lsn() >= CAST(:t AS pg_lsn)"), {"t": target}
                ).scalar_one()
            )


@pytest.fixture
def standby_pair() -> Iterator[Pair]:
    """A migrated database on a primary, replayed by its streaming hot standby."""
    from tests.store.replica_pair import primary_and_standby

    with primary_and_standby() as (primary, standby):
        admin = sa.create_engine(primary.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE golden"))
        migrate.upgrade(primary.url("golden"))
        pair = Pair(
            primary.url("golden"), standby.url("golden"), admin, sa.create_engine(standby.url())
        )
        try:
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while not pair.replayed():  # the database and its schema are on the standby
                assert time.monotonic() < deadline, "the standby did not replay the migration"
                time.sleep(0.01)
            yield pair
        finally:
            admin.dispose()
            pair.standby.dispose()


async def test_read_replicas(standby_pair: Pair, openai_server: OpenAIServer) -> None:
    async def settle() -> None:
        """Before each step: the standby has replayed every write, so which server serves a
        read, and how often a replica is asked for its replay position, is not timing's."""
        deadline = time.monotonic() + REPLAY_TIMEOUT_S
        while not standby_pair.replayed():
            assert time.monotonic() < deadline, "the standby did not replay the last step"
            await asyncio.sleep(0.01)

    async with WireProxy() as proxy:
        captured = await run_script(
            proxy,
            standby_pair.primary_url,
            openai_server,
            read_urls=[standby_pair.standby_url],
            settle=settle,
            # Health checked once (at the first read), then replay positions only; a read waits
            # for its user's writes rather than fall back (settle() has replayed them).
            replica_check_interval_s=3600.0,
            replica_wait_ms=10_000,
        )
    check_golden("replicas", captured, standby_pair.primary_url)


@pytest.mark.skipif(not citus_cluster.enabled(), reason="needs PGMEMORY_TEST_CITUS")
async def test_citus(fresh_database: str, openai_server: OpenAIServer) -> None:
    url = _migrated(fresh_database)
    await asyncio.to_thread(citus_cluster.distribute, url)  # pgmemory db distribute (own loop)
    async with WireProxy() as proxy:
        captured = await run_script(proxy, url, openai_server)
    check_golden("citus", captured, url)
