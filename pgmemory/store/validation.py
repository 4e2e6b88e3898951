"""Input checks run before any SQL: a bad batch is refused whole, so nothing is half-written."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pgmemory.errors import CollectionError, InvalidInputError
from pgmemory.store.models import MAX_DIMENSIONS

MAX_NAME_CHARS = 256


def sha256_hex(text: str) -> str:
    """Hex sha256 of a text's UTF-8 bytes (how content and queries are hashed everywhere)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_text(value: object, *, what: str, max_chars: int) -> str:
    """A storable, searchable text: a non-blank str, no NUL, at most ``max_chars``."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(
            f"{what} is empty or whitespace only ({value[:20]!r}); blank text carries nothing "
            "to remember or search for: skip it"
        )
    nul = value.find("\x00")
    if nul >= 0:
        raise InvalidInputError(
            f"{what} contains a NUL character at index {nul} (text starts {value[:40]!r}); "
            "PostgreSQL text cannot store NUL: remove it, e.g. text.replace('\\x00', '')"
        )
    if len(value) > max_chars:
        raise InvalidInputError(
            f"{what} is {len(value)} characters (starts {value[:40]!r}); the limit is "
            f"{max_chars}: split the text, or raise PGMEMORY_MAX_TEXT_CHARS / "
            "Settings(max_text_chars=...)"
        )
    return value


def check_name(value: object, *, what: str) -> str:
    """An identifier-like value (collection name, actor, role): non-blank, no NUL, short."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{what} must be a non-blank string, got {value!r}")
    if "\x00" in value:
        raise InvalidInputError(f"{what} {value!r} contains a NUL character: remove it")
    if len(value) > MAX_NAME_CHARS:
        raise InvalidInputError(
            f"{what} is {len(value)} characters (starts {value[:40]!r}); the limit is "
            f"{MAX_NAME_CHARS}"
        )
    return value


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


def check_score(value: object) -> float:
    """A minimum cosine similarity in [-1, 1]."""
    if not isinstance(value, (int, float)) or math.isnan(value) or not -1.0 <= value <= 1.0:
        raise InvalidInputError(f"min_score is {value!r}; expected a number from -1 to 1")
    return float(value)
