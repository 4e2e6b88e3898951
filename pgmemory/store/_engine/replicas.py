"""Read replicas: which hot standby may serve a read, and read-your-writes per user.

A :class:`ReplicaSet` holds one pooled engine per read URL (streaming hot standbys of the
primary). :meth:`ReplicaSet.acquire` hands out a connection to a replica that is

* **reachable**: a replica whose connection fails is skipped for ``replica_retry_s`` seconds,
  then tried again (so a restarted standby gets its reads back);
* **not lagging**: at most every ``replica_check_interval_s`` seconds a connection is asked
  whether the server still replays WAL (``pg_is_in_recovery()``) and how far behind it is;
  one more than ``replica_max_lag_s`` seconds behind, or promoted, is skipped until the next
  check;
* **caught up with the reader's own writes**: :class:`WriteMarks` remembers, per user, the
  primary's WAL position after that user's last write; a replica serves the user only once
  ``pg_last_wal_replay_lsn()`` has passed it, waiting at most ``replica_wait_ms`` in total.

When none qualifies, :meth:`ReplicaSet.acquire` returns None and the caller reads from the
primary. The replay position a replica last reported is kept, so a user whose writes a
replica has already replayed costs no extra round trip.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from pgmemory.settings import Settings
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.connector import make_engine

logger = logging.getLogger(__name__)

#: Users whose last write position is remembered; older ones fold into one floor position.
MAX_TRACKED_USERS = 100_000


def parse_lsn(value: str) -> int:
    """A WAL position (``'16/B374D848'``, as PostgreSQL prints ``pg_lsn``) as an integer."""
    high, _, low = value.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


class WriteMarks:
    """The primary's WAL position after each user's latest write (read-your-writes).

    Bounded: past :data:`MAX_TRACKED_USERS` users, the oldest entry is dropped and its position
    raised into a floor that every user's reads must reach (safe, only stricter).
    """

    def __init__(self) -> None:
        self._users: collections.OrderedDict[str, int] = collections.OrderedDict()
        #: What every read must reach: writes not tied to users, and forgotten users' writes.
        self._floor = 0
        #: The latest position of any write (what a read across users must reach).
        self._latest = 0
        #: Until this monotonic time, reads go to the primary (a write's position was lost).
        self._primary_until = 0.0

    def note(self, users: Iterable[str] | None, lsn: int) -> None:
        """Record a committed write of ``users`` (None: of unknown users, so of everyone)."""
        self._latest = max(self._latest, lsn)
        if users is None:
            self._floor = max(self._floor, lsn)
            return
        for user in users:
            if self._users.get(user, -1) < lsn:
                self._users[user] = lsn
            self._users.move_to_end(user)
        while len(self._users) > MAX_TRACKED_USERS:
            _, forgotten = self._users.popitem(last=False)
            self._floor = max(self._floor, forgotten)

    def note_unknown(self, seconds: float) -> None:
        """A write committed but its position could not be read: primary-only for a while."""
        self._primary_until = max(self._primary_until, time.monotonic() + seconds)

    def needed(self, user: str | None) -> int | None:
        """The position a replica must have replayed to serve ``user`` (None: a read across
        users); None when only the primary may serve it now."""
        if time.monotonic() < self._primary_until:
            return None
        if user is None:
            return self._latest
        return max(self._floor, self._users.get(user, 0))


@dataclass
class Replica:
    """One read URL: its engine and what is known of its health."""

    #: ``replica 1``, ``replica 2``, ... in setting order (URLs hold passwords: never logged).
    name: str
    engine: AsyncEngine
    #: Monotonic time before which the replica is skipped (down or lagging).
    skip_until: float = 0.0
    #: Monotonic time of the last lag check.
    checked_at: float = float("-inf")
    #: The latest replay position it reported.
    replayed: int = 0
    #: Reads it served (for operators and tests).
    served: int = 0
    #: Why it is skipped, if it is.
    skipped_because: str | None = field(default=None)


class ReplicaSet:
    """The read URLs' engines and the choice of one per read (see the module doc).

    Args:
        urls: SQLAlchemy or libpq URLs of hot standbys of the primary.
        settings: Pool sizes and timeouts (as the primary's), and the replica knobs.
        generic_plans: As the primary's engine (see :func:`pgmemory.store._engine.connector.make_engine`).
    """

    def __init__(
        self, urls: Sequence[str], settings: Settings, *, generic_plans: bool = True
    ) -> None:
        self.settings = settings
        self.replicas = [
            Replica(
                name=f"replica {i}",
                engine=make_engine(url, settings, generic_plans=generic_plans),
            )
            for i, url in enumerate(urls, start=1)
        ]
        self.marks = WriteMarks()
        self._next = 0

    async def close(self) -> None:
        """Dispose of every replica's pool."""
        for replica in self.replicas:
            await replica.engine.dispose()

    async def acquire(self, user: str | None) -> AsyncConnection | None:
        """An autocommit connection to a replica fit to serve ``user``'s read, or None.

        Replicas are tried in turn (round robin); the wait for replay is bounded by
        ``replica_wait_ms`` across all of them. Never raises for a replica's sake: a failing
        one is skipped.

        Args:
            user: The user whose scope the read is confined to; None for a read across users.

        Returns:
            A started connection (the caller closes it), or None: read from the primary.
        """
        needed = self.marks.needed(user)
        if needed is None or not self.replicas:
            return None
        deadline = time.monotonic() + self.settings.replica_wait_ms / 1000
        count = len(self.replicas)
        start, self._next = self._next, (self._next + 1) % count
        for i in range(count):
            replica = self.replicas[(start + i) % count]
            if time.monotonic() < replica.skip_until:
                continue
            conn = await self._serve(replica, needed, deadline)
            if conn is not None:
                replica.served += 1
                return conn
        return None

    async def _serve(
        self, replica: Replica, needed: int, deadline: float
    ) -> AsyncConnection | None:
        """A connection to ``replica`` once it is healthy and has replayed ``needed``, or None."""
        try:
            conn = await replica.engine.connect()
        except (DBAPIError, OSError) as exc:
            self._skip(
                replica, self.settings.replica_retry_s, f"unreachable ({type(exc).__name__})"
            )
            return None
        try:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            now = time.monotonic()
            if now - replica.checked_at >= self.settings.replica_check_interval_s:
                healthy = await self._check(replica, conn)
                replica.checked_at = now
                if not healthy:
                    await conn.close()
                    return None
            if replica.replayed < needed and not await self._wait(replica, conn, needed, deadline):
                await conn.close()
                return None
            await conn.commit()  # ends SQLAlchemy's autobegun block; nothing reaches the server
        except (DBAPIError, OSError) as exc:
            self._skip(replica, self.settings.replica_retry_s, f"failed ({type(exc).__name__})")
            with contextlib.suppress(Exception):
                await conn.close()
            return None
        if replica.skipped_because is not None:
            logger.info("%s serves reads again", replica.name)
            replica.skipped_because = None
        return conn

    async def _check(self, replica: Replica, conn: AsyncConnection) -> bool:
        """Whether the replica still replays WAL and lags at most ``replica_max_lag_s``."""
        row = (await conn.execute(clause(q.REPLICA_HEALTH))).one()
        if not row.standby or row.replayed is None:
            self._skip(replica, self.settings.replica_check_interval_s, "not a standby (promoted?)")
            return False
        replica.replayed = max(replica.replayed, parse_lsn(row.replayed))
        if row.lag_s > self.settings.replica_max_lag_s:
            self._skip(replica, self.settings.replica_check_interval_s, f"{row.lag_s:.1f} s behind")
            return False
        return True

    async def _wait(
        self, replica: Replica, conn: AsyncConnection, needed: int, deadline: float
    ) -> bool:
        """Poll the replay position until it reaches ``needed``; False at the deadline."""
        pause = 0.001
        while True:
            value = (await conn.execute(clause(q.REPLAY_POSITION))).scalar_one_or_none()
            if value is None:
                return False
            replica.replayed = max(replica.replayed, parse_lsn(value))
            if replica.replayed >= needed:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 0.01)

    def _skip(self, replica: Replica, seconds: float, why: str) -> None:
        """Leave ``replica`` out of reads for ``seconds`` (logged when it starts)."""
        replica.skip_until = time.monotonic() + seconds
        if replica.skipped_because is None:
            logger.warning(
                "%s skipped for reads: %s; retried after %.1f s", replica.name, why, seconds
            )
        replica.skipped_because = why
