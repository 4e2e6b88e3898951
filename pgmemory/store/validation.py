"""Input checks run before any SQL: a bad batch is refused whole, so nothing is half-written.

Messages name the argument (and a record's position), lengths, counts and the fix; they never
repeat what the caller passed as text or as an id (a collection name, the developer's own
identifier, may be shown). Numbers out of range are shown.

Free text (memory contents, queries, metadata, facts, history messages) is normalised by
:mod:`pgmemory.text.clean` (NUL and lone surrogates become U+FFFD); ids and names are keys and
are refused instead (see :func:`check_text`). Ids must also fit the B-tree entries that hold
them: see :func:`check_index_entries`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import numpy as np

from pgmemory.errors import CollectionError, InvalidInputError
from pgmemory.store.models import MAX_DIMENSIONS
from pgmemory.text.clean import bad_surrogate_index, clean_json, clean_text

MAX_NAME_CHARS = 256


def sha256_hex(text: str) -> str:
    """Hex sha256 of a text's UTF-8 bytes (how content and queries are hashed everywhere)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def describe(value: object) -> str:
    """How an error message may refer to a value the caller passed: numbers as they are,
    strings by their length, anything else by its type (never text or ids)."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return f"a str of {len(value)} characters"
    return f"a {type(value).__name__}"


def check_text(
    value: object,
    *,
    what: str,
    max_chars: int,
    error: type[InvalidInputError] = InvalidInputError,
    expected: str = "a string",
    clean: bool = False,
    if_blank: str = "blank text carries nothing to remember or search for: skip it",
    if_long: str = "split the text, or raise PGMEMORY_MAX_TEXT_CHARS / Settings(max_text_chars=...)",
) -> str:
    """Check a text PostgreSQL can store and match: a non-blank str, not too long.

    The one such check: memory contents, names, and scope values all go through it.

    Args:
        value: What the caller passed.
        what: How the caller named it, for the message (e.g. ``"records[3].content"``).
        max_chars: The longest value accepted.
        error: The exception class to raise (e.g. :class:`~pgmemory.errors.ScopeError`).
        expected: What the caller accepts, for the message about a value of another type.
        clean: Free text: replace NUL and lone surrogates by U+FFFD
            (:func:`pgmemory.text.clean.clean_text`) before the other checks. Otherwise (ids,
            names) such a value is refused.
        if_blank: The fix to suggest for a blank value.
        if_long: The fix to suggest for a value over ``max_chars``.

    Returns:
        The value (cleaned when ``clean``; otherwise unchanged).

    Raises:
        InvalidInputError: The value is unusable (``error``, a subclass, when given). The
            message gives positions and lengths, never the text.
    """
    if not isinstance(value, str):
        raise error(f"{what} must be {expected}, got {describe(value)}")
    if clean:
        value = clean_text(value)
    if not value.strip():
        raise error(
            f"{what} is blank: empty or whitespace only ({len(value)} characters); {if_blank}"
        )
    nul = value.find("\x00")
    if nul >= 0:
        raise error(
            f"{what} contains a NUL character at index {nul}; PostgreSQL text cannot store "
            "NUL: remove it, e.g. text.replace('\\x00', '')"
        )
    surrogate = bad_surrogate_index(value)
    if surrogate >= 0:
        raise error(
            f"{what} contains a lone surrogate at index {surrogate} (half of a UTF-16 pair, "
            "e.g. a split emoji), which has no UTF-8 form: fix the value where it is made"
        )
    if len(value) > max_chars:
        raise error(f"{what} is {len(value)} characters long; the limit is {max_chars}: {if_long}")
    return value


def check_name(value: object, *, what: str) -> str:
    """Check an identifier-like value (collection name, actor, session id): see :func:`check_text`.

    A non-blank string of at most 256 characters without NUL or lone surrogates, returned
    unchanged (an id is a key: it is never rewritten). Where the id is stored, it must also fit
    its index entries (:func:`check_index_entries`).
    """
    return check_text(
        value,
        what=what,
        max_chars=MAX_NAME_CHARS,
        expected="a non-blank string",
        if_blank="pass a non-blank value",
        if_long="use a shorter value, or a hash of it",
    )


def check_optional_name(value: object, *, what: str) -> str | None:
    """Like :func:`check_name`, but None passes."""
    return None if value is None else check_name(value, what=what)


def check_choice(value: object, *, what: str, choices: Sequence[str]) -> str:
    """One of a fixed set of values."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidInputError(
            f"{what} is not one of {list(choices)} (got {describe(value)}); pass one of them"
        )
    return value


