"""The admin plane's front: what operators, the CLI and the audit page do with a store.

:class:`Admin` wraps an open :class:`~pgmemory.store.store.MemoryStore` and hands each method
to the module that owns it: ``users`` (the directory, scopes, sessions), ``memories`` (a user's
memories and their write/delete audit), ``recalls`` (the recall audit), ``facts``, ``history``,
``retention`` (audit pruning), ``integrity`` (audit verify), ``roles`` (the least-privilege
role), ``partitioning`` and Citus distribution. Every read runs through the store's database
verbs (replica routing, read-your-writes, one retry after a lost connection), exactly like the
store's own reads.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pgmemory.admin import (
    distribution,
    facts,
    half_vectors,
    history,
    integrity,
    memories,
    partitioning,
    recalls,
    reembedding,
    retention,
    roles,
    tokens,
    users,
)
from pgmemory.admin.facts import FactChange, FactSet
from pgmemory.admin.history import HistoryPage
from pgmemory.admin.memories import MemoryAuditEntry
from pgmemory.admin.pages import Cursor, Page
from pgmemory.admin.recalls import (
    RECALL_DETAIL_MAX,
    RECALL_PREVIEW,
    MemoryRecall,
    Recall as AuditedRecall,
)
from pgmemory.admin.retention import PruneRecord
from pgmemory.admin.tokens import DEFAULT_LIFETIME, IssuedToken, TokenInfo
from pgmemory.admin.users import ScopeSummary, SessionSummary, UserPage
from pgmemory.store._engine import lifecycle
from pgmemory.store._engine.database import Database
from pgmemory.store._engine.retry import retried_read
from pgmemory.store.records import Memory
from pgmemory.store.store import MemoryStore

if TYPE_CHECKING:
    from pgmemory.embedders.base import Embedder


class Admin:
    """Operator views and deployment tasks over an open store.

    Usage::

        async with MemoryStore() as store:
            admin = Admin(store)
            page = await admin.list_users(limit=20)
            report = await admin.verify_audit()

    Args:
        store: An open (or about to be opened) store; the admin plane uses its database.
    """

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    @property
    def _db(self) -> Database:
        return self.store.database

    # --- users, scopes and sessions ---------------------------------------------------------

    @retried_read
    async def list_users(self, *, after: str = "", limit: int | None = None) -> UserPage:
        """A page of users found in any table, in id order, with memory and recall counts.

        Args:
            after: List the users whose id sorts after this one ('' = from the start).
            limit: Users per page (clamped to 1..200).
        """
        return await users.list_users(self._db, after=after, limit=limit)

    @retried_read
    async def user_known(self, user_id: str) -> bool:
        """Whether any table holds a row of the user (memories, audits, history, facts): an
        operator about to erase a user checks they are erasing on the right database."""
        return await users.user_known(self._db, user_id)

    @retried_read
    async def user_scopes(self, user_id: str, *, limit: int | None = None) -> list[ScopeSummary]:
        """The scopes a user's memories live in (one per collection, application, agent and
        session), most recently written first, with their row counts (``limit``: 1..200)."""
        return await users.user_scopes(self._db, user_id, limit=limit)

    @retried_read
    async def user_sessions(
        self, user_id: str, *, limit: int | None = None
    ) -> list[SessionSummary]:
        """A user's chat-history sessions, most recently active first (``limit``: 1..200)."""
        return await users.user_sessions(self._db, user_id, limit=limit)

    # --- memories and their audit -----------------------------------------------------------

    @retried_read
    async def user_memories(
        self,
        user_id: str,
        collection: str,
        *,
        session_id: str | None = None,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int | None = None,
    ) -> Page[Memory]:
        """A page of a user's memories in a collection, newest first (expired ones included
        until ``store.expire`` reclaims them); walk it with the page's ``older``/``newer``.

        Args:
            user_id: The user.
            collection: The collection (an unknown one has no memories).
            session_id: Only this session's memories (None: every session).
            before: The memories older than this cursor (a page's ``older``).
            after: The memories newer than this cursor (a page's ``newer``).
            limit: Memories per page (clamped to 1..200).
        """
        return await memories.user_memories(
            self._db,
            user_id,
            collection,
            session_id=session_id,
            before=before,
            after=after,
            limit=limit,
        )

    @retried_read
    async def get_memory(self, user_id: str, memory_id: uuid.UUID) -> Memory | None:
        """One of a user's memories, or None if it is not stored (never was, or deleted)."""
        return await memories.get_memory(self._db, user_id, memory_id)

    @retried_read
    async def user_memory_audit(
        self,
        user_id: str,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int | None = None,
    ) -> Page[MemoryAuditEntry]:
        """A page of a user's memory writes, deletes and expiries (the memory audit), newest
        first (``limit`` clamped to 1..200)."""
        return await memories.user_memory_audit(
            self._db, user_id, before=before, after=after, limit=limit
        )

    @retried_read
    async def memory_audit_trail(
        self, user_id: str, memory_id: uuid.UUID, *, limit: int = 100
    ) -> list[MemoryAuditEntry]:
        """The audit entries of one of a user's memories, newest first."""
        return await memories.memory_audit_trail(self._db, user_id, memory_id, limit=limit)

    # --- recalls (the recall audit) ---------------------------------------------------------

    @retried_read
    async def user_recalls(
        self,
        user_id: str,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int | None = None,
        preview: int = RECALL_PREVIEW,
    ) -> Page[AuditedRecall]:
        """A page of a user's recalls, newest first, each with the first ``preview`` memories
        it returned and their scores ("which memories went into that answer").

        Args:
            user_id: The user.
            before: The recalls older than this cursor (a page's ``older``).
            after: The recalls newer than this cursor (a page's ``newer``).
            limit: Recalls per page (clamped to 1..200).
            preview: Returned memories joined per recall.
        """
        return await recalls.user_recalls(
            self._db, user_id, before=before, after=after, limit=limit, preview=preview
        )

    @retried_read
    async def get_recall(
        self, user_id: str, recall_id: int, *, limit: int = RECALL_DETAIL_MAX
    ) -> AuditedRecall | None:
        """One of a user's recalls with up to ``limit`` of the memories it returned."""
        return await recalls.get_recall(self._db, user_id, recall_id, limit=limit)

    @retried_read
    async def recalls_of_memory(
        self, user_id: str, memory_id: uuid.UUID, *, limit: int | None = 20
    ) -> list[MemoryRecall]:
        """The latest recalls that returned one of a user's memories, newest first."""
        return await recalls.recalls_of_memory(self._db, user_id, memory_id, limit=limit)

    # --- facts and chat history -------------------------------------------------------------

    @retried_read
    async def user_facts(self, user_id: str, *, limit: int | None = None) -> list[FactSet]:
        """A user's facts as stored now, one set per scope and namespace."""
        return await facts.user_facts(self._db, user_id, limit=limit)

    @retried_read
    async def user_fact_history(
        self,
        user_id: str,
        *,
        before: Cursor | None = None,
        after: Cursor | None = None,
        limit: int | None = None,
    ) -> Page[FactChange]:
        """A page of a user's fact changes (the fact audit), newest first (``limit`` clamped
        to 1..200)."""
        return await facts.user_fact_history(
            self._db, user_id, before=before, after=after, limit=limit
        )

    @retried_read
    async def session_history(
        self,
        user_id: str,
        session_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
    ) -> HistoryPage:
        """A page of one of a user's chat sessions, in order, with its message count."""
        return await history.session_history(
            self._db,
            user_id,
            session_id,
            after_seq=after_seq,
            before_seq=before_seq,
            limit=limit,
        )

    # --- audit retention and integrity ------------------------------------------------------

    async def prune_audit(
        self,
        older_than: timedelta | datetime,
        *,
        actor: str | None = None,
        recall_audit: bool = True,
        memory_audit: bool = True,
        fact_audit: bool = True,
    ) -> dict[str, int]:
        """Delete audit rows older than a cutoff, in ONE transaction (audit retention).

        pgmemory never deletes audit rows on its own. Call this (or run ``pgmemory prune-audit
        --older-than 90d`` on a schedule) to keep the recall, memory and fact audits bounded.
        Memories, facts and chat history are untouched. The prune records itself (cutoff,
        counts, actor) in the fact audit, and later prunes keep those records.

        Args:
            older_than: An age (rows older than now minus it go) or an aware datetime cutoff.
            actor: Who asked, kept in the prune's own record.
            recall_audit: Prune ``pgmemory_recall_audit``.
            memory_audit: Prune ``pgmemory_memory_audit``.
            fact_audit: Prune ``pgmemory_fact_audit``.

        Returns:
            Rows deleted per table: ``recall_audit``, ``memory_audit``, ``fact_audit``.

        Raises:
            InvalidInputError: A negative age or a naive datetime.
        """
        return await retention.prune_audit(
            self._db,
            older_than,
            actor=actor,
            recall_audit=recall_audit,
            memory_audit=memory_audit,
            fact_audit=fact_audit,
        )

    @retried_read
    async def list_prunes(self, *, limit: int | None = 20) -> list[PruneRecord]:
        """The latest audit prunes, newest first."""
        return await retention.list_prunes(self._db, limit=limit)

    async def verify_audit(self) -> integrity.AuditReport:
        """Check that the audit is intact: its guard (triggers, functions, grants) and every
        audit row's hash. Reads only; a full scan of the audit tables.

        Returns:
            The report: ``report.ok``, and each failed check naming the problem. See
            :mod:`pgmemory.admin.integrity` for what it can and cannot detect.
        """
        return await integrity.verify(self._db)

    # --- access tokens (the audit page; see pgmemory.admin.tokens) ----------------------------

    async def issue_token(
        self, name: str, *, purpose: str = "ui", lifetime: timedelta = DEFAULT_LIFETIME
    ) -> IssuedToken:
        """Issue a token under ``name``; the token is in the result only, never stored.

        Args:
            name: The label (whose or what it is), unique among live tokens.
            purpose: What it opens: ``"ui"`` (the audit page) or ``"mcp"``.
            lifetime: How long it works (at most a year).

        Raises:
            InvalidInputError: A bad name, purpose or lifetime, or a live token of that name.
        """
        return await tokens.issue_token(self._db, name, purpose=purpose, lifetime=lifetime)

    async def verify_token(self, token: str, *, purpose: str = "ui") -> TokenInfo | None:
        """The record of ``token`` when it is live and opens ``purpose``, else None."""
        return await tokens.verify_token(self._db, token, purpose=purpose)

    async def token_still_valid(self, token_id: int, *, purpose: str = "ui") -> bool:
        """Whether the token numbered ``token_id`` is neither revoked nor expired."""
        return await tokens.token_still_valid(self._db, token_id, purpose=purpose)

    async def list_tokens(
        self, *, include_inactive: bool = False, limit: int | None = None
    ) -> list[TokenInfo]:
        """Tokens, newest first: names, purposes and dates (live ones unless
        ``include_inactive``); never a token or its hash."""
        return await tokens.list_tokens(self._db, include_inactive=include_inactive, limit=limit)

    async def revoke_token(self, name_or_id: str | int) -> TokenInfo | None:
        """Revoke the live token of this name (or number) at once; None when there is none."""
        return await tokens.revoke_token(self._db, name_or_id)

    # --- deployment: roles, partitioning, Citus ---------------------------------------------

    async def create_app_role(self, name: str, password: str) -> roles.RoleReport:
        """Create (or reset) a least-privilege application role for this store's schema.

        It may read and write the data tables, only INSERT and SELECT the audits, erase and
        prune through pgmemory's functions, and create nothing. Run as the schema's owner; the
        password reaches the server only as a SCRAM verifier. See :mod:`pgmemory.admin.roles`.

        Args:
            name: The role's name: 1-63 of a-z, 0-9 and _ (e.g. ``pgmemory_app``).
            password: Its password, 12 characters at least.

        Returns:
            What was done (statements run, with the password masked, and any warnings).
        """
        return await roles.create_app_role(self._db, name, password)

    async def partition_memories(self, *, partitions: int = 16) -> partitioning.PartitionReport:
        """Hash-partition the EMPTY memories table by ``user_id`` into ``partitions`` partitions.

        Opt-in, once, right after the migrations and before any memory is written (and before
        ``create_app_role``, whose grants name the table); see :mod:`pgmemory.admin.partitioning`.

        Raises:
            InvalidInputError: A bad count.
            DatabaseNotReadyError: The table is missing, already partitioned or not empty, or
                the database has Citus (nothing is changed).
        """
        return await partitioning.partition_memories(self._db, partitions)

    async def add_half_vectors(self) -> half_vectors.HalfVectorsReport:
        """Add the half vectors (a second first pass for large scopes whose codes fail), once.

        Every write then pays for them; the table is rewritten. See
        :mod:`pgmemory.admin.half_vectors`.

        Raises:
            DatabaseNotReadyError: pgvector is older than 0.7 (nothing is changed).
        """
        return await half_vectors.add_half_vectors(self._db)

    async def reembed(
        self,
        collection: str,
        embedder: Embedder,
        *,
        batch_size: int = reembedding.DEFAULT_BATCH,
        switch: bool = True,
        restart: bool = False,
        progress: reembedding.Progress | None = None,
    ) -> reembedding.Reembedding:
        """Re-embed every memory of ``collection`` with ``embedder``'s model: staged in batches
        beside the vectors searches use (resumable), then switched over in one transaction
        (see :mod:`pgmemory.admin.reembedding`). Restart the application's processes with the
        new embedder after the switch.

        Raises:
            CollectionError: No such collection; another model is being staged (pass
                ``restart``); or an approximate index stands in the way of a new size.
            InvalidInputError: A bad batch size or embedder identity.
            EmbeddingError: The embedder failed (what was staged stays: run again).
        """
        return await reembedding.reembed(
            self._db,
            collection,
            embedder,
            batch_size=batch_size,
            switch=switch,
            restart=restart,
            progress=progress,
        )

    async def distribute(self) -> distribution.Distribution:
        """On a Citus coordinator: make the catalogue a reference table and distribute every
        per-user table by ``user_id``, co-located, all or nothing (see
        :func:`pgmemory.admin.distribution.distribute`).

        Raises:
            DatabaseNotReadyError: The ``citus`` extension is not installed (nothing is changed).
        """
        return await distribution.distribute(self._db)


lifecycle.refuse_when_closed(Admin, lambda admin: admin._db.closed, keep=())
