"""The read retry: a reading method runs once more, on a fresh connection, after losing its
connection midway (:meth:`pgmemory.store.database.Database.retried`)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from pgmemory.store.database import Database

P = ParamSpec("P")
T = TypeVar("T")


class _HasDatabase(Protocol):
    """An object whose reads go through a :class:`Database` (the store)."""

    @property
    def _db(self) -> Database: ...


S = TypeVar("S", bound=_HasDatabase)


def retried_read(
    method: Callable[Concatenate[S, P], Awaitable[T]],
) -> Callable[Concatenate[S, P], Awaitable[T]]:
    """Run a reading method (of the store or the admin plane) through :meth:`Database.retried`
    (retried once after a lost connection).

    Args:
        method: An ``async`` method that only reads (and at most writes recall audit rows).

    Returns:
        The method, retried once when it loses its connection midway.
    """

    @functools.wraps(method)
    async def reading(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._db.retried(lambda: method(self, *args, **kwargs))

    return reading
