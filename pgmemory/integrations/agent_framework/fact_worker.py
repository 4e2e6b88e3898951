"""The worker that extracts queued facts off the turn path (``extraction="queued"``).

:class:`FactWorker` serves one or more fact providers of one store
(``FactMemoryProvider(..., extraction="queued")``), each by its namespace. One pass
(:meth:`FactWorker.run_once`) takes the users with due jobs and, for each, leases all of that
user's due jobs (:class:`pgmemory.store.jobs.JobQueue`), then for each (namespace, scope) group
among them makes ONE model call over all of its queued messages, oldest first, shown the facts
(and profile) known so far. Each group is settled on its own: what it derived is written in one
transaction that first completes that group's jobs; if the lease was taken over or the user was
erased meanwhile, nothing is written (and no further group of the lease is derived). A failed
model call or write gives that group's jobs back with a growing back-off, and only them: the
user's other groups are still derived and completed, their attempts and errors their own.

Three ways to run it, one implementation:

* ``pgmemory worker --app module:factory`` (:mod:`pgmemory.cli.worker`), a process of its own;
* ``async with FactWorker([facts]).running(): ...``, a task inside a small application;
* :meth:`~pgmemory.integrations.agent_framework.facts.FactMemoryProvider.process_now` and
  :meth:`~pgmemory.integrations.agent_framework.facts.FactMemoryProvider.flush` (tests, scripts).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Protocol

from agent_framework import Message

from pgmemory.errors import InvalidInputError
from pgmemory.integrations.agent_framework.fact_prompts import PROFILE_KEY
from pgmemory.integrations.agent_framework.messages import user_messages
from pgmemory.store.jobs import (
    DEFAULT_KEEP_FAILED_S,
    DEFAULT_LEASE_S,
    MAX_KEEP_S,
    Job,
    JobQueue,
    Lease,
)
from pgmemory.store.store import MemoryStore
from pgmemory.store.validation import check_number, describe

logger = logging.getLogger(__name__)

#: The first retry's delay after a failure (seconds); each further attempt doubles it.
RETRY_BASE_S = 5.0
#: The longest delay between two attempts (seconds).
RETRY_MAX_S = 600.0
#: How often :meth:`FactWorker.run` drops the failed jobs past their keep time (seconds).
SWEEP_EVERY_S = 600.0


class QueuedFacts(Protocol):
    """What the worker uses of a fact provider built with ``extraction="queued"``
    (:class:`~pgmemory.integrations.agent_framework.facts.FactMemoryProvider`)."""

    source_id: str
    namespace: str
    store: MemoryStore
    queue: JobQueue | None

    async def extract(
        self, messages: Sequence[Message], *, known: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The facts (and profile) the messages state, given what is known."""
        ...


class _LeaseLost(Exception):
    """The lease's jobs were taken over or cancelled (erasure): write nothing."""


