"""The columns of a memory row (``pgmemory_memories``), defined once.

Everything that lists them is derived from :data:`MEMORY_COLUMNS`: the SQL column lists, the
staging table of bulk imports, the binary COPY types, the ``unnest`` casts of batched inserts
(all in :mod:`pgmemory.store.queries`), the batches :mod:`pgmemory.store.writes` builds, and the
mapping of a row read back to a :class:`~pgmemory.store.records.Memory`. The SQLAlchemy model
(:class:`~pgmemory.store.models.MemoryRow`) and the migrations define the table; a test checks
that this list agrees with both.

How a value reaches its column: most are *sent* with each row, as one array per column
(``add``, through ``unnest``) or as one COPY field (``import_records``, through the staging
table), under the column's ``batch`` key; ``collection`` and ``embedding_model`` come from the
statement's own parameters; ``search_vector`` is computed from the keyword terms sent.

One value is sent that is no column: each row's ``position`` in its batch or import
(:data:`POSITION`). The inserts store rows in the order of the message key (so that two
writers of the same messages never wait for each other in a cycle), not in record order; a row
without ``created_at`` is stamped from its position instead of the clock, so a batch's rows
still follow each other in time in record order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pgmemory.store.records import Memory, MemoryHit, MemoryScope, Signals


@dataclass(frozen=True, slots=True)
class MemoryColumn:
    """One column of ``pgmemory_memories``.

    Attributes:
        name: The column's name.
        sql_type: Its PostgreSQL type, as ``information_schema.columns.udt_name`` spells it.
        batch: The key of its per-row values in a prepared batch (also the array parameter of
            the batched insert); None when the insert statement supplies the value itself.
        sent: The name of the value sent per row (staging column, ``unnest`` alias), when it
            is not the column's own name.
        sent_type: The PostgreSQL type of the value sent, when it is not ``sql_type``.
        stored: How the insert turns the sent value ``{}`` into the column's value, or the
            statement parameter that supplies it (e.g. ``":collection"``).
        memory: Where a row read back puts it: a ``Memory`` field of the same name, one of
            the ``MemoryScope`` dimensions (``''`` read as None), or nowhere (None).
    """

    name: str
    sql_type: str
    batch: str | None
    sent: str | None = None
    sent_type: str | None = None
    stored: str = "{}"
    memory: Literal["field", "scope"] | None = "field"

    @property
    def value_name(self) -> str:
        """The name of the value sent per row (the staging column)."""
        return self.sent or self.name

    @property
    def value_type(self) -> str:
        """The PostgreSQL type of the value sent per row."""
        return self.sent_type or self.sql_type

    def stored_from(self, source: str) -> str:
        """The SQL expression storing this column from ``source`` (an alias, e.g. ``"r"``)."""
        if self.batch is None:
            return self.stored
        return self.stored.format(f"{source}.{self.value_name}", source=source)


#: The table's columns, in table order. Order matters: it is the order of the inserts' column
#: lists, of the staging table and of binary COPY fields.
MEMORY_COLUMNS: tuple[MemoryColumn, ...] = (
    MemoryColumn("id", "uuid", "ids"),
    MemoryColumn("user_id", "text", "user_ids", memory="scope"),
    MemoryColumn("collection", "text", None, stored=":collection"),
    MemoryColumn("application_id", "text", "application_ids", memory="scope"),
    MemoryColumn("agent_id", "text", "agent_ids", memory="scope"),
    MemoryColumn("session_id", "text", "session_ids", memory="scope"),
    MemoryColumn("role", "text", "roles"),
    MemoryColumn("author_name", "text", "author_names"),
    MemoryColumn("message_id", "text", "message_ids"),
    MemoryColumn("source_type", "text", "source_types"),
    MemoryColumn("source_id", "text", "source_ids"),
    MemoryColumn("content", "text", "contents"),
    MemoryColumn("content_sha256", "text", "content_sha256s", memory=None),
    MemoryColumn(
        "search_vector",
        "tsvector",
        "terms",
        sent="terms",
        sent_type="text",
        stored="to_tsvector('simple', {})",
        memory=None,
    ),
    MemoryColumn("embedding", "vector", "embeddings", memory=None),
    MemoryColumn("embedding_model", "text", None, stored=":embedding_model"),
    # Unset: the transaction's start plus the row's position in microseconds (record order).
    MemoryColumn(
        "created_at",
        "timestamptz",
        "created_ats",
        stored="COALESCE({}, now() + {source}.position * interval '1 microsecond')",
    ),
    MemoryColumn("expires_at", "timestamptz", "expires_ats"),
    MemoryColumn("metadata", "jsonb", "metadatas"),
    # The estimated tokens of the memory's full recall line (pgmemory.store.recall_text), so
    # the recall statement fits its token budget in SQL (migration 0010).
    MemoryColumn("recall_tokens", "int4", "recall_tokens", memory=None),
)

#: Columns PostgreSQL computes itself from the others (stored generated columns), with their
#: types: never sent, never read back into a Memory; what reads them names them.
GENERATED_COLUMNS: tuple[tuple[str, str], ...] = (
    # binary_quantize(embedding): the first pass of a large scope's search (migration 0013)
    ("embedding_code", "varbit"),
)

#: Columns no insert writes and no read returns: a re-embedding's staged vector (migration
#: 0015), which only :mod:`pgmemory.admin.reembedding` writes and swaps in.
STAGED_COLUMNS: tuple[tuple[str, str], ...] = (("embedding_next", "vector"),)

#: Not a column: a row's position in its batch (add) or import (0, 1, ...), sent with it.
POSITION = MemoryColumn("position", "bigint", "positions", memory=None)
#: The values sent per row, in COPY order: the columns sent, then the position.
SENT_COLUMNS: tuple[MemoryColumn, ...] = (
    *(c for c in MEMORY_COLUMNS if c.batch is not None),
    POSITION,
)
#: Names of the values sent per row (the staging table's columns), in COPY order.
STAGING_COLUMNS: tuple[str, ...] = tuple(c.value_name for c in SENT_COLUMNS)
#: PostgreSQL types of STAGING_COLUMNS, for psycopg's binary COPY.
STAGING_TYPES: tuple[str, ...] = tuple(c.value_type for c in SENT_COLUMNS)
#: Keys of a prepared batch (parallel lists, one per sent column), in COPY order.
BATCH_KEYS: tuple[str, ...] = tuple(c.batch for c in SENT_COLUMNS if c.batch is not None)
#: The columns read back into a :class:`Memory`.
READ_COLUMNS: tuple[MemoryColumn, ...] = tuple(c for c in MEMORY_COLUMNS if c.memory is not None)


def to_batch(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Turn rows (dicts keyed by STAGING_COLUMNS) into a batch of parallel lists by batch key."""
    return {
        key: [row[name] for row in rows]
        for key, name in zip(BATCH_KEYS, STAGING_COLUMNS, strict=True)
    }


