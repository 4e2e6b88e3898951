"""JSON values come back as they went in: metadata, chat-history messages and facts keep each
number's type and value through jsonb, however large, small or oddly written.

jsonb stores numbers as ``numeric``, without an exponent: written naively, a float like
``1.7976931348623157e+308`` comes back as a 309-digit integer.
"""

from __future__ import annotations

import math
import random
import sys

import pytest

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from tests.conftest import unique

EDGES = [
    sys.float_info.max,
    -sys.float_info.max,
    sys.float_info.min,  # smallest normal
    5e-324,  # smallest subnormal
    1e16,
    1e22,
    1e-7,
    123456789.0,
    2.0,
    0.1,
    -0.0,
]


def _values(seed: int) -> list[object]:
    rng = random.Random(seed)
    floats = [math.ldexp(rng.random() * 2 - 1, rng.randint(-1074, 1023)) for _ in range(40)]
    ints = [rng.randint(-(2**70), 2**70) for _ in range(10)]
    return [*EDGES, *floats, *ints, True, False, None, "1e308", 0]


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a)))


@pytest.mark.parametrize("seed", [1, 2])
async def test_numbers_keep_their_type_and_value(
    store: MemoryStore, collection: str, seed: int
) -> None:
    values = _values(seed)
    scope = MemoryScope(user_id=unique("json"))
    metadata = {"values": values, "nested": {"max": sys.float_info.max}}
    [memory_id] = await store.add(
        collection, [MemoryRecord(content="numbers", scope=scope, metadata=metadata)]
    )
    [stored] = await store.list(collection, scope)
    assert stored.id == memory_id
    back = stored.metadata["values"]
    assert [(type(v).__name__, v) for v in back] == [(type(v).__name__, v) for v in values]
    assert all(_same(a, b) for a, b in zip(back, values, strict=True))
    assert _same(stored.metadata["nested"]["max"], sys.float_info.max)

    session = unique("s")
    await store.append_history(
        session, [{"message_id": "m1", "role": "user", "numbers": values}], user_id=scope.user_id
    )
    [row] = await store.read_history(session, user_id=scope.user_id)
    assert all(_same(a, b) for a, b in zip(row.message["numbers"], values, strict=True))

    await store.merge_facts("numbers", scope, {"big": sys.float_info.max, "tiny": 5e-324})
    facts = await store.get_facts("numbers", scope)
    assert _same(facts["big"], sys.float_info.max) and _same(facts["tiny"], 5e-324)
