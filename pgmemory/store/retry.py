"""The read retry: a reading method runs once more, on a fresh connection, after losing its
connection midway (:func:`retried`), unless a write in it may have committed (the error's
``outcome``, :mod:`pgmemory.store.driver_errors`); and once more when the erasure guard
refused it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S")

#: What a lost write's ``outcome`` must be for the read around it to run again.
_NOTHING_COMMITTED = (None, "not stored")


#: How the erasure guard of an audited read refuses it (SQLSTATE 40001, migration 0022): an
#: erasure of its user committed between the statement's snapshot and its lock. Nothing of it
#: was written; run again, it reads what the erasure left.
ERASED_WHILE_READING = "pgmemory: the user was erased while this statement read"


def _erased_while_reading(exc: DBAPIError) -> bool:
    """Whether ``exc`` is the erasure guard's refusal."""
    orig = exc.orig
    message = getattr(getattr(orig, "diag", None), "message_primary", None) or ""
    return getattr(orig, "sqlstate", None) == "40001" and message.startswith(ERASED_WHILE_READING)


async def retried(operation: Callable[[], Awaitable[T]]) -> T:
    """Run a read; once more, on a fresh connection, if it lost its connection midway; once
    more if the erasure guard refused it (:data:`ERASED_WHILE_READING`).

    Only for operations that change nothing but recall audit rows written in the same
    transaction (a transaction that lost its connection before its commit did not commit,
    so it can run again). A commit that lost its connection is not retried: it may have
    taken effect.

    Args:
        operation: Runs the read (called once, or twice after a lost connection).

    Returns:
        What ``operation`` returns.

    Raises:
        pgmemory.errors.DatabaseError: The read failed otherwise, or lost its connection twice
            (also a ``sqlalchemy.exc.DBAPIError``, as the driver's error was).
    """
    try:
        return await operation()
    except DBAPIError as exc:
        if _erased_while_reading(exc):
            logger.info("an erasure of the read's user committed while it ran; running it again")
        elif (
            not exc.connection_invalidated
            or getattr(exc, "outcome", None) not in _NOTHING_COMMITTED
        ):
            raise
        else:
            logger.warning(
                "a read lost its database connection (%s); running it once more",
                type(exc.orig).__name__,
            )
    return await operation()


def retried_read(
    method: Callable[Concatenate[S, P], Awaitable[T]],
) -> Callable[Concatenate[S, P], Awaitable[T]]:
    """Run a reading method (of the store or the admin plane) through :func:`retried`
    (retried once after a lost connection).

    Args:
        method: An ``async`` method that only reads (and at most writes recall audit rows).

    Returns:
        The method, retried once when it loses its connection midway.
    """

    @functools.wraps(method)
    async def reading(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await retried(lambda: method(self, *args, **kwargs))

    return reading
