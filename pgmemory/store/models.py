"""The schema, as SQLAlchemy 2 typed models. Alembic migrations must agree with this file.

Every table is prefixed ``pgmemory_`` so the schema can share a database with the host
application. Design rules that keep the schema auditable and distributable (Citus, by
``user_id``):

* scope columns (application_id, agent_id, user_id, session_id) are ``NOT NULL`` text, with
  ``''`` meaning "not set", so every scope predicate is a plain ``col = $n`` a B-tree serves;
* every primary key of a per-user table includes ``user_id`` (the distribution column), and no
  statement joins rows of different users;
* ``embedding`` is an untyped ``vector`` (collections of different sizes share the table) kept
  inline with ``STORAGE MAIN`` (set in the migrations): exact scans never de-TOAST a row that
  fits a page with its vector; only rows that cannot (about 1,950 dimensions and up) keep it
  out of line. ``search_vector`` is ``STORAGE MAIN`` too, so a keyword match reads its terms
  from the row rather than the TOAST table; ``content`` is what leaves a wide row instead.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    ARRAY,
    BigInteger,
    CheckConstraint,
    Computed,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import BIT, JSONB, REAL, TSVECTOR, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Largest vector kept in the covering B-tree entry (2,704 bytes at most per entry): at 512
#: dimensions about 600 bytes remain for the collection name and the four scope ids together.
COVERING_MAX_DIMENSIONS = 512
#: Largest vector whose half-precision copy is kept where an operator adds the half vectors
#: (pgmemory.admin.half_vectors: the index's entry holds 1,024 halves in the 2,048 bytes 512
#: floats take in the covering one); wider vectors keep NULL.
HALVES_MAX_DIMENSIONS = 1024
#: Largest vector a collection may hold: pgvector's index limit, and what fits an 8 kB page inline.
MAX_DIMENSIONS = 2000
#: A row's conversation (its user, session, agent and application ids), hashed to 8 bytes: the
#: conversation index's first key after the collection (0021). No id is in that index's entry,
#: so it adds no limit on their lengths, and no scope filter (``user_id = ...``) can use it.
#: Written as PostgreSQL prints it back, so that alembic's comparison finds the index unchanged;
#: unqualified column names, as it is also written in statements over one table alias.
CONVERSATION_KEY = (
    "hashtextextended((((((user_id || '/'::text) || session_id) || '/'::text) || agent_id)"
    " || '/'::text) || application_id, 0::bigint)"
)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base of pgmemory's tables."""

    metadata = MetaData(naming_convention=NAMING)


def _scope_column() -> Mapped[str]:
    return mapped_column(Text, nullable=False, server_default=text("''"))


class CollectionRow(Base):
    """The catalogue: one row per collection, fixing its vector size and embedding model."""

    __tablename__ = "pgmemory_collections"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    dimensions: Mapped[int] = mapped_column(Integer, nullable=False)
    embedding_model: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    #: The model (and its size) whose vectors ``pgmemory db reembed`` is staging in
    #: ``pgmemory_memories.embedding_next``; NULL when none is (0015).
    next_embedding_model: Mapped[str | None] = mapped_column(Text)
    next_dimensions: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        CheckConstraint(f"dimensions BETWEEN 1 AND {MAX_DIMENSIONS}", name="dimensions_range"),
        CheckConstraint(
            f"next_dimensions BETWEEN 1 AND {MAX_DIMENSIONS}", name="next_dimensions_range"
        ),
        CheckConstraint("name <> ''", name="name_not_blank"),
    )


