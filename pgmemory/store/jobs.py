"""The derivation queue: durable work a turn leaves for later, in ``pgmemory_jobs``.

A turn queues a job in its own transaction (:meth:`JobQueue.enqueue` joins the store's shared
transaction), so a turn that fails queues nothing. A worker asks which users have due jobs,
leases all of one user's due jobs in one statement, does the slow part (a model call) with no
transaction open, and then, in the transaction that writes what it derived,
:meth:`JobQueue.complete` deletes them by the lease: a lease that ran out and was taken over,
or jobs cancelled by the user's erasure meanwhile, complete nothing, and the worker writes
nothing. A failed attempt gives the jobs back with a back-off; a job out of attempts stays in
the table, with the type of its last error, until :meth:`JobQueue.drop_failed` deletes it
(the worker does after ``keep_failed_s``) or its user is erased.

Completing and releasing take the jobs of the lease they apply to (all of them by default), so
a worker settles each part of a lease on its own: one job's failure gives back that job and
those derived with it, never the lease's other jobs, whose attempts, error and messages stay
their own.

The queue is framework-neutral: a job is a namespace, a scope and a JSON payload. What a
namespace's jobs mean is up to the worker that leases them
(:class:`pgmemory.integrations.agent_framework.FactWorker` for fact memory).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.facts import scope_key
from pgmemory.store.jsonb import jsonb
from pgmemory.store.records import MemoryScope
from pgmemory.store.uuid7 import uuid7
from pgmemory.store.validation import check_metadata, check_name, check_number, describe

#: Leases a worker's due jobs are taken with by default (seconds): longer than a model call.
DEFAULT_LEASE_S = 120.0
#: Attempts a job gets before it is left alone (its last error's type kept).
DEFAULT_MAX_ATTEMPTS = 5
#: The longest a job may wait before it is due (seconds).
MAX_DELAY_S = 3600.0
#: How long a job that used up its attempts is kept by default, with the messages it holds,
#: before a worker drops it (seconds): a week.
DEFAULT_KEEP_FAILED_S = 7 * 86400.0
#: The longest a failed job may be kept (seconds): ten years.
MAX_KEEP_S = 10 * 365 * 86400.0


@dataclass(frozen=True, slots=True)
class Job:
    """One queued piece of work, as a lease returned it."""

    id: uuid.UUID
    namespace: str
    scope: MemoryScope
    payload: dict[str, Any]
    #: Leases taken of it so far, this one included.
    attempts: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's hold on one user's due jobs, oldest first, until each is completed or
    released (together, or part by part: :meth:`JobQueue.complete`, :meth:`JobQueue.release`)."""

    user_id: str
    lease_id: uuid.UUID
    jobs: tuple[Job, ...]


def _check_namespaces(namespaces: Sequence[str]) -> list[str]:
    if isinstance(namespaces, str) or not namespaces:
        raise InvalidInputError(
            f"namespaces must be a non-empty list of names, got {describe(namespaces)}"
        )
    return [check_name(n, what="namespace") for n in namespaces]


def _job_ids(lease: Lease, jobs: Sequence[Job] | None) -> list[uuid.UUID]:
    """The ids of ``jobs`` (all of ``lease``'s when None), each a job of the lease, once."""
    if jobs is None:
        return [job.id for job in lease.jobs]
    held = {job.id for job in lease.jobs}
    ids = list(dict.fromkeys(job.id for job in jobs))
    if not ids or not held.issuperset(ids):
        raise InvalidInputError(
            "jobs must be a non-empty selection of the lease's own jobs (Lease.jobs)"
        )
    return ids


def _check_positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInputError(f"{what} must be a positive number, got {describe(value)}")
    return float(value)


