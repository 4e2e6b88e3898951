"""Every statement a client sends, read at the wire: a PostgreSQL protocol proxy in this process.

The idea of ``bench/serve/_turn_worker.py``'s ``Proxy`` (which counts statements), keeping what
they are instead: a Unix-socket listener in a temporary folder, one socket per upstream server
(named ``.s.PGSQL.<upstream port>``, as libpq looks for it), forwarding every byte both ways and
parsing what the client sends. Whatever sent it (SQLAlchemy, psycopg directly, a pipeline, a
replica's pool), a statement reaching the server is a simple ``Query`` or an extended
``Execute``; its text is the ``Parse`` its ``Bind`` named, with the parameter type OIDs that
``Parse`` declared. ``Sync`` and ``Query`` end round trips.

Nothing is parsed of what the server sends: a client message is parsed before it is forwarded,
so once the client has its answer, what it sent before is recorded. The module imports nothing
of pgmemory or the tests (bench may import it too).

Use::

    async with WireProxy() as proxy:
        url = await proxy.route(server_url, "primary")  # connect here instead
        ...
        with proxy.recording() as sent:
            await store.search(...)
        sent  # [Sent(...), ...] in the order the server received them
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType

from sqlalchemy.engine import make_url

#: Startup-phase request codes after which the real startup message still follows.
_SSL_REQUEST, _GSSENC_REQUEST = 80877103, 80877104


@dataclass(frozen=True)
class Sent:
    """One statement as the server received it.

    ``how`` says what the client sent for it: ``query`` (the simple protocol), ``parse`` (an
    unnamed ``Parse`` before its ``Execute``), ``prepare`` (a named ``Parse``: a prepared
    statement made, then executed), ``prepared`` (a ``Bind`` of a statement prepared earlier
    on that connection: no text sent), ``unnamed again`` (a ``Bind`` of the unnamed statement
    parsed in an earlier round trip), or ``parse only`` (a ``Parse`` no ``Execute`` ran before
    the ``Sync``). ``param_oids`` are the ``Parse``'s declared types (0: left to the server);
    ``None`` for a simple query. ``connection`` is the upstream's label and the connection's
    number among that upstream's connections, in the order they opened (``primary#1``);
    ``round_trip`` counts that connection's round trips from 1, ``parsed_in`` is the round trip
    of the ``Parse`` the statement ran from (None for a simple query).
    """

    connection: str
    round_trip: int
    how: str
    sql: str
    param_oids: tuple[int, ...] | None
    parsed_in: int | None = None


@dataclass
class _Connection:
    label: str
    buffer: bytes = b""
    started: bool = False
    round_trip: int = 1
    #: Prepared statement name -> (SQL, parameter OIDs, round trip of its Parse); b"" is the
    #: unnamed one.
    statements: dict[bytes, tuple[str, tuple[int, ...], int]] = field(default_factory=dict)
    #: Portal name -> the statement name it was bound to.
    portals: dict[bytes, bytes] = field(default_factory=dict)
    #: Statement names parsed since the last Sync and not yet executed, in order.
    parsed: list[bytes] = field(default_factory=list)
    #: Statement names parsed since the last Sync (executed or not).
    parsed_now: set[bytes] = field(default_factory=set)


class WireProxy:
    """A proxy in front of one or more servers, recording what clients send while asked."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="pgmemory-wire-")
        self._servers: list[asyncio.AbstractServer] = []
        self._opened: dict[str, int] = {}
        self._recording: list[Sent] | None = None
        #: The connections' handlers and the streams they forward between (ended at close).
        self._handlers: set[asyncio.Task[None]] = set()
        self._streams: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> WireProxy:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening, end the connections still forwarded (their handlers see the end of
        their streams and return), and remove the sockets' folder."""
        for server in self._servers:
            server.close()
        for stream in list(self._streams):
            stream.close()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        shutil.rmtree(self.folder, ignore_errors=True)

    async def route(self, url: str, label: str) -> str:
        """``url`` (a SQLAlchemy URL, TCP or Unix socket) through the proxy; its connections are
        labelled ``label#1``, ``label#2``, ... Each upstream needs a port of its own."""
        parsed = make_url(url)
        host = parsed.query.get("host") or parsed.host or "localhost"
        if isinstance(host, tuple):
            host = host[0]
        port = int(parsed.port or str(parsed.query.get("port") or 5432))
        path = os.path.join(self.folder, f".s.PGSQL.{port}")
        if os.path.exists(path):
            raise ValueError(f"the proxy already has an upstream on port {port}")

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._handlers.add(task)
            try:
                await self._handle(reader, writer, str(host), port, label)
            finally:
                self._handlers.discard(task)

        self._servers.append(await asyncio.start_unix_server(handle, path=path))
        query = {k: v for k, v in parsed.query.items() if k not in ("host", "port")}
        query.update(host=self.folder, sslmode="disable")
        return parsed.set(host=None, port=port, query=query).render_as_string(hide_password=False)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[Sent]]:
        """The statements sent while the block runs, in the order the proxy read them."""
        sent: list[Sent] = []
        outer, self._recording = self._recording, sent
        try:
            yield sent
        finally:
            self._recording = outer

    async def _handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        port: int,
        label: str,
    ) -> None:
        if host.startswith("/"):
            up_reader, up_writer = await asyncio.open_unix_connection(
                os.path.join(host, f".s.PGSQL.{port}")
            )
        else:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        self._streams.update((writer, up_writer))
        self._opened[label] = self._opened.get(label, 0) + 1
        conn = _Connection(f"{label}#{self._opened[label]}")

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, parse: bool) -> None:
            try:
                while data := await src.read(65536):
                    if parse:
                        self._feed(conn, data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pump(reader, up_writer, True), pump(up_reader, writer, False))
        finally:
            self._streams.difference_update((writer, up_writer))

    def _feed(self, conn: _Connection, data: bytes) -> None:
        conn.buffer += data
        while True:
            if not conn.started:  # the startup message (or an SSL/GSS request) has no kind byte
                if len(conn.buffer) < 8:
                    return
                (length,) = struct.unpack("!I", conn.buffer[:4])
                if len(conn.buffer) < length:
                    return
                (code,) = struct.unpack("!I", conn.buffer[4:8])
                conn.buffer = conn.buffer[length:]
                if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                    conn.started = True
                continue
            if len(conn.buffer) < 5:
                return
            kind = conn.buffer[:1]
            (length,) = struct.unpack("!I", conn.buffer[1:5])
            if len(conn.buffer) < 1 + length:
                return
            body = conn.buffer[5 : 1 + length]
            conn.buffer = conn.buffer[1 + length :]
            self._message(conn, kind, body)

    def _record(
        self,
        conn: _Connection,
        how: str,
        sql: str,
        oids: tuple[int, ...] | None,
        parsed_in: int | None = None,
    ) -> None:
        if self._recording is not None:
            self._recording.append(Sent(conn.label, conn.round_trip, how, sql, oids, parsed_in))

    def _message(self, conn: _Connection, kind: bytes, body: bytes) -> None:
        if kind == b"Q":  # Query: the SQL, NUL-terminated
            self._record(conn, "query", body.rstrip(b"\0").decode(errors="replace"), None)
            conn.round_trip += 1
        elif kind == b"P":  # Parse: name, SQL, int16 count, that many int32 type OIDs
            name, rest = body.split(b"\0", 1)
            text, rest = rest.split(b"\0", 1)
            (count,) = struct.unpack("!H", rest[:2])
            oids = struct.unpack(f"!{count}I", rest[2 : 2 + 4 * count])
            conn.statements[name] = (text.decode(errors="replace"), tuple(oids), conn.round_trip)
            conn.parsed.append(name)
            conn.parsed_now.add(name)
        elif kind == b"B":  # Bind: portal, statement, ...
            portal, rest = body.split(b"\0", 1)
            conn.portals[portal] = rest.split(b"\0", 1)[0]
        elif kind == b"E":  # Execute: portal, row limit
            name = conn.portals.get(body.split(b"\0", 1)[0], b"")
            sql, oids, parsed_in = conn.statements.get(name, ("?", (), 0))
            if name in conn.parsed_now:
                how = "prepare" if name else "parse"
                with contextlib.suppress(ValueError):
                    conn.parsed.remove(name)
            else:
                how = "prepared" if name else "unnamed again"
            self._record(conn, how, sql, oids, parsed_in)
        elif kind == b"C" and body[:1] == b"S":  # Close of a prepared statement
            conn.statements.pop(body[1:].split(b"\0", 1)[0], None)
        elif kind == b"S":  # Sync: the end of a round trip
            for name in conn.parsed:
                sql, oids, parsed_in = conn.statements.get(name, ("?", (), 0))
                self._record(conn, "parse only", sql, oids, parsed_in)
            conn.parsed.clear()
            conn.parsed_now.clear()
            conn.round_trip += 1
