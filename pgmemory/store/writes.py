"""Storing memories: batched inserts, bulk COPY imports, and the checks both run first.

Every record of a batch is checked, and texts without a vector embedded, before any SQL runs,
so a bad batch is refused whole. Each batch (or import) is ONE transaction, and every row's
insert is audited by the same statement that stores it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

import pgmemory.telemetry as telemetry
from pgmemory.errors import DuplicateIdError, InvalidInputError, ScopeError, UnscopedError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store._engine.deployment import Write
from pgmemory.store.catalogue import Catalogue
from pgmemory.store.columns import STAGING_TYPES, copy_fields, to_batch
from pgmemory.store.jsonb import jsonb
from pgmemory.store.models import COVERING_MAX_DIMENSIONS, HALVES_MAX_DIMENSIONS
from pgmemory.store.recall_text import line_tokens
from pgmemory.store.records import CollectionInfo, MemoryRecord, MemoryScope
from pgmemory.store.uuid7 import uuid7
from pgmemory.store.validation import (
    CODES_INDEX,
    COVERING_INDEX,
    HALVES_INDEX,
    MAX_NAME_CHARS,
    MEMORY_AUDIT_INDEXES,
    MEMORY_INDEXES,
    MESSAGE_INDEX,
    IndexShape,
    check_aware,
    check_choice,
    check_index_entries,
    check_metadata,
    check_optional_name,
    check_text,
    check_vector,
    describe,
    sha256_hex,
)
from pgmemory.text import terms
from pgmemory.vocabulary import ROLES, SOURCE_TYPES

logger = logging.getLogger(__name__)

#: A bulk import of at least this many rows, and of at least ANALYZE_SHARE of the rows the
#: table held at its last analysis, vacuums and analyses the table when it commits: autovacuum
#: would only after its next pass (a minute or more). Until then statements are planned for a
#: table without those rows (measured: a fresh 1,000-message scope's hybrid recall 43 ms, 33 ms
#: once analysed), and the new rows' pages are not all-visible, so an index-only scan of the
#: covering index reads every new row from the heap as well (measured: a 1,000-row scope's
#: vector search 3.5-6.3 ms after the import, 0.94 ms once vacuumed; docs/performance.md).
ANALYZE_MIN_ROWS = 1_000
ANALYZE_SHARE = 0.1

#: Rows per INSERT statement: each chunk is one statement with an array parameter per sent
#: column, far below PostgreSQL's 65,535 bind parameters, and keeps a statement's payload
#: around a few MB.
INSERT_CHUNK_ROWS = 1_000


async def add(
    db: Database,
    catalogue: Catalogue,
    collection: str,
    records: Sequence[MemoryRecord],
    *,
    actor: str | None,
    allow_unscoped: bool,
) -> list[uuid.UUID]:
    """Store a batch in ONE transaction, INSERT_CHUNK_ROWS rows per statement.

    Returns:
        The ids of the rows stored, in record order (a re-sent message is skipped); in a
        deferred unit of work, of every row sent with its commit (a re-sent message is skipped
        then, unseen here).
    """
    with telemetry.operation(
        telemetry.UPDATE_MEMORY, settings=db.settings, collection=collection
    ) as op:
        info = await catalogue.get(collection)
        rows = await prepare(
            catalogue,
            info,
            records,
            max_chars=db.settings.max_text_chars,
            actor=actor,
            allow_unscoped=allow_unscoped,
            halves="halves" in db.first_passes,
        )
        if not rows:
            return []
        # Chunks in message-key order, as each statement inserts its rows (see q.INSERT_MEMORIES):
        # then two batches of the same messages claim them in one order and cannot deadlock.
        ordered = sorted(rows, key=message_key)
        stored: set[uuid.UUID] = set()
        users = sorted({row["user_id"] or "" for row in rows})
        # One chunk is one statement with its locks: one round trip, its own transaction (or
        # the unit of work's); the chunks of a larger batch share one transaction.
        together = (
            db.unit_of_work() if len(ordered) > INSERT_CHUNK_ROWS else contextlib.nullcontext()
        )
        async with _ids_stored_once(), together:
            for start in range(0, len(ordered), INSERT_CHUNK_ROWS):
                sent = ordered[start : start + INSERT_CHUNK_ROWS]
                chunk = to_batch(sent)
                inserted = await db.written(
                    Write(
                        q.MEMORY_INSERT,
                        {
                            **chunk,
                            "collection": collection,
                            "embedding_model": info.embedding_model,
                            "actor": actor or "",
                        },
                        users=users,
                        deferrable=True,
                    )
                )
                if inserted is None:  # queued for a deferred unit of work's commit
                    stored.update(row["id"] for row in sent)
                else:
                    stored.update(row["memory_id"] for row in inserted)
        logger.info("stored %d memories in collection %s", len(stored), collection)
        ids = [row["id"] for row in rows if row["id"] in stored]
        op.written(ids)
        return ids


async def import_records(
    db: Database,
    catalogue: Catalogue,
    collection: str,
    records: Iterable[MemoryRecord],
    *,
    actor: str | None,
    batch_rows: int,
    progress: bool,
    allow_unscoped: bool,
) -> int:
    """Bulk-load records with binary COPY through a staging table, in ONE transaction.

    Records are checked and embedded ``batch_rows`` at a time; the staged rows then move into
    the collection (audited): those with a message id in message-key order, as :func:`add`
    inserts them, then the others. No statement timeout applies.

    Returns:
        How many rows were stored (re-sent messages are skipped).
    """
    with telemetry.operation(
        telemetry.UPDATE_MEMORY, settings=db.settings, collection=collection
    ) as op:
        from tqdm.auto import tqdm

        info = await catalogue.get(collection)
        bar = tqdm(desc=f"import {collection}", unit="rows", disable=not progress)
        async with _ids_stored_once(), db.write() as conn:
            await conn.execute(clause(q.NO_STATEMENT_TIMEOUT))
            await conn.execute(clause(q.CREATE_STAGING))
            cursor = (await _driver_connection(conn)).cursor()
            batch: list[MemoryRecord] = []
            staged = 0

            async def flush() -> None:
                nonlocal staged
                rows = await prepare(
                    catalogue,
                    info,
                    batch,
                    max_chars=db.settings.max_text_chars,
                    actor=actor,
                    allow_unscoped=allow_unscoped,
                    first=staged,
                    halves="halves" in db.first_passes,
                )
                async with cursor.copy(q.COPY_STAGING) as copy:
                    copy.set_types(list(STAGING_TYPES))
                    for row in rows:
                        await copy.write_row(copy_fields(row))
                staged += len(rows)
                bar.update(len(rows))
                batch.clear()

            for record in records:
                batch.append(record)
                if len(batch) >= batch_rows:
                    await flush()
            if batch:
                await flush()
            params = {
                "collection": collection,
                "embedding_model": info.embedding_model,
                "actor": actor or "",
            }
            total = 0
            for statement in (q.INSERT_FROM_STAGING, q.INSERT_FROM_STAGING_UNKEYED):
                total += len((await conn.execute(clause(statement), params)).all())
        bar.close()
        logger.info("imported %d memories into collection %s", total, collection)
        op.count("record.count", total)
        telemetry.MEMORIES_WRITTEN.add(total)
        await _refresh_statistics(db, total)
        return total


async def _refresh_statistics(db: Database, imported: int) -> None:
    """After an import of ``imported`` committed rows: VACUUM (ANALYZE) the memories table if
    they are at least ANALYZE_MIN_ROWS and ANALYZE_SHARE of what it held at its last analysis,
    on a connection in autocommit (a vacuum cannot run in a transaction), with no statement
    timeout, like the import, and never waiting for a lock (``SKIP_LOCKED``: PostgreSQL then
    warns and skips). The import has committed: a failure here is logged, not raised. Inside a
    unit of work the rows are not committed yet, and nothing is done."""
    if imported < ANALYZE_MIN_ROWS or db.in_unit_of_work:
        return
    try:
        async with db.ddl() as conn:
            analysed = float((await conn.execute(clause(q.ANALYSED_ROWS))).scalar() or 0)
            if imported < ANALYZE_SHARE * analysed:
                return
            await conn.execute(clause(q.MAINTENANCE_SETTINGS), {"maintenance_work_mem": None})
            try:
                await conn.execute(clause(q.VACUUM_ANALYZE_MEMORIES))
            finally:
                await conn.execute(clause(q.MAINTENANCE_RESET))
        logger.info("ran VACUUM (ANALYZE) on the memories after importing %d rows", imported)
    except DBAPIError as exc:
        logger.warning(
            "could not vacuum and analyse the memories after an import (%s); autovacuum will",
            type(exc.orig).__name__,
        )


async def prepare(
    catalogue: Catalogue,
    info: CollectionInfo,
    records: Sequence[MemoryRecord],
    *,
    max_chars: int,
    actor: str | None,
    allow_unscoped: bool,
    first: int = 0,
    halves: bool = False,
) -> list[dict[str, Any]]:
    """Check a batch and turn each record into a row, embedding the texts without a vector.

    Free text is normalised (:mod:`pgmemory.text.clean`: NUL and lone surrogates in contents,
    author names and metadata become U+FFFD); ids are refused instead, and must fit together
    in the index entries that hold them (:func:`~pgmemory.store.validation.check_index_entries`).

    Args:
        catalogue: Embeds the texts without a vector.
        info: The collection.
        records: The batch.
        max_chars: The longest content accepted.
        actor: Who writes (checked here).
        allow_unscoped: Accept records with an empty scope.
        first: The position of the batch's first record in its import (0 for ``add``).
        halves: The memories keep half vectors (:mod:`pgmemory.admin.half_vectors`), so ids
            must fit beside them in that index too.

    Returns:
        One dict per record, keyed by the sent values' names
        (:data:`pgmemory.store.columns.STAGING_COLUMNS`), with a new id and its position each.

    Raises:
        InvalidInputError: A record is unusable (its index is in the message); nothing is
            stored.
        ScopeError: A record's scope is not a MemoryScope, or is empty without
            ``allow_unscoped``.
    """
    check_optional_name(actor, what="actor")
    rows: list[dict[str, Any]] = []
    given: dict[tuple[str, uuid.UUID], int] = {}  # one batch's; the key catches the rest
    for i, record in enumerate(records):
        row = _row(record, f"records[{i}]", info, max_chars, allow_unscoped, halves)
        row["position"] = first + i
        if record.id is not None:
            key = (row["user_id"], row["id"])
            if key in given:
                raise DuplicateIdError(
                    f"records[{first + i}].id {row['id']} repeats records[{given[key]}].id in "
                    "the same user's scope; ids are unique per user: drop the repeat, or pass "
                    "id=None for a new id",
                    str(row["id"]),
                )
            given[key] = first + i
        rows.append(row)
    to_embed = [i for i, row in enumerate(rows) if row["embedding"] is None]
    if to_embed:
        vectors = await catalogue.embed(info, [rows[i]["content"] for i in to_embed])
        for i, vector in zip(to_embed, vectors, strict=True):
            rows[i]["embedding"] = check_vector(
                vector, dimensions=info.dimensions, what=f"records[{i}] embedding"
            )
    return rows


def _row(
    record: object,
    where: str,
    info: CollectionInfo,
    max_chars: int,
    allow_unscoped: bool,
    halves: bool,
) -> dict[str, Any]:
    """One record's row (its embedding None when the store must make it)."""
    if not isinstance(record, MemoryRecord):
        raise InvalidInputError(f"{where} is a {type(record).__name__}; pass MemoryRecord objects")
    if not isinstance(record.scope, MemoryScope):
        raise ScopeError(f"{where}.scope must be a MemoryScope, got {describe(record.scope)}")
    if record.scope.is_empty and not allow_unscoped:
        raise UnscopedError(
            f"{where} has an empty scope: tag it with a user, session, agent or "
            "application id (or pass allow_unscoped=True to store it for everybody)"
        )
    content = check_text(record.content, what=f"{where}.content", max_chars=max_chars, clean=True)
    # Checked in this order, so that of two faults the same one is always reported.
    row: dict[str, Any] = {
        "id": uuid7() if record.id is None else _given_id(record.id, where),
        **record.scope.column_values(),
        "role": check_choice(record.role, what=f"{where}.role", choices=ROLES),
        "author_name": None
        if record.author_name is None
        else check_text(
            record.author_name,
            what=f"{where}.author_name",
            max_chars=MAX_NAME_CHARS,
            clean=True,
            if_blank="pass None when there is no author name",
            if_long="shorten the display name",
        ),
        "message_id": check_optional_name(record.message_id, what=f"{where}.message_id"),
        "source_type": check_choice(
            record.source_type, what=f"{where}.source_type", choices=SOURCE_TYPES
        ),
        "source_id": check_optional_name(record.source_id, what=f"{where}.source_id"),
        "content": content,
        "content_sha256": sha256_hex(content),
        "terms": terms.document(content),
        "embedding": None
        if record.embedding is None
        else check_vector(record.embedding, dimensions=info.dimensions, what=f"{where}.embedding"),
        "created_at": check_aware(record.created_at, what=f"{where}.created_at"),
        "expires_at": check_aware(record.expires_at, what=f"{where}.expires_at"),
        "metadata": jsonb(check_metadata(record.metadata, what=f"{where}.metadata")),
    }
    row["recall_tokens"] = line_tokens(record.role, content)
    check_index_entries(
        _entry_shapes(info.dimensions, row["message_id"] is not None, halves),
        {**row, "collection": info.name, "embedding": info.dimensions},
        where=where,
        names=_FIELD_NAMES,
    )
    return row


