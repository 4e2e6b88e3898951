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


class UnscopedError(ScopeError):
    """A read, erasure or record sets no scope dimension where ``allow_unscoped=True`` would be
    needed to mean every tenant (the library's words name that argument; the command line's
    name its scope flags)."""


class DuplicateIdError(InvalidInputError):
    """A memory id is given twice for one user, or is already stored for them; ``memory_id``
    names it."""

    def __init__(self, message: str, memory_id: str) -> None:
        super().__init__(message)
        self.memory_id = memory_id


class CollectionError(InvalidInputError):
    """A collection is unknown, or a vector does not fit it (dimensions, model)."""


class EmbedderMismatchError(CollectionError):
    """The store's embedder makes vectors of another model than the collection holds.

    Attributes:
        collection: The collection.
        collection_model: The model of its vectors.
        embedder_model: The model of the store's embedder.
    """

    def __init__(
        self, message: str, *, collection: str, collection_model: str, embedder_model: str
    ) -> None:
        super().__init__(message)
        self.collection = collection
        self.collection_model = collection_model
        self.embedder_model = embedder_model


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


class DatabaseError(PgMemoryError):
    """A call failed in the database or on the way to it; the driver's error is the cause.

    The message names the step and, where one is at fault, the setting; it never carries a
    statement's parameters. The error is also an instance of the SQLAlchemy error it replaces
    (``sqlalchemy.exc.OperationalError``, ``IntegrityError``, ...), with its ``orig`` and
    ``connection_invalidated``, so code that caught those still does.

    Attributes:
        step: Where it failed: ``"connect"`` (no statement was sent), ``"statement"`` or
            ``"commit"``.
        outcome: For a write: ``"not stored"`` (nothing of it was committed), ``"unknown"``
            (the commit was sent and no reply came: it may have taken effect), or
            ``"stored"``; None for a read. A retry with the same message ids is safe either
            way: a message id already stored is skipped.
    """

    #: The driver's class this one was combined with (:func:`with_driver_class`), if any.
    _driver: type[BaseException] | None = None
    #: The pgmemory class of a combined class.
    _kind: type[DatabaseError] | None = None

    def __init__(
        self, message: str, *, step: str = "statement", outcome: str | None = None
    ) -> None:
        super().__init__(message)
        self.step = step
        self.outcome = outcome

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[object, ...]:
        kind = self._kind or type(self)
        return (_rebuild, (kind, self._driver, self.args, self.__dict__))


class DatabaseUnavailableError(DatabaseError):
    """No connection could be made (the server is not reachable, refused the login, has no
    such database, or the pool had no free connection in time): nothing was sent. The message
    names the setting to check, with the URL's password hidden."""


class ConnectionLostError(DatabaseError):
    """The connection was lost during a statement or the commit; ``outcome`` says what became
    of a write."""


class StatementTimeoutError(DatabaseError):
    """The server cancelled a statement at its statement timeout
    (``PGMEMORY_STATEMENT_TIMEOUT_MS``); the statement's transaction rolled back."""


def with_driver_class(error: DatabaseError, driver_error: BaseException) -> DatabaseError:
    """``error`` as an instance of ``driver_error``'s class too, with its attributes (for
    SQLAlchemy's: ``orig``, ``statement``, ``connection_invalidated``...), so that an
    ``except`` naming the driver's class still catches it."""
    kind = _combined(type(error), type(driver_error))
    combined = kind.__new__(kind, *error.args)
    combined.__dict__.update(driver_error.__dict__)
    combined.__dict__.update(error.__dict__)
    return combined


#: The combined classes made so far, by (pgmemory class, driver class).
_COMBINED: dict[tuple[type[DatabaseError], type[BaseException]], type[DatabaseError]] = {}


def _combined(kind: type[DatabaseError], driver: type[BaseException]) -> type[DatabaseError]:
    """``kind`` and ``driver`` in one class, named as ``kind`` (made once per pair)."""
    made = _COMBINED.get((kind, driver))
    if made is None:
        attributes = {"__module__": __name__, "__qualname__": kind.__qualname__}
        made = type(kind.__name__, (kind, driver), {**attributes, "_driver": driver, "_kind": kind})
        _COMBINED[(kind, driver)] = made
    return made


def _rebuild(
    kind: type[DatabaseError],
    driver: type[BaseException] | None,
    args: tuple[object, ...],
    state: dict[str, object],
) -> DatabaseError:
    """Unpickle a :class:`DatabaseError` (combined with its driver's class again)."""
    cls = kind if driver is None else _combined(kind, driver)
    error = cls.__new__(cls, *args)
    error.__dict__.update(state)
    return error