def check_dimensions(value: object) -> int:
    """A collection's vector size."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIMENSIONS:
        raise CollectionError(
            f"dimensions is {describe(value)}; a collection holds vectors of 1 to {MAX_DIMENSIONS} "
            "dimensions (reduce larger embeddings with the model's `dimensions` option)"
        )
    return value


def check_vector(value: object, *, dimensions: int, what: str) -> np.ndarray:
    """A finite float32 vector of the collection's size (a pgvector ``Vector`` is accepted)."""
    if not isinstance(value, np.ndarray):
        if hasattr(value, "to_numpy"):
            value = value.to_numpy()
        if isinstance(value, (str, bytes)):
            raise InvalidInputError(f"{what} must be a sequence of numbers, got {describe(value)}")
    try:
        vector = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"{what} is not a sequence of numbers (got {describe(value)}): pass floats"
        ) from exc
    if vector.ndim != 1:
        raise InvalidInputError(f"{what} must be one-dimensional, got shape {vector.shape}")
    if vector.shape[0] != dimensions:
        raise CollectionError(
            f"{what} has {vector.shape[0]} dimensions; this collection holds {dimensions}: "
            "embed with the collection's model, or use a collection of that size"
        )
    # One pass for the common case: a finite, positive sum of squares means every value is
    # finite and one is non-zero. Summed in float64, where no float32 value's square overflows
    # or underflows to zero (so no floating-point warning either).
    wide = vector.astype(np.float64)
    square = float(np.dot(wide, wide))
    if math.isfinite(square) and square > 0.0:
        return vector
    finite = np.isfinite(vector)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise InvalidInputError(
            f"{what} has a non-finite value {float(vector[bad])} at index {bad}; "
            "NaN and infinity cannot be compared: fix the embedding"
        )
    if not np.any(vector):
        raise InvalidInputError(
            f"{what} is all zeros, which has no direction for cosine similarity; fix the embedding"
        )
    return vector


def check_metadata(value: object, *, what: str) -> dict[str, Any]:
    """JSON-native metadata, cleaned for jsonb (see :func:`pgmemory.text.clean.clean_json`).

    Every string, keys included, has NUL and lone surrogates replaced by U+FFFD; nesting is
    limited to :data:`pgmemory.text.clean.MAX_JSON_DEPTH` levels; two keys that JSON would merge
    (``1`` and ``"1"``) are refused.

    Raises:
        InvalidInputError: Not a mapping, not JSON-native, too deep, or clashing keys.
    """
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{what} must be a mapping, got {describe(value)}")
    return clean_json(value, what=what)  # type: ignore[no-any-return]


def check_limit(value: object, *, what: str = "limit", maximum: int = 10_000) -> int:
    """A positive page or result size."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidInputError(
            f"{what} is {describe(value)}; expected an integer from 1 to {maximum}"
        )
    return value


def check_number(
    value: object, *, what: str, low: float = -math.inf, high: float = math.inf
) -> float:
    """Check a finite real number from ``low`` to ``high`` (a bool is not a number here).

    Args:
        value: What the caller passed.
        what: The argument's name, as the caller spelled it, for the message.
        low: The smallest value accepted.
        high: The largest value accepted.

    Returns:
        The value as a float.

    Raises:
        InvalidInputError: The value is not a number, not finite, or out of range.
    """
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        if math.isinf(low) and math.isinf(high):
            expected = "a finite number"
        else:
            expected = f"a number from {low:g} to {high:g}"
        raise InvalidInputError(f"{what} is {describe(value)}; expected {expected}")
    return float(value)


def check_aware(value: object, *, what: str) -> datetime | None:
    """Check an optional time-zone-aware datetime (None passes)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(f"{what} must be a datetime, got {describe(value)}")
    if value.tzinfo is None:
        raise InvalidInputError(
            f"{what} has no time zone; pass an aware datetime, e.g. datetime.now(UTC)"
        )
    return value


# --- what a B-tree index entry can hold ----------------------------------------------------
# PostgreSQL refuses an insert whose index entry exceeds a third of a page. The ids a row stores
# share entries of several indexes (the unique message index holds the collection name, four
# scope ids and the message id; the covering index also holds the vector), so each must fit
# together with the others, counted in UTF-8 bytes: a CJK character takes 3, an emoji 4.

#: Largest B-tree entry PostgreSQL accepts with 8 kB pages (bytes, header included).
BTREE_MAX_ENTRY_BYTES = 2704
#: Bytes and alignment of the fixed-size column types indexes hold.
_FIXED_TYPES = {"uuid": (16, 1), "int8": (8, 8), "timestamptz": (8, 8)}
#: Bytes a component of a vector (``vector``) and of its half-precision copy (``half``).
_FLOAT_BYTES = {"vector": 4, "half": 2}


