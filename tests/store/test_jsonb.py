"""jsonb parameters: the C encoder's text, unless a float needs writing out in positional form."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pgmemory.store.jsonb import _positional, dumps


@pytest.mark.parametrize(
    "value",
    [
        {"role": "user", "text": "héllo", "n": 3, "ok": True, "none": None, "f": 0.25},
        [1.5, -2.0, 123456789.125, {"nested": ["a", 1, None]}],
        {"looks like a number": "1e5 and 2E-3"},  # an exponent inside a string only
        {"big": 1e300, "tiny": 5e-324, "plain": 1.0},
        "just text",
        np.float64(1e20),  # a float subclass prints as a number either way
    ],
)
def test_dumps_writes_what_the_exact_writer_writes(value: object) -> None:
    assert dumps(value) == _positional(value)
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))


def test_a_float_with_an_exponent_is_written_positionally() -> None:
    text = dumps({"x": 1.7976931348623157e308, "y": 1e-7})
    assert re.search(r"\d[eE][+-]?\d", text) is None, text
    assert text.endswith('"y": 0.0000001}')
    assert json.loads(text) == {"x": 1.7976931348623157e308, "y": 1e-7}
