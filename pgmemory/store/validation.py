"""Input checks run before any SQL: a bad batch is refused whole, so nothing is half-written."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from pgmemory.errors import CollectionError, InvalidInputError
from pgmemory.store.models import MAX_DIMENSIONS

MAX_NAME_CHARS = 256


def sha256_hex(text: str) -> str:
    """Hex sha256 of a text's UTF-8 bytes (how content and queries are hashed everywhere)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_text(
    value: object,
    *,
    what: str,
    max_chars: int,
    error: type[InvalidInputError] = InvalidInputError,
    expected: str = "a string",
    if_blank: str = "blank text carries nothing to remember or search for: skip it",
    if_long: str = "split the text, or raise PGMEMORY_MAX_TEXT_CHARS / Settings(max_text_chars=...)",
) -> str:
    """Check a text PostgreSQL can store and match: a non-blank str, no NUL, not too long.

    The one such check: memory contents and queries, names, and scope values all go through it.

    Args:
        value: What the caller passed.
        what: How the caller named it, for the message (e.g. ``"records[3].content"``).
        max_chars: The longest value accepted.
        error: The exception class to raise (e.g. :class:`~pgmemory.errors.ScopeError`).
        expected: What the caller accepts, for the message about a value of another type.
        if_blank: The fix to suggest for a blank value.
        if_long: The fix to suggest for a value over ``max_chars``.

    Returns:
        The value, unchanged.

    Raises:
        InvalidInputError: The value is unusable (``error``, a subclass, when given).
    """
    if not isinstance(value, str):
        raise error(f"{what} must be {expected}, got {type(value).__name__} {value!r:.40}")
    if not value.strip():
        raise error(f"{what} is blank: empty or whitespace only ({value[:20]!r}); {if_blank}")
    nul = value.find("\x00")
    if nul >= 0:
        raise error(
            f"{what} contains a NUL character at index {nul} (text starts {value[:40]!r}); "
            "PostgreSQL text cannot store NUL: remove it, e.g. text.replace('\\x00', '')"
        )
    if len(value) > max_chars:
        raise error(
            f"{what} is {len(value)} characters long (starts {value[:40]!r}); the limit is "
            f"{max_chars}: {if_long}"
        )
    return value


def check_name(value: object, *, what: str) -> str:
    """Check an identifier-like value (collection name, actor, session id): see :func:`check_text`."""
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
    if value not in choices:
        raise InvalidInputError(f"{what} is {value!r}; expected one of {list(choices)}")
    return value  # type: ignore[return-value]


def check_dimensions(value: object) -> int:
    """A collection's vector size."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIMENSIONS:
        raise CollectionError(
            f"dimensions is {value!r}; a collection holds vectors of 1 to {MAX_DIMENSIONS} "
            "dimensions (reduce larger embeddings with the model's `dimensions` option)"
        )
    return value


def check_vector(value: object, *, dimensions: int, what: str) -> np.ndarray:
    """A finite float32 vector of the collection's size (a pgvector ``Vector`` is accepted)."""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()
    try:
        vector = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{what} is not a sequence of numbers: {exc}") from exc
    if vector.ndim != 1:
        raise InvalidInputError(f"{what} must be one-dimensional, got shape {vector.shape}")
    if vector.shape[0] != dimensions:
        raise CollectionError(
            f"{what} has {vector.shape[0]} dimensions; this collection holds {dimensions}: "
            "embed with the collection's model, or use a collection of that size"
        )
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
    """JSON-serialisable metadata without NUL characters (jsonb rejects them)."""
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{what} must be a mapping, got {type(value).__name__}")
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(
            f"{what} is not JSON-serialisable ({exc}); use str, int, float, bool, None, "
            "lists and dicts with string keys"
        ) from exc
    if "\\u0000" in encoded:
        raise InvalidInputError(f"{what} contains a NUL character, which jsonb cannot store")
    return json.loads(encoded)


def check_limit(value: object, *, what: str = "limit", maximum: int = 10_000) -> int:
    """A positive page or result size."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidInputError(f"{what} is {value!r}; expected an integer from 1 to {maximum}")
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
        raise InvalidInputError(f"{what} is {value!r}; expected {expected}")
    return float(value)


def check_aware(value: object, *, what: str) -> datetime | None:
    """Check an optional time-zone-aware datetime (None passes)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise InvalidInputError(
            f"{what} {value.isoformat()} has no time zone; pass an aware datetime, e.g. "
            "datetime.now(UTC)"
        )
    return value