@dataclass(frozen=True, slots=True, eq=False)
class IndexShape:
    """The columns of one B-tree index entry, in order, as the schema defines them.

    Each index has one shape (the module's constants), compared and hashed by identity: cheap
    enough to key a cache with on every row of an import.

    Attributes:
        name: The index, as the schema names it.
        columns: ``(field, type)`` pairs: type ``text`` (the field's value is measured),
            ``uuid``, ``int8``, ``timestamptz`` (fixed sizes), ``vector``, ``half`` (its
            half-precision copy) or ``code`` (its binary code; for all three the field's value
            is the number of dimensions).
        nullable: Fields that may be NULL (absent from the entry when they are).
    """

    name: str
    columns: tuple[tuple[str, str], ...]
    nullable: frozenset[str] = frozenset()

    @property
    def texts(self) -> tuple[str, ...]:
        """The text fields the entry holds."""
        return tuple(field for field, kind in self.columns if kind == "text")


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


def entry_bytes(shape: IndexShape, values: Mapping[str, Any]) -> int:
    """The size of a B-tree entry of ``shape`` for ``values``, as PostgreSQL lays it out.

    Text is counted uncompressed (PostgreSQL may compress long keys, so this is an upper
    bound): a value under 127 bytes takes one header byte and no alignment, a longer one four
    header bytes after 4-byte alignment. The entry header is 8 bytes, 16 when a NULL is held.

    Args:
        shape: The index.
        values: The fields' values (text fields as str; a vector field as its dimensions;
            None for NULL).
    """
    size = 0
    has_null = False
    for field, kind in shape.columns:
        value = values.get(field)
        if value is None and field in shape.nullable:
            has_null = True
            continue
        if kind == "text":
            n = len(value.encode("utf-8")) if isinstance(value, str) else 0
            size = size + 1 + n if n + 1 <= 127 else _align(size, 4) + 4 + n
        elif kind in _FLOAT_BYTES:  # a 4-byte length, 4 bytes of dimensions, the components
            size = _align(size, 4) + 8 + _FLOAT_BYTES[kind] * int(value or 0)
        elif kind == "code":  # bit varying: its bit count, then a bit a dimension
            n = 4 + (int(value or 0) + 7) // 8
            size = size + 1 + n if n + 1 <= 127 else _align(size, 4) + 4 + n
        else:
            width, alignment = _FIXED_TYPES[kind]
            size = _align(size, alignment) + width
    return (16 if has_null else 8) + _align(size, 8)


@lru_cache(maxsize=64)
def _fields_of(shapes: tuple[IndexShape, ...]) -> frozenset[tuple[str, str]]:
    """Every (field, kind) that some entry of ``shapes`` holds."""
    return frozenset(column for shape in shapes for column in shape.columns)


def _entry_bound(shapes: Sequence[IndexShape], values: Mapping[str, Any]) -> int:
    """An upper bound of every entry of ``shapes``: each field of any shape counted once, text
    at 4 bytes per character with a 4-byte header and 3 bytes of alignment, a vector at its
    size plus 11, any other column at 16, plus the largest entry header and final alignment."""
    size = 16 + 7
    for field, kind in _fields_of(tuple(shapes)):
        value = values.get(field)
        if kind == "text":
            size += 7 + 4 * len(value) if isinstance(value, str) else 7
        elif kind in _FLOAT_BYTES:
            size += 11 + _FLOAT_BYTES[kind] * int(value or 0)
        elif kind == "code":
            size += 11 + (int(value or 0) + 7) // 8
        else:
            size += 16
    return size


def check_index_entries(
    shapes: Sequence[IndexShape], values: Mapping[str, Any], *, where: str, names: Mapping[str, str]
) -> None:
    """Refuse values that would make an entry of one of ``shapes`` too large for PostgreSQL.

    Args:
        shapes: The indexes the row's values go into.
        values: The values by field (see :func:`entry_bytes`).
        where: Where the values come from, for the message (e.g. ``"records[3]"``).
        names: How the caller spells each text field, for the message.

    Raises:
        InvalidInputError: An entry would exceed :data:`BTREE_MAX_ENTRY_BYTES`. The message
            names the fields and their byte lengths, never their values.
    """
    if _entry_bound(shapes, values) <= BTREE_MAX_ENTRY_BYTES:
        return  # no entry can be too large (the common case: short ids), so no layout needed
    for shape in shapes:
        size = entry_bytes(shape, values)
        if size <= BTREE_MAX_ENTRY_BYTES:
            continue
        parts = [
            f"{names.get(f, f)} ({len(values[f].encode('utf-8')):,} bytes)"
            for f in shape.texts
            if isinstance(values.get(f), str) and values[f]
        ]
        vector = [f for f, kind in shape.columns if kind in _FLOAT_BYTES]
        held = f" beside the {values[vector[0]]}-dimension vector" if vector else ""
        raise InvalidInputError(
            f"{where}: {', '.join(parts)} make an entry of {size:,} bytes in the index "
            f"{shape.name}{held}; PostgreSQL holds at most {BTREE_MAX_ENTRY_BYTES:,} bytes per "
            "entry (UTF-8: a CJK character takes 3 bytes, an emoji 4): shorten one of them, "
            "e.g. store a hash of a long id"
        )


