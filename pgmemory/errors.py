"""Every exception pgmemory raises on purpose.

All derive from :class:`PgMemoryError`, so callers can catch the library's errors in one
place. Input errors also derive from :class:`ValueError`, which is what they are.
"""

from __future__ import annotations


class PgMemoryError(Exception):
    """Base class of pgmemory's own errors."""


class InvalidInputError(PgMemoryError, ValueError):
    """A value passed in is unusable; the message names the value and the fix."""


class ScopeError(InvalidInputError):
    """A memory scope is missing, empty where it must not be, or malformed."""


class DuplicateIdError(InvalidInputError):
    """A memory id is given twice for one user, or is already stored for them; ``memory_id``
    names it."""

    def __init__(self, message: str, memory_id: str) -> None:
        super().__init__(message)
        self.memory_id = memory_id


class CollectionError(InvalidInputError):
    """A collection is unknown, or a vector does not fit it (dimensions, model)."""


class DatabaseNotReadyError(PgMemoryError):
    """The database lacks the pgvector extension or pgmemory's schema."""


class EmbeddingError(PgMemoryError):
    """An embedder failed or returned vectors that cannot be stored."""


class MissingExtraError(PgMemoryError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class StoreClosedError(PgMemoryError):
    """The store was closed: by a call to ``close()`` before this call, or while it ran (it
    was then cancelled, and a write it made may or may not have taken effect)."""


class TurnWriteFailedError(PgMemoryError):
    """A write inside a shared transaction failed, so the block can only roll back: nothing of
    it is committed, and later writes in the block are refused with this error."""
