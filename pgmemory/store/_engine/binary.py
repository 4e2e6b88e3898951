"""Parameters in PostgreSQL's binary format, written by pgmemory: arrays by the type their
statement casts them to, and numpy vectors.

pgmemory's statements take their batches as arrays (``unnest(CAST(:ids AS uuid[]), ...)``): a
turn's two writes send 23 of them. psycopg's own list dumper works out each list's element type
and dumper again on every statement (~7 µs a list, even of two elements: the two writes' 132 µs
of parameters, 59 µs now). The statement's cast already names the type, so each array parameter
is sent as the class of that type (:data:`ARRAY_TYPES`, :func:`array`), whose dumper writes it
straight: a header, then each element's length and binary value.

An empty list, or one of NULLs, is written with the cast's element type, as any other.

A numpy vector (a query's, or a row's in ``vector[]``) is written by :func:`vector_bytes`:
pgvector's own dumper copies it into a ``Vector`` and then into an ``array`` first (~4 % of a
small search's Python).

:func:`register` adds the dumpers to a connection, with its type ids: ``vector`` is the
database's own type (pgvector creates it), so pgvector's types are registered first.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import numpy as np
from pgvector import Vector
from psycopg import BaseConnection
from psycopg.abc import Buffer
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types.json import Jsonb

from pgmemory.store.jsonb import dumps

_LENGTH = struct.Struct("!i")
_INT4 = struct.Struct("!i")
_INT8 = struct.Struct("!q")
_FLOAT4 = struct.Struct("!f")
_VECTOR_HEAD = struct.Struct("!HH")
#: Dimensions, NULL flag, element type; then the one dimension's size and lower bound.
_HEAD = struct.Struct("!iiIii")
_NO_DIMENSIONS = struct.Struct("!iiI")
_NULL = _LENGTH.pack(-1)
_JSONB_VERSION = b"\x01"
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # timestamptz counts microseconds from here
_MICROSECOND = timedelta(microseconds=1)


def _text(value: str, encoding: str) -> bytes:
    return value.encode(encoding)


def _uuid(value: Any, _encoding: str) -> bytes:
    return (value if isinstance(value, uuid.UUID) else uuid.UUID(value)).bytes


def _jsonb(value: Any, encoding: str) -> bytes:
    text = (value.dumps or dumps)(value.obj) if isinstance(value, Jsonb) else dumps(value)
    return _JSONB_VERSION + (text.encode(encoding) if isinstance(text, str) else bytes(text))


def _int4(value: int, _encoding: str) -> bytes:
    return _INT4.pack(value)


def _int8(value: int, _encoding: str) -> bytes:
    return _INT8.pack(value)


def _float4(value: float, _encoding: str) -> bytes:
    return _FLOAT4.pack(value)


def _timestamptz(value: datetime, _encoding: str) -> bytes:
    if value.utcoffset() is None:
        raise TypeError("a timestamptz[] element must be an aware datetime")
    return _INT8.pack((value - _EPOCH) // _MICROSECOND)


def vector_bytes(value: Any) -> bytes:
    """A vector's binary form (pgvector's ``vector_recv``): its size, a zero, then each value
    as a big-endian float32. ``value`` is a numpy array, a sequence of floats, or a pgvector
    ``Vector``."""
    if isinstance(value, Vector):
        value = value.to_numpy()
    floats = np.asarray(value, dtype=">f4")
    if floats.ndim != 1:
        raise TypeError(f"a vector must be one-dimensional, got shape {floats.shape}")
    return _VECTOR_HEAD.pack(floats.shape[0], 0) + floats.tobytes()


def _vector(value: Any, _encoding: str) -> bytes:
    return vector_bytes(value)


#: Each element type a statement casts an array to, and how one (non-NULL) element is written
#: (text in the connection's client encoding, as psycopg writes a string).
_ELEMENTS: dict[str, Callable[[Any, str], bytes]] = {
    "text": _text,
    "uuid": _uuid,
    "jsonb": _jsonb,
    "int4": _int4,
    "bigint": _int8,
    "real": _float4,
    "timestamptz": _timestamptz,
    "vector": _vector,
}


class ArrayParameter(list[Any]):
    """A list sent as a one-dimensional binary array of :attr:`element` values (see the
    module's text); made by :func:`array`."""

    element: ClassVar[str]


#: The parameter class of each element type (``ARRAY_TYPES["uuid"]`` is sent as ``uuid[]``).
ARRAY_TYPES: dict[str, type[ArrayParameter]] = {
    name: type(f"{name}_array", (ArrayParameter,), {"element": name, "__slots__": ()})
    for name in _ELEMENTS
}


def array(element: str, values: Iterable[Any]) -> ArrayParameter:
    """``values`` as a parameter sent as an ``element[]`` array.

    Raises:
        KeyError: No statement casts to ``element[]`` (see :data:`ARRAY_TYPES`).
    """
    return ARRAY_TYPES[element](values)


class _ArrayDumper(Dumper):
    """Writes an :class:`ArrayParameter` of one element type; :func:`register` makes one
    subclass per element type and connection, with the connection's type ids and encoding."""

    format = Format.BINARY
    _element_oid: ClassVar[int]
    _encoding: ClassVar[str]

    @staticmethod
    def _write(value: Any, encoding: str) -> bytes:
        """One non-NULL element (each subclass has its element type's, from ``_ELEMENTS``)."""
        raise NotImplementedError

    def dump(self, obj: ArrayParameter) -> Buffer:
        if not obj:
            return _NO_DIMENSIONS.pack(0, 0, self._element_oid)
        write, encoding = self._write, self._encoding
        parts = []
        nulls = 0
        for value in obj:
            if value is None:
                parts.append(_NULL)
                nulls = 1
            else:
                data = write(value, encoding)
                parts.append(_LENGTH.pack(len(data)))
                parts.append(data)
        return _HEAD.pack(1, nulls, self._element_oid, len(obj), 1) + b"".join(parts)


class _VectorDumper(Dumper):
    """Writes a numpy array as a ``vector`` (:func:`register` sets the database's type id)."""

    format = Format.BINARY

    def dump(self, obj: np.ndarray) -> Buffer:
        return vector_bytes(obj)


def register(connection: BaseConnection[Any]) -> None:
    """Add the dumper of each :data:`ARRAY_TYPES` class, and of numpy vectors, to
    ``connection``'s adapters, with its type ids and client encoding as they are now (pgmemory
    never changes the encoding). Call it after pgvector's types are registered (its numpy
    dumper is replaced); a type the database lacks (``vector`` without pgvector) gets none."""
    adapters = connection.adapters
    encoding = connection.info.encoding
    vector = adapters.types.get("vector")
    if vector is not None:
        # Under pgvector's key, so that it replaces pgvector's binary dumper.
        adapters.register_dumper(
            "numpy.ndarray",
            type("vector_dumper", (_VectorDumper,), {"oid": vector.oid, "__module__": __name__}),
        )
    for name, cls in ARRAY_TYPES.items():
        info = adapters.types.get(name)
        if info is None:
            continue
        attributes = {
            "oid": info.array_oid,
            "_element_oid": info.oid,
            "_encoding": encoding,
            "_write": staticmethod(_ELEMENTS[name]),
            "__module__": __name__,
        }
        adapters.register_dumper(cls, type(f"{name}_array_dumper", (_ArrayDumper,), attributes))