def _shape(name: str, *columns: str, nullable: Sequence[str] = ()) -> IndexShape:
    """An IndexShape from ``"field:type"`` strings (type ``text`` when omitted)."""
    pairs = tuple((c.split(":")[0], c.split(":")[1] if ":" in c else "text") for c in columns)
    return IndexShape(name, pairs, frozenset(nullable))


_SCOPE = ("user_id", "application_id", "agent_id", "session_id")
#: The memory table's B-tree indexes that hold text, every row's (a test compares these shapes
#: with the database's indexes).
MEMORY_INDEXES: tuple[IndexShape, ...] = (
    _shape("pk_pgmemory_memories", "id:uuid", "user_id"),
    _shape("ix_pgmemory_memories_user_recent", "collection", "user_id", "created_at:timestamptz"),
    _shape(
        "ix_pgmemory_memories_session_recent", "collection", "session_id", "created_at:timestamptz"
    ),
    _shape(
        "ix_pgmemory_memories_app_agent_recent",
        "collection",
        "application_id",
        "agent_id",
        "created_at:timestamptz",
    ),
    _shape(
        "ix_pgmemory_memories_conversation",
        "collection",
        "conversation:int8",
        "created_at:timestamptz",
        "id:uuid",
        "expires_at:timestamptz",
        nullable=("expires_at",),
    ),
)
#: The unique message index (partial: rows with a message id only).
MESSAGE_INDEX = _shape("uq_pgmemory_memories_message", "collection", *_SCOPE, "message_id")
#: The covering index of collections of up to COVERING_MAX_DIMENSIONS: it holds the vector.
COVERING_INDEX = _shape(
    "ix_pgmemory_memories_user_cover",
    "collection",
    "user_id",
    "session_id",
    "agent_id",
    "application_id",
    "id:uuid",
    "created_at:timestamptz",
    "expires_at:timestamptz",
    "embedding:vector",
    nullable=("expires_at",),
)
#: The binary codes' index (every collection): the vector's code, a bit a dimension.
CODES_INDEX = _shape(
    "ix_pgmemory_memories_user_codes",
    "collection",
    "user_id",
    "id:uuid",
    "expires_at:timestamptz",
    "embedding:code",
    nullable=("expires_at",),
)
#: The half vectors' index (collections of up to HALVES_MAX_DIMENSIONS): 2 bytes a dimension.
HALVES_INDEX = _shape(
    "ix_pgmemory_memories_user_halves",
    "collection",
    "user_id",
    "id:uuid",
    "expires_at:timestamptz",
    "embedding:half",
    nullable=("expires_at",),
)
#: The memory audit's indexes (a row per memory written or deleted).
MEMORY_AUDIT_INDEXES: tuple[IndexShape, ...] = (
    _shape("pk_pgmemory_memory_audit", "id:int8", "user_id"),
    _shape("ix_pgmemory_memory_audit_memory", "user_id", "memory_id:uuid"),
)
#: The recall audit's indexes (a row per search).
RECALL_AUDIT_INDEXES: tuple[IndexShape, ...] = (
    _shape("pk_pgmemory_recall_audit", "id:int8", "user_id"),
    _shape("ix_pgmemory_recall_audit_user_at", "user_id", "at:timestamptz"),
    _shape(
        "ix_pgmemory_recall_audit_session", "user_id", "requesting_session_id", "at:timestamptz"
    ),
)
#: Chat history's indexes.
HISTORY_INDEXES: tuple[IndexShape, ...] = (
    _shape("pk_pgmemory_chat_messages", "user_id", "session_id", "seq:int8"),
    _shape("uq_pgmemory_chat_messages_message", "user_id", "session_id", "message_id"),
)
#: The facts' indexes (the row key is the whole scope plus the namespace).
FACTS_INDEXES: tuple[IndexShape, ...] = (
    _shape("pk_pgmemory_facts", *_SCOPE, "namespace"),
    _shape("pk_pgmemory_fact_audit", "id:int8", "user_id"),
    _shape("ix_pgmemory_fact_audit_scope", "user_id", "namespace", "at:timestamptz"),
)