class JobQueue:
    """The queue's few verbs over a store's database (``JobQueue(store.database)``).

    Args:
        db: the store's :class:`~pgmemory.store._engine.database.Database`.
        max_attempts: leases a job gets before it is left alone
            (:data:`DEFAULT_MAX_ATTEMPTS`).
    """

    def __init__(self, db: Database, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInputError(
                f"max_attempts must be an int >= 1, got {describe(max_attempts)}"
            )
        self._db = db
        self.max_attempts = max_attempts

    async def enqueue(
        self,
        namespace: str,
        scope: MemoryScope,
        payload: Mapping[str, Any],
        *,
        delay_s: float = 0.0,
    ) -> uuid.UUID:
        """Queue one job for ``scope`` (which must name a user), due in ``delay_s`` seconds;
        returns its id.

        Inside :meth:`pgmemory.MemoryStore.shared_transaction` it is part of that transaction.
        """
        delay_s = check_number(delay_s, what="delay_s", low=0, high=MAX_DELAY_S)
        params = scope_key(namespace, scope)
        if not params["user_id"]:
            raise InvalidInputError("a job's scope must name a user (MemoryScope(user_id=...))")
        job_id = uuid7()
        body = jsonb(check_metadata(payload, what="job payload"))
        async with self._db.write(users=(params["user_id"],)) as conn:
            await conn.execute(
                clause(q.ENQUEUE_JOB),
                {**params, "id": job_id, "payload": body, "delay_s": delay_s},
            )
        return job_id

    async def due_users(
        self, namespaces: Sequence[str], *, limit: int = 32, early: bool = False
    ) -> list[str]:
        """Users with due jobs in ``namespaces``, the longest-waiting first (at most ``limit``);
        ``early``: a job never tried counts as due before its time (``process_now``)."""
        params = {
            "namespaces": _check_namespaces(namespaces),
            "limit": int(limit),
            "early": bool(early),
        }
        async with self._db.write(users=()) as conn:
            rows = await conn.execute(
                clause(q.JOBS_DUE_USERS), {**params, "max_attempts": self.max_attempts}
            )
            return [row[0] for row in rows]

    async def lease(
        self, user_id: str, namespaces: Sequence[str], *, lease_s: float = DEFAULT_LEASE_S
    ) -> Lease | None:
        """Lease every due job of ``user_id`` in ``namespaces`` for ``lease_s`` seconds, with
        the user's jobs never tried even before their time (so a user's turns are extracted
        together); None when another worker got them first (or none is due)."""
        lease_id = uuid.uuid4()
        params = {
            "user_id": check_name(user_id, what="user_id"),
            "namespaces": _check_namespaces(namespaces),
            "lease_s": _check_positive(lease_s, "lease_s"),
            "lease_id": lease_id,
            "max_attempts": self.max_attempts,
            "early": True,
        }
        async with self._db.write(users=(user_id,)) as conn:
            rows = (await conn.execute(clause(q.LEASE_JOBS), params)).mappings().all()
        if not rows:
            return None
        jobs = sorted(
            (
                Job(
                    id=row["id"],
                    namespace=row["namespace"],
                    scope=MemoryScope(
                        user_id=user_id,
                        application_id=row["application_id"] or None,
                        agent_id=row["agent_id"] or None,
                        session_id=row["session_id"] or None,
                    ),
                    payload=dict(row["payload"]),
                    attempts=int(row["attempts"]),
                    created_at=row["created_at"],
                )
                for row in rows
            ),
            key=lambda job: (job.created_at, job.id),
        )
        return Lease(user_id=user_id, lease_id=lease_id, jobs=tuple(jobs))

    async def complete(self, lease: Lease, jobs: Sequence[Job] | None = None) -> bool:
        """Delete ``jobs`` of the lease (all of its jobs when None); whether all of them were
        still held by it. The lease's other jobs keep their lease.

        Call it inside the transaction that writes what the jobs derived
        (:meth:`pgmemory.MemoryStore.shared_transaction`) and write nothing when it returns
        False (the transaction rolls the deletion back): the jobs were taken over after the
        lease ran out, or the user was erased.

        Raises:
            InvalidInputError: ``jobs`` is empty or names a job the lease does not hold.
        """
        ids = _job_ids(lease, jobs)
        params = {"user_id": lease.user_id, "lease_id": lease.lease_id, "ids": ids}
        async with self._db.write(users=(lease.user_id,)) as conn:
            done = await conn.execute(clause(q.COMPLETE_JOBS), params)
            return len(done.all()) == len(ids)

    async def release(
        self,
        lease: Lease,
        jobs: Sequence[Job] | None = None,
        *,
        error: str,
        retry_in_s: float,
    ) -> None:
        """Give ``jobs`` of the lease back (all of its jobs when None), due again in
        ``retry_in_s`` seconds; ``error`` is the failure's type name (never its message, which
        may quote the user). The lease's other jobs keep their lease, attempts and error.

        Raises:
            InvalidInputError: ``jobs`` is empty or names a job the lease does not hold.
        """
        params = {
            "user_id": lease.user_id,
            "lease_id": lease.lease_id,
            "ids": _job_ids(lease, jobs),
            "error": check_name(error, what="error"),
            "retry_in_s": _check_positive(retry_in_s, "retry_in_s"),
        }
        async with self._db.write(users=(lease.user_id,)) as conn:
            await conn.execute(clause(q.RELEASE_JOBS), params)

    async def drop_failed(self, namespaces: Sequence[str], *, older_than_s: float) -> int:
        """Delete the jobs in ``namespaces`` that used up their attempts and were last tried
        more than ``older_than_s`` seconds ago; how many. A failed job still holds the
        messages it was queued with, so it should not be kept for ever
        (:class:`~pgmemory.integrations.agent_framework.FactWorker` runs this by itself)."""
        params = {
            "namespaces": _check_namespaces(namespaces),
            "max_attempts": self.max_attempts,
            "older_than_s": check_number(older_than_s, what="older_than_s", low=0, high=MAX_KEEP_S),
        }
        async with self._db.write(users=()) as conn:
            return int((await conn.execute(clause(q.DROP_FAILED_JOBS), params)).scalar_one())

    async def pending(self, namespaces: Sequence[str]) -> int:
        """Jobs in ``namespaces`` that still have attempts left (due, waiting or leased)."""
        params = {"namespaces": _check_namespaces(namespaces), "max_attempts": self.max_attempts}
        async with self._db.write(users=()) as conn:
            return int((await conn.execute(clause(q.JOBS_PENDING), params)).scalar_one())


__all__ = [
    "DEFAULT_KEEP_FAILED_S",
    "DEFAULT_LEASE_S",
    "DEFAULT_MAX_ATTEMPTS",
    "MAX_DELAY_S",
    "MAX_KEEP_S",
    "Job",
    "JobQueue",
    "Lease",
]