def copy_fields(row: Mapping[str, Any]) -> list[Any]:
    """One row's values (keyed by STAGING_COLUMNS) in binary COPY order."""
    return [row[name] for name in STAGING_COLUMNS]


#: The READ_COLUMNS that are fields of a :class:`Memory` (the others make its scope).
_MEMORY_FIELDS: tuple[str, ...] = tuple(c.name for c in READ_COLUMNS if c.memory == "field")


def _slots(cls: type, names: Sequence[str]) -> tuple[tuple[Callable[[Any, Any], None], str], ...]:
    """The setters of ``cls``'s slots ``names`` (its member descriptors' ``__set__``), each
    with its name: what a frozen class's ``__init__`` calls through ``object.__setattr__``,
    taken once instead of looked up by name for every field of every row."""
    return tuple((vars(cls)[name].__set__, name) for name in names)


_SCOPE_SLOTS = _slots(MemoryScope, MemoryScope.DIMENSIONS)
_MEMORY_SLOTS = _slots(Memory, _MEMORY_FIELDS)
((_SET_SCOPE, _),) = _slots(Memory, ("scope",))
(_SET_HIT_MEMORY, _), (_SET_SCORE, _), (_SET_SIGNALS, _) = _slots(
    MemoryHit, ("memory", "score", "signals")
)
_new = object.__new__


def memory_from_row(row: Mapping[Any, Any]) -> Memory:
    """The :class:`Memory` a row read with the READ_COLUMNS stands for: its fields set as
    read, and its scope's dimensions as stored (``''`` is unset, None), without
    the frozen classes' keyword ``__init__`` (which took longer than the rest of a small
    search's hits): by the slots' own setters, as that ``__init__`` sets them."""
    scope = _new(MemoryScope)
    for set_slot, name in _SCOPE_SLOTS:
        set_slot(scope, row[name] or None)
    memory = _new(Memory)
    _SET_SCOPE(memory, scope)
    for set_slot, name in _MEMORY_SLOTS:
        set_slot(memory, row[name])
    return memory


def hit_from_row(row: Mapping[Any, Any], signals: Signals | None = None) -> MemoryHit:
    """The :class:`MemoryHit` of a search row: :func:`memory_from_row` and the row's
    ``score`` (and ``signals``, when explained), set as :func:`memory_from_row` sets them."""
    hit = _new(MemoryHit)
    _SET_HIT_MEMORY(hit, memory_from_row(row))
    _SET_SCORE(hit, float(row["score"]))
    _SET_SIGNALS(hit, signals)
    return hit