class MemoryRow(Base):
    """One stored message (or note) with its scope, provenance, text and embedding."""

    __tablename__ = "pgmemory_memories"

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(Text, primary_key=True, server_default=text("''"))
    collection: Mapped[str] = mapped_column(
        Text, ForeignKey("pgmemory_collections.name", ondelete="RESTRICT"), nullable=False
    )
    application_id: Mapped[str] = _scope_column()
    agent_id: Mapped[str] = _scope_column()
    session_id: Mapped[str] = _scope_column()
    role: Mapped[str] = mapped_column(Text, nullable=False)
    author_name: Mapped[str | None] = mapped_column(Text)
    message_id: Mapped[str | None] = mapped_column(Text)
    source_type: Mapped[str] = mapped_column(
        Text, nullable=False, server_default=text("'external'")
    )
    source_id: Mapped[str | None] = mapped_column(Text)
    content: Mapped[str] = mapped_column(Text, nullable=False)
    #: Hex sha256 of ``content``: joins memories to their audit rows without the text.
    content_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    #: Keyword terms of ``content`` (see pgmemory.text.terms) for full-text recall.
    search_vector: Mapped[Any] = mapped_column(
        TSVECTOR, nullable=False, server_default=text("''::tsvector")
    )
    embedding: Mapped[Any] = mapped_column(Vector(), nullable=False)
    #: ``binary_quantize(embedding)``: one bit per dimension (set where the component is
    #: positive), kept by PostgreSQL itself; the first pass of a large scope's search (0013).
    embedding_code: Mapped[Any] = mapped_column(
        BIT(varying=True),
        Computed("CAST(binary_quantize(embedding) AS bit varying)", persisted=True),
    )
    embedding_model: Mapped[str] = mapped_column(Text, nullable=False)
    #: The vector from the model a re-embedding is staging (see CollectionRow); NULL otherwise.
    embedding_next: Mapped[Any] = mapped_column(Vector(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    #: Estimated tokens of the memory's full recall line (``pgmemory.store.recall_text``), set
    #: at write time; NULL only for a row written by an older version during an upgrade.
    recall_tokens: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        CheckConstraint("length(content_sha256) = 64", name="sha256_length"),
        CheckConstraint("content <> ''", name="content_not_blank"),
        # Exact recall for a user (optionally narrowed by session/agent/application), served
        # index-only: the vector and everything the filter reads are in the entry.
        Index(
            "ix_pgmemory_memories_user_cover",
            "collection",
            "user_id",
            "session_id",
            "agent_id",
            "application_id",
            postgresql_include=["id", "created_at", "expires_at", "embedding"],
            postgresql_where=text(f"vector_dims(embedding) <= {COVERING_MAX_DIMENSIONS}"),
        ),
        # The first pass of a large scope's search (every size: d / 8 bytes of code a row):
        # the rows nearest by Hamming distance, re-ranked exactly from the full vectors.
        # User scopes only (the path serves no narrower one), so the index adds no limit on the
        # other scope ids.
        Index(
            "ix_pgmemory_memories_user_codes",
            "collection",
            "user_id",
            postgresql_include=["id", "expires_at", "embedding_code"],
        ),
        # Newest-first listing and recency recall per user; exact recall of large vectors.
        Index("ix_pgmemory_memories_user_recent", "collection", "user_id", "created_at"),
        # Scopes without a user: per session, or per application/agent.
        Index("ix_pgmemory_memories_session_recent", "collection", "session_id", "created_at"),
        Index(
            "ix_pgmemory_memories_app_agent_recent",
            "collection",
            "application_id",
            "agent_id",
            "created_at",
        ),
        # Each conversation's rows in time order: a hybrid search's neighbour probes (the two
        # rows before and after a pooled row read, and nothing else; 0021).
        Index(
            "ix_pgmemory_memories_conversation",
            "collection",
            text(CONVERSATION_KEY),
            "created_at",
            "id",
            postgresql_include=["expires_at"],
        ),
        # A message is stored once per collection and scope, however often it is re-sent.
        Index(
            "uq_pgmemory_memories_message",
            "collection",
            "user_id",
            "application_id",
            "agent_id",
            "session_id",
            "message_id",
            unique=True,
            postgresql_where=text("message_id IS NOT NULL"),
        ),
        # Keyword recall in a user scope: each term keyed by its collection and user (0018).
        Index(
            "ix_pgmemory_memories_scope_terms",
            text("pgmemory_scope_terms(collection, user_id, search_vector)"),
            postgresql_using="gin",
            # New keys go straight into their posting lists, not a pending list every
            # search reads (0020).
            postgresql_with={"fastupdate": "off"},
        ),
        # Expiry sweeps only look at rows that can expire.
        Index(
            "ix_pgmemory_memories_expires_at",
            "expires_at",
            postgresql_where=text("expires_at IS NOT NULL"),
        ),
    )


class ScopeRecorded:
    """The scope dimensions a record of a change or a recall keeps beside its ``user_id``:
    ``NOT NULL`` text, ``''`` for unset, as the memory row held them (the audit tables and the
    deletion evidence; declared once here, each table's own columns around them)."""

    application_id: Mapped[str] = mapped_column(Text, nullable=False)
    agent_id: Mapped[str] = mapped_column(Text, nullable=False)
    session_id: Mapped[str] = mapped_column(Text, nullable=False)


class MemoryAuditRow(ScopeRecorded, Base):
    """Append-only log of every write and delete of memories, written in the same statement."""

    __tablename__ = "pgmemory_memory_audit"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(Text, primary_key=True)
    at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    txid: Mapped[int] = mapped_column(
        BigInteger, nullable=False, server_default=text("(pg_current_xact_id()::text)::bigint")
    )
    operation: Mapped[str] = mapped_column(Text, nullable=False)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), nullable=False)
    collection: Mapped[str] = mapped_column(Text, nullable=False)
    #: ``sha256(user secret || sha256(content))`` in hex: keyed, so it cannot confirm a guess.
    content_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    actor: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    #: Hex sha256 of the whole row (set by the guard trigger; ``pgmemory audit verify`` checks it).
    row_sha256: Mapped[str] = mapped_column(Text, nullable=False)

    __table_args__ = (
        CheckConstraint("operation IN ('insert', 'delete', 'expire')", name="operation_known"),
        Index("ix_pgmemory_memory_audit_memory", "user_id", "memory_id"),
        Index("ix_pgmemory_memory_audit_at", "at"),
    )