#: How messages name a memory row's text fields.
_FIELD_NAMES = {
    "collection": "the collection name",
    **{d: f"scope.{d}" for d in MemoryScope.DIMENSIONS},
    "message_id": "message_id",
}


@lru_cache(maxsize=64)
def _entry_shapes(dimensions: int, has_message_id: bool, halves: bool) -> tuple[IndexShape, ...]:
    """The B-tree indexes a memory row of a collection of ``dimensions`` goes into (and its
    audit row); ``halves``: the memories keep half vectors."""
    shapes = [*MEMORY_INDEXES, CODES_INDEX, *([MESSAGE_INDEX] if has_message_id else [])]
    if dimensions <= COVERING_MAX_DIMENSIONS:
        shapes.append(COVERING_INDEX)
    if halves and dimensions <= HALVES_MAX_DIMENSIONS:
        shapes.append(HALVES_INDEX)
    return (*shapes, *MEMORY_AUDIT_INDEXES)


def message_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's place in insert order: its message key as ``COLLATE "C"`` orders it, rows
    without a message id last (they cannot conflict), then its position."""
    key = tuple(row[c] or "" for c in q.MESSAGE_KEY)
    return (row["message_id"] is None, *key, row["position"])


async def _driver_connection(conn: AsyncConnection) -> Any:
    """The psycopg AsyncConnection under a SQLAlchemy connection (for COPY)."""
    raw = await conn.get_raw_connection()
    return raw.driver_connection


#: The detail PostgreSQL gives for a second row with a stored (id, user_id) key; the id is
#: matched alone, so what follows it (the user id) never reaches the message.
_STORED_ID = re.compile(r"Key \(id, user_id\)=\(([0-9a-f-]{36}), ")


@contextlib.asynccontextmanager
async def _ids_stored_once() -> AsyncIterator[None]:
    """Turn the primary key's refusal of an id the user already has into an error naming it."""
    try:
        yield
    except IntegrityError as exc:
        found = _STORED_ID.search(
            str(getattr(getattr(exc.orig, "diag", None), "message_detail", ""))
        )
        if found is None:
            raise
        raise DuplicateIdError(
            f"memory id {found.group(1)} is already stored in this user's scope (or given twice "
            "in one import); ids are unique per user: pass id=None for a new id, or delete "
            "the stored memory first",
            found.group(1),
        ) from None


def _given_id(value: object, where: str) -> uuid.UUID:
    """A record's own id (a restored memory keeps the id it was exported with)."""
    if not isinstance(value, uuid.UUID):
        raise InvalidInputError(
            f"{where}.id is a {type(value).__name__}; pass a uuid.UUID, or None for a new id"
        )
    return value
