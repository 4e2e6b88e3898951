"""The read retry: a reading method runs once more, on a fresh connection, after losing its
connection midway (:func:`retried_read`), unless a write in it may have committed (the error's
``outcome``, :mod:`pgmemory.store._engine.driver_errors`); and once more when the erasure guard
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


def runs_again(exc: DBAPIError) -> bool:
    """Whether a read that raised ``exc`` runs once more (and why, logged): it lost its
    connection midway and no write in it may have committed (a transaction that lost its
    connection before its commit did not commit), or the erasure guard refused it
    (:data:`ERASED_WHILE_READING`). A commit that lost its connection is not retried: it may
    have taken effect."""
    if _erased_while_reading(exc):
        logger.info("an erasure of the read's user committed while it ran; running it again")
        return True
    if not exc.connection_invalidated or getattr(exc, "outcome", None) not in _NOTHING_COMMITTED:
        return False
    logger.warning(
        "a read lost its database connection (%s); running it once more", type(exc.orig).__name__
    )
    return True


def retried_read(
    method: Callable[Concatenate[S, P], Awaitable[T]],
    *,
    check: Callable[[S], None] | None = None,
) -> Callable[Concatenate[S, P], Awaitable[T]]:
    """A reading method (of the store or the admin plane) that runs once more, on a fresh
    connection, when :func:`runs_again` says so.

    Only for methods that change nothing but recall audit rows written in the same
    transaction. The retry is in the one wrapper's own frame (no function of its own on the
    stack of every read); :func:`pgmemory.store._engine.lifecycle.refuse_when_closed` makes that
    wrapper refuse a closed store too (``check``), rather than wrapping it once more.

    Args:
        method: An ``async`` method that only reads (and at most writes recall audit rows).
        check: Called with ``self`` before anything else; raises to refuse the call.

    Returns:
        The method, retried once; marked (``__retried_read__``: ``method``) so that the
        class's refusal wraps ``method`` itself.

    Raises:
        pgmemory.errors.DatabaseError: (from the wrapper) The read failed otherwise, or lost
            its connection twice (also a ``sqlalchemy.exc.DBAPIError``, as the driver's was).
    """

    @functools.wraps(method)
    async def reading(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if check is not None:
            check(self)
        try:
            return await method(self, *args, **kwargs)
        except DBAPIError as exc:
            if not runs_again(exc):
                raise
        return await method(self, *args, **kwargs)

    reading.__retried_read__ = method  # type: ignore[attr-defined]
    return reading