class RecallAuditRow(ScopeRecorded, Base):
    """One row per recall: who searched which scope, for what, and which memories came back."""

    __tablename__ = "pgmemory_recall_audit"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(Text, primary_key=True)
    at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    collection: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    mode: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    requesting_session_id: Mapped[str] = mapped_column(
        Text, nullable=False, server_default=text("''")
    )
    #: The query's hash, keyed like ``pgmemory_memory_audit.content_sha256``.
    query_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    query_text: Mapped[str | None] = mapped_column(Text)
    memory_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)), nullable=False)
    scores: Mapped[list[float]] = mapped_column(ARRAY(REAL()), nullable=False)
    #: Hex sha256 of the whole row (set by the guard trigger; ``pgmemory audit verify`` checks it).
    row_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    #: Why each memory was shown (``match``, ``recent``, ``neighbour``), paired with
    #: ``memory_ids``; NULL in rows written before migration 0010 and by searches
    #: without ``explain``; ...
    reasons: Mapped[list[str] | None] = mapped_column(ARRAY(Text()))
    #: ... and what each signal contributed, one JSON object (or null) per memory.
    signals: Mapped[Any | None] = mapped_column(JSONB)

    __table_args__ = (
        Index("ix_pgmemory_recall_audit_user_at", "user_id", "at"),
        Index("ix_pgmemory_recall_audit_session", "user_id", "requesting_session_id", "at"),
    )


class UserSecretRow(Base):
    """One random 32-byte secret per user, keying the hashes in that user's audit rows.

    Created on the user's first audited write or recall (by ``pgmemory_keyed_sha256``) and
    deleted when the user is erased, after which the user's audit hashes and pseudonym can no
    longer be linked to the user or to any guessed text. Only the table's owner reads it.
    """

    __tablename__ = "pgmemory_user_secrets"

    user_id: Mapped[str] = mapped_column(Text, primary_key=True)
    secret: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )

    __table_args__ = (CheckConstraint("length(secret) = 32", name="secret_length"),)


class ChatMessageRow(Base):
    """Chat history: one row per message per session, in order."""

    __tablename__ = "pgmemory_chat_messages"

    user_id: Mapped[str] = mapped_column(Text, primary_key=True, server_default=text("''"))
    session_id: Mapped[str] = mapped_column(Text, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    message_id: Mapped[str] = mapped_column(Text, nullable=False)
    role: Mapped[str] = mapped_column(Text, nullable=False)
    message: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )

    __table_args__ = (
        Index(
            "uq_pgmemory_chat_messages_message",
            "user_id",
            "session_id",
            "message_id",
            unique=True,
        ),
        CheckConstraint("session_id <> ''", name="session_not_blank"),
    )


