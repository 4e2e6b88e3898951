"""What a store's client sends to the server, read from libpq's own protocol trace.

``one_connection_store`` opens a store whose every statement runs on one pooled connection;
``sent`` traces that connection (``PGconn.trace``) while an action runs. Each ``Sync`` ends a
round trip of the extended protocol; each ``Query`` is one of the simple protocol (psycopg's
COMMIT and ROLLBACK).
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from psycopg import pq

from pgmemory import MemoryStore, Settings


@asynccontextmanager
async def one_connection_store(url: str, **options: Any) -> AsyncIterator[tuple[MemoryStore, Any]]:
    """A store on ``url`` with a pool of one connection, and that connection's libpq
    connection (to trace)."""
    settings = Settings(_env_file=None, pool_size=1, max_overflow=0)  # type: ignore[call-arg]
    async with MemoryStore(url, settings=settings, **options) as store:
        async with store.database.connections.driver_autocommit() as driver:
            pgconn = driver.pgconn
        yield store, pgconn


async def sent(pgconn: Any, action: Callable[[], Awaitable[object]]) -> list[str]:
    """The protocol messages the client sent while ``action`` ran, by kind (``"Bind"``,
    ``"Execute"``, ``"Sync"``, ...); a ``Parse`` or ``Query`` with the start of its SQL
    (``"Parse BEGIN ISOLATION LEVEL READ COMMITTED"``, ``"Query COMMIT"``)."""
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            await action()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().splitlines()
    kinds: list[str] = []
    for line in lines:
        fields = line.split("\t")
        if len(fields) < 3 or fields[0] != "F":
            continue  # the server's messages, or a multi-line statement's further lines
        kind, rest = fields[2], (fields[3] if len(fields) > 3 else "").strip()
        if kind == "Parse":  # "name" "SQL" n ...
            kind += " " + rest.partition('" "')[2].strip()[:40]
        elif kind == "Query":  # "SQL"
            kind += " " + rest.strip('"')[:40]
        kinds.append(kind.strip())
    return kinds


def round_trips(kinds: list[str]) -> int:
    """The round trips among ``sent``'s messages."""
    return sum(1 for kind in kinds if kind == "Sync" or kind.startswith("Query"))
