"""A statement as a value: its SQL, its name, and how it spreads over a sharded (Citus) database.

Every statement of pgmemory's two catalogues (:mod:`pgmemory.store.queries`, the data plane's,
and :mod:`pgmemory.admin.statements`, the operators') is a :class:`Statement` or comes from a
statement builder marked with :func:`builds`, and carries its Citus classification where it
is defined:

* nothing, when it names one user (a ``user_id = :param`` filter, one user's value in an
  INSERT, a user-first function of that user: Citus routes it to that user's shard) or touches
  no per-user table;
* ``fan_out="why"``, when it touches per-user tables without naming one user, so that on Citus
  it runs on every shard (or several), with why that is acceptable;
* ``constant_user="why"``, when it touches the one shard of the ``''`` (no user) rows, named
  by a constant.

A builder's statements for a scope with a user name that user; ``builds(fan_out=...)`` says
why those for a scope without one fan out. Each catalogue calls :func:`register` once, at its
end: the constants and builders it defines are then in :data:`REGISTRY` under their names.
``tests/store/test_routing.py`` walks the registry: each registered statement must be
classified as the rule (:mod:`pgmemory.store.routing`) reads its SQL, every statement-like
constant of a catalogue must be registered, and ``docs/routing.md``'s table lists exactly the
classified ones.

A :class:`Statement` is a ``str`` (its SQL), so it runs wherever SQL text runs: the verbs,
SQLAlchemy's ``text()``, psycopg. Derived text (``STATEMENT + " FOR UPDATE"``) is a plain
``str`` again and must be made a :class:`Statement` of its own to be registered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., str])


class Statement(str):
    """One statement's SQL (``:name`` parameters), with its Citus classification.

    Args:
        sql: The statement.
        fan_out: Why, on Citus, it runs on every shard (it names no one user); None: it does
            not fan out.
        constant_user: Why it runs on the one shard of the ``''`` rows (named by a constant).
    """

    fan_out: str | None
    constant_user: str | None
    #: ``module.NAME``, set by :func:`register` (empty until its catalogue registered it).
    name: str

    def __new__(
        cls, sql: str, *, fan_out: str | None = None, constant_user: str | None = None
    ) -> Statement:
        if fan_out is not None and constant_user is not None:
            raise ValueError("a statement fans out or names the constant user's shard, not both")
        made = super().__new__(cls, sql)
        made.fan_out = fan_out
        made.constant_user = constant_user
        made.name = ""
        return made


@dataclass(frozen=True)
class Registered:
    """A catalogue's statement or builder, as the registry holds it."""

    #: ``module.name`` (a constant's upper-case name, or a builder's function name).
    name: str
    #: Why its statements fan out on Citus (a builder: those for a scope without a user).
    fan_out: str | None
    #: Why it runs on the constant user's shard.
    constant_user: str | None
    #: The constant's SQL; None for a builder.
    sql: str | None


#: Every registered statement and builder, by ``module.name``.
REGISTRY: dict[str, Registered] = {}

_BUILDER_FAN_OUT = "_pgmemory_fan_out"


def builds(*, fan_out: str | None = None) -> Callable[[F], F]:
    """Mark a function as a statement builder of its catalogue (registered by :func:`register`).

    Args:
        fan_out: Why its statements for a scope without a user fan out on Citus (with a user
            in the scope, a built statement names that user).
    """

    def mark(builder: F) -> F:
        setattr(builder, _BUILDER_FAN_OUT, fan_out)
        return builder

    return mark


def is_builder(value: object) -> bool:
    """Whether ``value`` was marked by :func:`builds`."""
    return hasattr(value, _BUILDER_FAN_OUT)


def register(module: str, namespace: Mapping[str, Any]) -> None:
    """Register the public statements (:class:`Statement` constants) and builders of the
    catalogue ``module``, whose globals are ``namespace``: called once, at the catalogue's end."""
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        key = f"{module}.{name}"
        if isinstance(value, Statement):
            value.name = key
            REGISTRY[key] = Registered(key, value.fan_out, value.constant_user, str(value))
        elif is_builder(value):
            REGISTRY[key] = Registered(key, getattr(value, _BUILDER_FAN_OUT), None, None)


def registered(module: str) -> dict[str, Registered]:
    """The registry's entries of one catalogue, by their short names."""
    prefix = module + "."
    return {key[len(prefix) :]: entry for key, entry in REGISTRY.items() if key.startswith(prefix)}