class FactsRow(Base):
    """Structured facts about a scope (e.g. a user's name and age), one JSON object per namespace."""

    __tablename__ = "pgmemory_facts"

    user_id: Mapped[str] = mapped_column(Text, primary_key=True)
    application_id: Mapped[str] = mapped_column(Text, primary_key=True)
    agent_id: Mapped[str] = mapped_column(Text, primary_key=True)
    session_id: Mapped[str] = mapped_column(Text, primary_key=True)
    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    facts: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class FactAuditRow(ScopeRecorded, Base):
    """Append-only log of every fact that was set, changed or removed, with old and new value."""

    __tablename__ = "pgmemory_fact_audit"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    user_id: Mapped[str] = mapped_column(Text, primary_key=True)
    at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    namespace: Mapped[str] = mapped_column(Text, nullable=False)
    key: Mapped[str] = mapped_column(Text, nullable=False)
    old_value: Mapped[Any] = mapped_column(JSONB, nullable=True)
    new_value: Mapped[Any] = mapped_column(JSONB, nullable=True)
    actor: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    #: Hex sha256 of the whole row (set by the guard trigger; ``pgmemory audit verify`` checks it).
    row_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    #: What the change was derived from (``{"message_ids": [...]}``), NULL when not recorded.
    sources: Mapped[Any] = mapped_column(JSONB, nullable=True)

    __table_args__ = (Index("ix_pgmemory_fact_audit_scope", "user_id", "namespace", "at"),)


class JobRow(Base):
    """Derivation work a turn left for a worker (e.g. extracting the user's facts), durable.

    Inserted in the turn's transaction; leased by a worker (``lease_id`` until ``leased_until``;
    ``attempts`` counts the leases);
    deleted in the transaction that writes what the worker derived, or by the user's erasure.
    ``payload`` holds the messages to derive from; ``last_error`` an exception type only.
    """

    __tablename__ = "pgmemory_jobs"

    user_id: Mapped[str] = mapped_column(Text, primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    namespace: Mapped[str] = mapped_column(Text, nullable=False)
    application_id: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    agent_id: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    session_id: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    run_after: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    lease_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    leased_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        Index("ix_pgmemory_jobs_due", "namespace", "run_after"),
        CheckConstraint("namespace <> ''", name="namespace_not_blank"),
    )


class DeletedMemoryRow(ScopeRecorded, Base):
    """Evidence of a memory's deletion, for its audit row (migration 0023).

    Written by a ``BEFORE DELETE`` trigger on the memories, as the tables' owner (the
    application role may only read this table), with the deleting transaction's id; the
    deletion's audit row takes it in the same transaction, so the table is normally empty. A
    row left here is a deletion no audit row recorded (``pgmemory audit verify`` reports it).
    """

    __tablename__ = "pgmemory_deleted_memories"

    user_id: Mapped[str] = mapped_column(Text, primary_key=True)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    collection: Mapped[str] = mapped_column(Text, nullable=False)
    txid: Mapped[int] = mapped_column(
        BigInteger, nullable=False, server_default=text("(pg_current_xact_id()::text)::bigint")
    )
    at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )


class AccessTokenRow(Base):
    """An operator's access token, kept as its sha256 only: who it was issued to (a label),
    what it opens (``purpose``), until when, and whether it was revoked.

    The token itself is shown once, when issued; a stolen copy of this table opens nothing.
    Only the owner reads or writes it (the least-privilege role has no grant on it).
    """

    __tablename__ = "pgmemory_access_tokens"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    purpose: Mapped[str] = mapped_column(Text, nullable=False)
    token_sha256: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        Index("uq_pgmemory_access_tokens_sha256", "token_sha256", unique=True),
        # One live token per name: a name says whose it is when it is listed or revoked.
        Index(
            "uq_pgmemory_access_tokens_name",
            "name",
            unique=True,
            postgresql_where=text("revoked_at IS NULL"),
        ),
        CheckConstraint("name <> ''", name="name_not_blank"),
        CheckConstraint("expires_at > created_at", name="expires_after_creation"),
    )


__all__ = [
    "COVERING_MAX_DIMENSIONS",
    "HALVES_MAX_DIMENSIONS",
    "MAX_DIMENSIONS",
    "AccessTokenRow",
    "Base",
    "ChatMessageRow",
    "CollectionRow",
    "FactAuditRow",
    "FactsRow",
    "JobRow",
    "MemoryAuditRow",
    "MemoryRow",
    "RecallAuditRow",
    "UserSecretRow",
]
