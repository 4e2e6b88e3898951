"""When a recall probe runs again, and where: beside the searches, not inside one of them.

Both large-scope paths (:mod:`pgmemory.store.ann`, :mod:`pgmemory.store.shortlist`) keep
their decision only while a recall probe on the collection's own stored vectors allows it, and
each probe also refreshes which scopes are large. A probe is costly: one aggregate over the
whole collection and a few dozen exact searches of its largest scopes (about a second on a
million rows; their scope rows are bounded: :func:`sample_largest`). So a path is probed again only after ``every`` of its searches *and* at least
:data:`PROBE_INTERVAL_S` seconds after its last probe (:func:`due`), and that probe runs as a
task of its own (:class:`Beside`): the search that made it due, and every search meanwhile,
goes on with the path's last decision instead of waiting for it. A probe the application asks
for (``enable_ann``, ``probe_ann``) still runs in its call.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause

logger = logging.getLogger(__name__)

#: The least time between two probes of one path that searches make due.
PROBE_INTERVAL_S = 60.0


def due(searches: int, every: int, probed_at: float) -> bool:
    """Whether a path that has served ``searches`` searches since its probe at ``probed_at``
    (``time.monotonic()``) is to be probed again: more than ``every`` searches, and at least
    :data:`PROBE_INTERVAL_S` seconds."""
    return searches > every and time.monotonic() - probed_at >= PROBE_INTERVAL_S


async def sample_largest(
    conn: AsyncConnection,
    collection: str,
    sizes: Mapping[str, int],
    *,
    samples: int,
    max_rows: int,
) -> list[tuple[str, Any, Any]]:
    """Stored rows ``(user_id, id, embedding)`` a probe searches both ways: of the largest
    scopes in ``sizes`` (user id -> rows) first, as evenly over them as ``samples`` allows,
    while the probe's exact searches read at most ``max_rows`` scope rows in all (at least one
    row of the largest scope). One statement per user (Citus routes each to one shard)."""
    largest = sorted(sizes, key=lambda u: (-sizes[u], u))[:samples]
    each = max(1, samples // max(1, len(largest)))
    rows: list[tuple[str, Any, Any]] = []
    read = 0
    for user_id in largest:
        room = (max_rows - read) // sizes[user_id]
        take = min(each, max(room, 0 if rows else 1))
        if take <= 0:
            break
        sample = await conn.execute(
            clause(q.SCOPE_SAMPLE),
            {"collection": collection, "user_id": user_id, "samples": take},
        )
        rows += [(user_id, own_id, embedding) for own_id, embedding in sample]
        read += take * sizes[user_id]
    return rows


class Beside:
    """The probes a store runs beside its searches: at most one per key (a path of a
    collection) at a time; :meth:`close` cancels those still running."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Task[Any]] = {}

    def start(self, key: str, probe: Callable[[], Awaitable[Any]]) -> None:
        """Run ``probe()`` as a task of its own, unless ``key``'s probe is running already.
        The probe must not raise (a failing probe leaves its path off, logged).

        The task starts from an empty context, not the caller's: a search inside a shared
        transaction (a turn's unit of work) must not lend it to a probe that outlives it,
        nor its span to the probe's statements."""
        if key in self._running:
            return
        task = asyncio.get_running_loop().create_task(_run(probe), context=contextvars.Context())
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))

    def running(self, key: str) -> bool:
        """Whether ``key``'s probe is running."""
        return key in self._running

    async def settle(self) -> None:
        """Wait until every probe running now has finished."""
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self) -> None:
        """Cancel the probes still running, and wait for them to end."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run(probe: Callable[[], Awaitable[Any]]) -> None:
    """Run a probe; an error it lets out (a path disabled meanwhile) is logged, class only."""
    try:
        await probe()
    except Exception as exc:
        logger.warning("a recall probe beside the searches failed (%s)", type(exc).__name__)
