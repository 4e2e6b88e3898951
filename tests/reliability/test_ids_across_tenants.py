"""Ids across tenants: a memory id is unique per user, and no by-id operation reaches past the
caller's scope, whatever ids two tenants' rows share.

The attack: a user adds rows with ids copied from another user's memories (a restore keeps
its ids, so the store accepts given ids), then deletes "their own" ids, which the application
checked are in their scope. Tried broadly: several tenants holding random overlaps of one id
pool, random deletes by id, and the model of what each tenant must still hold compared with
the table after every step.
"""

from __future__ import annotations

import random
import uuid

import numpy as np
import pytest
from sqlalchemy import text as sql

from pgmemory import InvalidInputError, MemoryRecord, MemoryScope, MemoryStore, ScopeError
from tests.conftest import unique

DIMENSIONS = 8


def _vector(rng: random.Random) -> list[float]:
    v = np.array([rng.gauss(0, 1) for _ in range(DIMENSIONS)])
    return list(v / np.linalg.norm(v))


async def _held(store: MemoryStore, collection: str, user: str) -> set[uuid.UUID]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            sql("SELECT id FROM pgmemory_memories WHERE collection = :c AND user_id = :u"),
            {"c": collection, "u": user},
        )
        return set(rows.scalars())


@pytest.fixture
async def small(store: MemoryStore) -> str:
    name = f"c_{uuid.uuid4().hex[:10]}"
    await store.create_collection(name, dimensions=DIMENSIONS, embedding_model="test-8d")
    return name


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_deletes_by_id_never_reach_another_tenant(
    store: MemoryStore, small: str, seed: int
) -> None:
    rng = random.Random(seed)
    tenants = [unique(f"t{i}") for i in range(4)]
    pool = [uuid.uuid4() for _ in range(12)]
    model: dict[str, set[uuid.UUID]] = {}
    for tenant in tenants:  # each holds a random overlap of the same ids
        mine = set(rng.sample(pool, rng.randint(3, 9)))
        records = [
            MemoryRecord(
                id=i, content=f"m {i}", scope=MemoryScope(user_id=tenant), embedding=_vector(rng)
            )
            for i in sorted(mine)
        ]
        assert set(await store.add(small, records)) == mine
        model[tenant] = mine
    for _ in range(10):
        tenant = rng.choice(tenants)
        asked = rng.sample(pool, rng.randint(1, 6))  # ids of anyone's, the caller's or none
        deleted = await store.delete(small, ids=asked, scope=MemoryScope(user_id=tenant))
        assert deleted == len(model[tenant] & set(asked))
        model[tenant] -= set(asked)
        for other in tenants:
            assert await _held(store, small, other) == model[other]


async def test_a_delete_by_ids_without_a_scope_is_refused(store: MemoryStore, small: str) -> None:
    victim = unique("victim")
    rng = random.Random(0)
    [kept] = await store.add(
        small,
        [MemoryRecord(content="x", scope=MemoryScope(user_id=victim), embedding=_vector(rng))],
    )
    with pytest.raises(ScopeError, match=r"pass scope="):
        await store.delete(small, ids=[kept])
    with pytest.raises(ScopeError, match=r"every user"):
        await store.delete(small, ids=[kept], scope=MemoryScope())
    assert await _held(store, small, victim) == {kept}


async def test_a_repeated_id_is_a_pgmemory_error_naming_it_and_nothing_is_stored(
    store: MemoryStore, small: str
) -> None:
    rng = random.Random(1)
    user = unique("u")
    scope = MemoryScope(user_id=user)
    repeated = uuid.uuid4()

    def record(i: uuid.UUID | None) -> MemoryRecord:
        return MemoryRecord(id=i, content="y", scope=scope, embedding=_vector(rng))

    with pytest.raises(
        InvalidInputError, match=rf"records\[2\]\.id {repeated} repeats records\[0\]"
    ):
        await store.add(small, [record(repeated), record(None), record(repeated)])
    assert await _held(store, small, user) == set()
    # in one import, across its COPY batches (the primary key catches it)
    with pytest.raises(InvalidInputError, match=rf"memory id {repeated} is already stored"):
        await store.import_records(
            small, [record(repeated), record(None), record(None), record(repeated)], batch_rows=2
        )
    assert await _held(store, small, user) == set()
    # the same id as a stored row of the same user: add and import alike
    [stored] = await store.add(small, [record(repeated)])
    for write in (
        lambda: store.add(small, [record(None), record(repeated)]),
        lambda: store.import_records(small, [record(None), record(repeated)]),
    ):
        with pytest.raises(
            InvalidInputError, match=rf"memory id {repeated} is already stored"
        ) as e:
            await write()
        assert user not in str(e.value) and e.value.__cause__ is None
        assert await _held(store, small, user) == {stored}
    # another user may hold the same id: ids are unique per user
    other = unique("other")
    assert await store.add(small, [MemoryRecord(id=repeated, content="z",
        scope=MemoryScope(user_id=other), embedding=_vector(rng))]) == [repeated]  # fmt: skip
