"""JSON values stored as jsonb so that they come back as they went in.

jsonb keeps a number as ``numeric``, which has no exponent: ``1.7976931348623157e+308`` is
stored as 309 digits with no fraction, and read back as an integer. :func:`dumps` writes a
float that Python would print with an exponent in positional notation with a fraction
(``179769…0.0``), which ``numeric`` keeps exactly and reads back as the same float.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.types.json import Jsonb

#: A number in exponent form where :func:`json.dumps` writes a value: at the start, after ``[``,
#: or after its separators ``", "`` and ``": "`` (``repr`` of a float always signs its exponent:
#: ``1e+16``, ``1.5e-07``). A string that holds the same text only costs the exact path; a
#: string that merely holds a digit, an ``e`` and a digit (a hex id, ``"4e5"``) costs nothing.
_EXPONENT = re.compile(r"(?:^|\[|, |: )-?\d+(?:\.\d+)?e[+-]\d")


def _float(value: float) -> str:
    text = float.__repr__(value)
    if "e" not in text and "E" not in text:
        return text  # already positional, with a fraction ("1.5", "2.0")
    positional = format(Decimal(text), "f")
    return positional if "." in positional else positional + ".0"


def dumps(value: Any) -> str:
    """``value`` (JSON-native, already checked) as JSON text whose floats survive jsonb.

    The C encoder writes it first; only when that text holds a number in exponent form is it
    written again here, float by float (the same text otherwise: the same separators, and a
    float in positional form is its ``repr`` either way).
    """
    text = json.dumps(value, ensure_ascii=False)
    if _EXPONENT.search(text) is None:
        return text
    return _positional(value)


def _positional(value: Any) -> str:
    """:func:`dumps`, every float in positional notation with a fraction."""
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(
                f"{json.dumps(str(k), ensure_ascii=False)}: {_positional(v)}"
                for k, v in value.items()
            )
            + "}"
        )
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_positional(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def jsonb(value: Any) -> Jsonb:
    """``value`` as a jsonb parameter, written by :func:`dumps`."""
    return Jsonb(value, dumps=dumps)


class JsonbLoader(Loader):
    """A jsonb value read back (text format), as psycopg's own loader reads it, but an empty
    object, what most rows' metadata holds, without a parse (~1.4 µs a value), and other text
    decoded before :func:`json.loads` (which otherwise detects the bytes' encoding first)."""

    def load(self, data: Buffer) -> Any:
        if data == b"{}":
            return {}
        return json.loads(bytes(data).decode())
