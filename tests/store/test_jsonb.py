"""jsonb parameters: the C encoder's text, unless a float needs writing out in positional form."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from psycopg import pq

from pgmemory import MemoryStore
from pgmemory.store.jsonb import JsonbLoader, _positional, dumps


@pytest.mark.parametrize(
    "value",
    [
        {"role": "user", "text": "héllo", "n": 3, "ok": True, "none": None, "f": 0.25},
        [1.5, -2.0, 123456789.125, {"nested": ["a", 1, None]}],
        {"looks like a number": "1e5 and 2E-3"},  # an exponent inside a string only
        {"big": 1e300, "tiny": 5e-324, "plain": 1.0},
        {"at": [[1e16, -1.5e-07], {"k": [2.0, 3e-05]}]},  # first in a list, nested, negative
        1e-07,  # the whole value
        {"says": "a value like , 1e+5 here"},  # a separator and an exponent inside a string
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


def test_ids_that_hold_a_digit_an_e_and_a_digit_stay_on_the_c_encoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message's ids and timestamps (hex, "4e5") are no numbers: the exact writer, five times
    slower, is not run for them."""

    def refuse(value: object) -> str:
        raise AssertionError(f"written float by float: {value!r}")

    monkeypatch.setattr("pgmemory.store.jsonb._positional", refuse)
    value = {
        "message_id": "d04e0101-c876-48a5-a457-20cfd12273ee",
        "call_id": "call_4e5",
        "additional_properties": {"created_at": "2026-12-05T02:38:52.006259+00:00"},
        "n": [1, 2.5],
    }
    assert json.loads(dumps(value)) == value


async def test_jsonb_results_read_back_as_stored(store: MemoryStore) -> None:
    """The connection's jsonb loader: an empty object (a new dict each time), text beyond
    ASCII, a float written positionally, scalars and JSON null all read as json.loads reads
    them; SQL NULL stays None."""
    values = ["{}", '{"a": "héllo 🍜", "b": [1.5, null, {"c": {}}]}', '"x"', "null", "2", "[]"]
    async with store.database.connections.driver_autocommit() as conn:
        jsonb_oid = conn.adapters.types["jsonb"].oid
        assert conn.adapters.get_loader(jsonb_oid, pq.Format.TEXT) is JsonbLoader
        cursor = await conn.execute(
            "SELECT v::jsonb FROM unnest(%s::text[]) AS v", [[*values, None]]
        )
        got = [row[0] for row in await cursor.fetchall()]
        assert got == [*(json.loads(v) for v in values), None]
        cursor = await conn.execute("SELECT '{}'::jsonb, '{}'::jsonb")
        first, second = await cursor.fetchone()  # type: ignore[misc]
        first["k"] = 1
        assert second == {} and first is not second
