"""The deployment: how this database runs what the domain asks, chosen once when the store opens.

The domain modules (reads, recall, writes, history) say what a statement needs; they never ask
whether the database is distributed, which isolation its sessions default to, or whether a
unit of work is open. :class:`Deployment` knows that, from the moment
:meth:`~pgmemory.store._engine.database.Database.open` has read it, and decides:

* a write's locks (:class:`Locking`): on one server in READ COMMITTED the statement takes its
  users' (and sessions') locks itself (migration 0022), one statement; elsewhere a lock
  statement goes before it, in the same pipeline (under another isolation a function's query
  gets no fresh snapshot; Citus takes locks on the coordinator);
* an audited read's shape (:class:`Shape`, for an :class:`AuditedRead`): where its recall
  audit row is written (in the statement itself; apart from it, in the same transaction, on
  Citus, which would run a search-and-insert statement in steps through the coordinator with
  a two-phase commit; after it, on the primary, when a hot standby served the read), whether
  the statement takes its user's erasure lock itself (``guarded``: where locks are taken in
  the statement, outside a unit of work, whose transaction could not run a refused read
  again), and whether its commit may skip the disk flush (``relax_commit``: unless
  ``durable_recall_audit``, or a unit of work's commit carries the turn's writes).

:meth:`Database.audited <pgmemory.store._engine.database.Database.audited>` runs an
:class:`AuditedRead` the way :meth:`Deployment.audit_route` chooses.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any


@dataclass(frozen=True, slots=True)
class Locking:
    """A write statement in its two forms: one that takes its locks itself, and one that a
    lock statement precedes (:meth:`Deployment.write_statement` picks).

    Attributes:
        locking: The form that takes the erasure locks of its users (and the append locks of
            its sessions) itself.
        plain: The form run after a lock statement.
        users_param: The parameter through which the locking form is told its users (sorted),
            when it is told them apart from its rows; None: its rows name them.
    """

    locking: str
    plain: str
    users_param: str | None = None


@dataclass(frozen=True, slots=True)
class Shape:
    """What an audited read's statement holds on this deployment and route (the builders in
    :mod:`pgmemory.store.queries` take these as keyword arguments).

    Attributes:
        audit: The statement writes its recall audit row itself.
        guarded: The statement takes its user's erasure lock itself.
        relax_commit: Its commit does not wait for the disk flush.
        distributed: The memories are distributed by Citus (every user-scoped statement
            names the user so that it routes to one shard).
    """

    audit: bool
    guarded: bool
    relax_commit: bool
    distributed: bool


@cache
def _shape(audit: bool, guarded: bool, relax_commit: bool, distributed: bool) -> Shape:
    """The :class:`Shape` of these four answers: one instance each (of 16), made once."""
    return Shape(audit=audit, guarded=guarded, relax_commit=relax_commit, distributed=distributed)


class AuditRoute(enum.Enum):
    """Where an audited read's audit row is written."""

    #: In the read's own statement (committed with it).
    INLINE = "inline"
    #: A statement of its own after the read, in the read's transaction (Citus).
    APART = "apart"
    #: On the primary after a hot standby served the read.
    AFTER = "after"


@dataclass(frozen=True, slots=True)
class AuditedRead:
    """A read of one scope that may write a recall audit row: what the domain needs, not how it
    runs (:meth:`Database.audited <pgmemory.store._engine.database.Database.audited>` runs it).

    Attributes:
        build: The read's statement for a :class:`Shape`.
        params: Its parameters (with the audit row's, when ``audit``).
        user: The scope's user ('' or None: a scope without one).
        audit: Write the recall audit row.
        audit_row: The audit row (:func:`~pgmemory.store.queries.record_recall`'s parameters)
            for the rows the read returned, when it is written apart from the statement.
        replica: A hot standby may serve the read (its audit row then follows on the primary).
        settings: The ``SET LOCAL`` statement and parameters the read needs in its transaction
            (the approximate path's), or None.
        wanted: Fewer rows than this raise :class:`TooFewRows` (the approximate path's check;
            its transaction rolls back).
    """

    build: Callable[[Shape], str]
    params: Mapping[str, Any]
    user: str | None
    audit: bool
    audit_row: Callable[[Sequence[Any]], dict[str, Any]]
    replica: bool = False
    settings: tuple[str, Mapping[str, Any]] | None = None
    wanted: int = 0