class FactWorker:
    """Extracts the queued facts of ``providers`` (``extraction="queued"``, one store).

    Args:
        providers: the fact providers whose namespaces it serves (distinct namespaces).
        lease_s: how long a lease holds a user's jobs (longer than a model call).
        poll_s: how long :meth:`run` waits when nothing was due.
        users_per_pass: users taken per scan of the queue.
        keep_failed_s: how long a job that used up its attempts is kept (it still holds the
            messages it was queued with) before :meth:`sweep` drops it (a week by default);
            None keeps failed jobs until they are deleted or their user is erased.

    Raises:
        InvalidInputError: no provider, one not queued, two stores, or a namespace twice.
    """

    def __init__(
        self,
        providers: Sequence[QueuedFacts],
        *,
        lease_s: float = DEFAULT_LEASE_S,
        poll_s: float = 1.0,
        users_per_pass: int = 16,
        keep_failed_s: float | None = DEFAULT_KEEP_FAILED_S,
    ) -> None:
        providers = list(providers)
        if not providers:
            raise InvalidInputError("FactWorker needs at least one FactMemoryProvider")
        by_namespace: dict[str, QueuedFacts] = {}
        for provider in providers:
            if getattr(provider, "queue", None) is None:
                raise InvalidInputError(
                    f"{describe(provider)} does not queue its extraction; build it with "
                    "FactMemoryProvider(..., extraction='queued')"
                )
            if provider.store is not providers[0].store:
                raise InvalidInputError("FactWorker's providers must share one MemoryStore")
            if provider.namespace in by_namespace:
                raise InvalidInputError(
                    f"two providers use the namespace {provider.namespace!r}; give each its own"
                )
            by_namespace[provider.namespace] = provider
        self.providers = by_namespace
        self.store = providers[0].store
        self.queue: JobQueue = providers[0].queue  # type: ignore[assignment]
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.users_per_pass = users_per_pass
        self.keep_failed_s = (
            None
            if keep_failed_s is None
            else check_number(keep_failed_s, what="keep_failed_s", low=0, high=MAX_KEEP_S)
        )

    # --- the three faces --------------------------------------------------------------------

    async def run_once(self, *, early: bool = False) -> int:
        """Process every job due now (until none is); returns the jobs done. ``early``: jobs
        still waiting for their provider's ``extraction_delay_s`` too."""
        done = 0
        namespaces = list(self.providers)
        while users := await self.queue.due_users(
            namespaces, limit=self.users_per_pass, early=early
        ):
            random.shuffle(users)  # concurrent workers start on different users
            for user_id in users:
                lease = await self.queue.lease(user_id, namespaces, lease_s=self.lease_s)
                if lease is not None:
                    done += await self.process(lease)
        return done

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Process due jobs until ``stop`` is set (or the task is cancelled), waiting
        ``poll_s`` whenever none was due. A database error is logged and retried."""
        stop = stop or asyncio.Event()
        swept = -math.inf
        while not stop.is_set():
            try:
                if time.monotonic() - swept >= SWEEP_EVERY_S:
                    await self.sweep()
                    swept = time.monotonic()
                done = await self.run_once()
            except Exception as exc:  # the database went away: log, wait, try again
                logger.warning("fact worker: pass failed (%s); retrying", type(exc).__name__)
                done = 0
            if not done:
                with suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_s)

    async def sweep(self) -> int:
        """Drop the served jobs that used up their attempts more than ``keep_failed_s`` ago
        (:meth:`run` does every :data:`SWEEP_EVERY_S`); returns how many (0 with
        ``keep_failed_s=None``)."""
        if self.keep_failed_s is None:
            return 0
        dropped = await self.queue.drop_failed(
            list(self.providers), older_than_s=self.keep_failed_s
        )
        if dropped:
            logger.info("fact worker: dropped %d failed job(s) past their keep time", dropped)
        return dropped

    @asynccontextmanager
    async def running(self) -> AsyncIterator[FactWorker]:
        """Run :meth:`run` as a task of this process while the block runs (the in-process mode
        for small applications); stopped when the block ends."""
        stop = asyncio.Event()
        task = asyncio.create_task(self.run(stop), name="pgmemory-fact-worker")
        try:
            yield self
        finally:
            stop.set()
            await task

    async def flush(self, timeout: float = 30.0) -> None:
        """Return once no job of the served namespaces is pending, processing due ones here.

        Raises:
            TimeoutError: jobs are still pending after ``timeout`` seconds (the message says
                how many: due later after a failure, or leased by a worker elsewhere).
        """
        deadline = time.monotonic() + timeout
        namespaces = list(self.providers)
        while True:
            await self.run_once(early=True)
            left = await self.queue.pending(namespaces)
            if not left:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{left} fact job(s) still pending after {timeout:g} s (failed and due "
                    "again later, or leased by another worker)"
                )
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    # --- one lease --------------------------------------------------------------------------

    async def process(self, lease: Lease) -> int:
        """Derive and write what ``lease``'s jobs hold, each (namespace, scope) group on its own
        (:meth:`_settle`); returns how many jobs were done. A group that fails is given back
        alone; once the lease is found lost (taken over, or its user erased), the groups not yet
        derived are left to whoever holds them now (nothing, after an erasure)."""
        groups: dict[tuple[str, Any], list[Job]] = {}
        for job in lease.jobs:
            groups.setdefault((job.namespace, job.scope), []).append(job)
        done = 0
        for (namespace, scope), jobs in groups.items():
            try:
                done += await self._settle(lease, namespace, scope, jobs)
            except _LeaseLost:
                logger.info("fact worker: a lease was lost (taken over, or its user erased)")
                break
        return done

    async def _settle(self, lease: Lease, namespace: str, scope: Any, jobs: Sequence[Job]) -> int:
        """Derive one group of ``lease``'s jobs and write what it derived in the transaction
        that completes them (the group's jobs only); on a failure give them (only) back with a
        back-off of their own attempts. Returns how many jobs were done (0 when given back).

        Raises:
            _LeaseLost: the group's jobs are no longer the lease's; nothing was written.
        """
        provider = self.providers[namespace]
        try:
            updates, sources = await self._derive(namespace, scope, jobs)
            async with self.store.shared_transaction():
                if not await self.queue.complete(lease, jobs):
                    raise _LeaseLost
                if updates:
                    await self.store.merge_facts(
                        provider.namespace,
                        scope,
                        updates,
                        actor=provider.source_id,
                        sources=sources,
                    )
        except _LeaseLost:
            raise
        except Exception as exc:
            attempt = max(job.attempts for job in jobs)
            delay = min(RETRY_BASE_S * 2 ** (attempt - 1), RETRY_MAX_S)
            logger.warning(
                "fact worker: %d job(s) failed on attempt %d of %d (%s); %s",
                len(jobs),
                attempt,
                self.queue.max_attempts,
                type(exc).__name__,
                f"retrying in {delay:g} s"
                if attempt < self.queue.max_attempts
                else "given up (kept in pgmemory_jobs with the error's type until swept)",
            )
            await self.queue.release(lease, jobs, error=type(exc).__name__, retry_in_s=delay)
            return 0
        logger.info("fact worker: %d job(s) done", len(jobs))
        return len(jobs)

    async def _derive(
        self, namespace: str, scope: Any, jobs: Sequence[Job]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """One model call over the jobs' messages; returns the updates and their sources."""
        provider = self.providers[namespace]
        texts = [m for job in jobs for m in job.payload.get("messages", ())]
        messages = user_messages(str(m.get("text") or "") for m in texts)
        sources = {"message_ids": [m["message_id"] for m in texts if m.get("message_id")]}
        if not messages:
            return {}, sources
        known = await self.store.get_facts(namespace, scope)
        updates = await provider.extract(messages, known=known)
        if PROFILE_KEY in updates and updates[PROFILE_KEY] == known.get(PROFILE_KEY):
            del updates[PROFILE_KEY]
        return updates, sources


__all__ = [
    "RETRY_BASE_S",
    "RETRY_MAX_S",
    "SWEEP_EVERY_S",
    "FactWorker",
    "QueuedFacts",
]