@dataclass(frozen=True, slots=True)
class Write:
    """A write of some users' data on the fast path: what the domain needs, not how it runs
    (:meth:`Database.written <pgmemory.store._engine.database.Database.written>` runs it).

    Attributes:
        statement: The write, in its two forms (:class:`Locking`: the deployment picks one).
        params: Its parameters.
        users: The users whose rows it writes: their erasure lock is held, shared, for its
            transaction; with replicas their reads wait for it; a lost connection leaves its
            outcome unknown (never retried).
        sessions: The chat-history sessions ``(user_id, session_id)`` it appends to (their
            append lock, exclusive).
        deferrable: The caller can do without its rows: in a deferred unit of work that has
            sent nothing yet it is queued for the commit (and None is returned for it).
    """

    statement: Locking
    params: Mapping[str, Any]
    users: Sequence[str]
    sessions: Sequence[tuple[str, str]] = ()
    deferrable: bool = False


class TooFewRows(Exception):
    """An :class:`AuditedRead` returned fewer rows than it ``wanted`` (its transaction, and its
    audit row, rolled back)."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """What the database is, read once when the store opens.

    Attributes:
        distributed: The memories table is distributed by Citus.
        replicated: Hot standbys serve reads (``Settings.read_urls``).
        read_committed: Sessions default to READ COMMITTED (what SQLAlchemy read on the
            first connection).
        durable_recall_audit: ``Settings.durable_recall_audit``.
    """

    distributed: bool = False
    replicated: bool = False
    read_committed: bool = True
    durable_recall_audit: bool = False

    def built(self, builder: Callable[..., str], *args: Any) -> str:
        """``builder(*args)`` in this deployment's form: a statement builder whose statement
        differs on Citus takes ``distributed``, and the domain asks for it through here
        (``db.deployment.built(q.delete_ids, dimensions)``) instead of reading the deployment."""
        return builder(*args, distributed=self.distributed)

    @property
    def needs_block(self) -> bool:
        """Whether a deferred unit of work's commit needs an explicit transaction block: on
        Citus (it coordinates a transaction across statements only inside one), or when
        sessions do not default to READ COMMITTED (each lock taken before the snapshot of
        the statement it guards)."""
        return self.distributed or not self.read_committed

    @property
    def locks_in_statement(self) -> bool:
        """Whether a statement of one user takes its locks itself (migration 0022: an audited
        read's erasure guard, a history append's tail, a memory insert's lock step) instead of
        a lock statement before it: on one server in READ COMMITTED."""
        return not self.needs_block

    def write_statement(
        self, statement: Locking, users: Sequence[str]
    ) -> tuple[str, dict[str, Any], bool]:
        """The form of ``statement`` this deployment runs, the parameters it adds, and whether
        it takes its own locks (no lock statement goes before it)."""
        if not self.locks_in_statement:
            return statement.plain, {}, False
        extra = {statement.users_param: sorted(users)} if statement.users_param else {}
        return statement.locking, extra, True

    def audit_route(self, read: AuditedRead) -> AuditRoute:
        """Where ``read``'s audit row is written (see the module's notes)."""
        if read.replica and self.replicated:
            return AuditRoute.AFTER
        if read.audit and self.distributed and read.settings is None:
            return AuditRoute.APART
        return AuditRoute.INLINE

    def shape(self, read: AuditedRead, route: AuditRoute, *, in_unit_of_work: bool) -> Shape:
        """The shape of ``read``'s statement on ``route``."""
        inline = read.audit and route is AuditRoute.INLINE
        return _shape(
            inline,
            inline and bool(read.user) and self.guards_reads(in_unit_of_work=in_unit_of_work),
            self.relaxes_audit(in_unit_of_work=in_unit_of_work),
            self.distributed,
        )

    def guards_reads(self, *, in_unit_of_work: bool) -> bool:
        """Whether an audited read of a user takes the user's erasure lock in its own
        statement: where locks are taken in the statement, outside a unit of work (the guard
        may refuse the read, to be run again, which a unit of work's transaction could not)."""
        return self.locks_in_statement and not in_unit_of_work

    def relaxes_audit(self, *, in_unit_of_work: bool) -> bool:
        """Whether a recall audit row's commit may skip the disk flush: unless
        ``durable_recall_audit``, or a unit of work's commit carries the turn's writes."""
        return not (self.durable_recall_audit or in_unit_of_work)
