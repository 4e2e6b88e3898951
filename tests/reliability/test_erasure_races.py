"""Writes racing an erasure: a write of the user either is erased with the user or stays whole
with its audit under the user's id, and a write that was running when the erasure started is
always erased.

A write holds its users' erasure lock shared for its transaction; ``erase_user`` takes it
exclusively, so it waits for the writes already running and later writes wait for it.
Deterministic cases pin each order; randomised interleavings (seeds, user sizes and writer
counts in the parametrisation) check the invariants under load.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable

import pytest
import sqlalchemy as sa

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from pgmemory.store import queries as q
from tests.conftest import unique

DIMENSIONS = 3


def _record(user: str, i: int) -> MemoryRecord:
    return MemoryRecord(content=f"m{i}", scope=MemoryScope(user_id=user), embedding=[1, 0, i % 5])


@pytest.fixture
async def small(store: MemoryStore) -> str:
    name = f"c_{uuid.uuid4().hex[:10]}"
    await store.create_collection(name, dimensions=DIMENSIONS, embedding_model="t:3")
    return name


def _invariants(database_url: str, collection: str, user: str) -> tuple[int, int]:
    """Every live memory of the user has its insert audit row under the user's own id; no
    audit row under the user's id is left of an erased memory. Returns (live, audit rows)."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            live = (
                conn.execute(
                    sa.text(
                        "SELECT id FROM pgmemory_memories WHERE collection = :c AND user_id = :u"
                    ),
                    {"c": collection, "u": user},
                )
                .scalars()
                .all()
            )
            audited = (
                conn.execute(
                    sa.text(
                        "SELECT memory_id FROM pgmemory_memory_audit "
                        "WHERE user_id = :u AND collection = :c AND operation = 'insert'"
                    ),
                    {"c": collection, "u": user},
                )
                .scalars()
                .all()
            )
    finally:
        engine.dispose()
    assert set(live) <= set(audited), "a live memory lost its audit row under its user"
    assert set(audited) <= set(live), "an audit row under the user's id outlived its memory"
    return len(live), len(audited)


async def test_a_write_running_when_the_erasure_starts_is_erased_with_the_user(
    store: MemoryStore, small: str, database_url: str
) -> None:
    user = unique("u")
    await store.add(small, [_record(user, 0)])
    inside = asyncio.Event()
    release = asyncio.Event()

    async def slow_write() -> None:
        async with store.shared_transaction():  # one transaction, held open
            await store.add(small, [_record(user, 1)])
            inside.set()
            await release.wait()

    writer = asyncio.create_task(slow_write())
    await inside.wait()
    erasing = asyncio.create_task(store.erase_user(user))
    try:
        await asyncio.sleep(0.3)
        waited = not erasing.done()
    finally:
        release.set()
        await writer
        counts = await erasing
    assert waited, "the erasure did not wait for the running write"
    assert counts["memories"] == 2  # the running write's memory is erased with the user
    assert _invariants(database_url, small, user) == (0, 0)


async def _waits_for_the_erasure_lock(
    store: MemoryStore, user: str, call: Callable[[], Awaitable[object]]
) -> bool:
    """Whether ``call()`` waits while the user's erasure lock is held (by a transaction of
    the owner's, as a long erasure holds it); it then runs to its end once the lock is gone."""
    hold = asyncio.Event()
    started = asyncio.Event()

    async def held_erasure() -> None:
        async with store.shared_transaction(), store.database.write() as conn:
            await conn.execute(sa.text(q.LOCK_USER_FOR_ERASURE), {"user_id": user})
            started.set()
            await hold.wait()

    holder = asyncio.create_task(held_erasure())
    await started.wait()
    running = asyncio.create_task(call())
    try:
        await asyncio.sleep(0.3)
        return not running.done()
    finally:
        hold.set()
        await holder
        await running


async def test_a_write_starting_during_the_erasure_waits_and_stays_whole(
    store: MemoryStore, small: str, database_url: str
) -> None:
    user = unique("u")
    await store.add(small, [_record(user, 0)])
    waited = await _waits_for_the_erasure_lock(
        store, user, lambda: store.add(small, [_record(user, 1)])
    )
    assert waited, "a write of the user did not wait for the erasure's lock"
    assert _invariants(database_url, small, user) == (2, 2)


async def test_a_recorded_recall_waits_for_the_erasures_lock(
    store: MemoryStore, small: str
) -> None:
    """A recall audit row written apart from its search (``record_recall``, and the audit of a
    search served by a replica) holds the user's erasure lock too: an erasure running now
    sees it, or it waits until the erasure is done."""
    user = unique("u")
    [memory_id] = await store.add(small, [_record(user, 0)])
    waited = await _waits_for_the_erasure_lock(
        store,
        user,
        lambda: store.record_recall(
            small, MemoryScope(user_id=user), memory_ids=[memory_id], scores=[1.0], query="q"
        ),
    )
    assert waited, "a recorded recall of the user did not wait for the erasure's lock"


async def test_a_read_whose_snapshot_predates_an_erasure_shows_nothing_erased(
    store: MemoryStore, small: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An audited search and recall that start while an erasure of their user is still open
    (their snapshot holds the user's memories) and wait for its lock: once it commits they show
    none of the erased memories and leave no audit row under the user naming one. Where the
    read takes the lock in its own statement, its guard sees the erasure committed after the
    snapshot and the read runs again; elsewhere the lock statement before it made it wait
    before its snapshot."""
    user = unique("u")
    scope = MemoryScope(user_id=user)
    await store.import_records(small, (_record(user, i) for i in range(5)))
    hold = asyncio.Event()
    started = asyncio.Event()

    async def open_erasure() -> None:
        async with store.shared_transaction(), store.database.write() as conn:
            await conn.execute(sa.text(q.LOCK_USER_FOR_ERASURE), {"user_id": user})
            await conn.execute(sa.text(q.ERASE_USER), {"user_id": user, "actor": ""})
            started.set()
            await hold.wait()

    eraser = asyncio.create_task(open_erasure())
    await started.wait()
    guarded = store.database.guards_reads
    caplog.set_level("INFO", logger="pgmemory.store._engine.retry")
    search = asyncio.create_task(store.search(small, scope, vector=[1, 0, 0], limit=3))
    recall = asyncio.create_task(store.recall(small, scope, query="m1", mode="text"))
    try:
        await asyncio.sleep(0.3)
        waited = not search.done() and not recall.done()
    finally:
        hold.set()
        await eraser
    hits, recalled = await search, await recall
    assert waited, "an audited read did not wait for the erasure's lock"
    assert hits == []
    assert recalled.items == []
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            named = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pgmemory_recall_audit "
                    "WHERE user_id = :u AND cardinality(memory_ids) > 0"
                ),
                {"u": user},
            ).scalar_one()
    finally:
        engine.dispose()
    assert named == 0
    runs_again = [r for r in caplog.records if "committed while it ran" in r.getMessage()]
    assert len(runs_again) == (2 if guarded else 0)


async def test_the_guard_refuses_a_statement_whose_snapshot_an_erasure_outdated(
    store: MemoryStore, small: str, database_url: str
) -> None:
    """The erasure commits while the statement runs but before it takes the lock (so nothing
    waits): the stamp the statement passes is read under its own snapshot, so the guard still
    sees that the secret went, and refuses. (A stamp read with a fresh snapshot would match
    the guard's, and the statement would go on with what its snapshot showed.)"""
    user = unique("u")
    await store.add(small, [_record(user, 0)])  # the user's audit secret exists
    engine = sa.create_engine(database_url)

    def late_guard() -> None:
        with engine.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_sleep(0.5), pgmemory_erasure_guard(:u, pgmemory_erasure_stamp(:u))"
                ),
                {"u": user},
            )

    try:
        statement = asyncio.create_task(asyncio.to_thread(late_guard))
        await asyncio.sleep(0.1)
        await store.erase_user(user)  # commits during the statement's sleep, without waiting
        with pytest.raises(sa.exc.DBAPIError) as refused:
            await statement
    finally:
        engine.dispose()
    assert refused.value.orig.sqlstate == "40001"
    assert "erased while this statement read" in str(refused.value.orig)


@pytest.mark.parametrize(
    ("seed", "rows", "writers"), [(1, 50, 2), (2, 500, 4), (3, 2_000, 4)], ids=str
)
async def test_random_interleavings_keep_every_write_whole_or_erased(
    store: MemoryStore, small: str, database_url: str, seed: int, rows: int, writers: int
) -> None:
    rng = random.Random(seed)
    user = unique("busy")
    await store.import_records(small, (_record(user, i) for i in range(rows)))
    stop = asyncio.Event()
    done: list[int] = []

    async def writer(n: int) -> None:
        i = 0
        while not stop.is_set() and i < 40:
            kind = rng.random()
            if kind < 0.6:
                await store.add(small, [_record(user, 10_000 * n + i)])
            elif kind < 0.8:
                await store.append_history(
                    "s", [{"message_id": f"w{n}-{i}", "role": "user", "t": i}], user_id=user
                )
            else:
                await store.search(small, MemoryScope(user_id=user), vector=[1, 0, 0], limit=3)
            i += 1
            await asyncio.sleep(rng.random() * 0.01)
        done.append(i)

    tasks = [asyncio.create_task(writer(n)) for n in range(writers)]
    await asyncio.sleep(rng.random() * 0.05)
    await store.erase_user(user)
    stop.set()
    await asyncio.gather(*tasks)
    _invariants(database_url, small, user)


@pytest.mark.parametrize(("seed", "rows", "readers"), [(1, 200, 3), (2, 3_000, 4), (3, 50, 6)])
async def test_recalls_racing_an_erasure_leave_no_audit_row_of_the_erased_user(
    store: MemoryStore, small: str, database_url: str, seed: int, rows: int, readers: int
) -> None:
    """An audited search or recall holds the user's erasure lock for its statement, so an
    erasure either sees its audit row (and moves it to the pseudonym) or runs first (and the
    recall, seeing the user erased, shows nothing). After erase_user returns, no audit row
    under the user's id shows a memory, and the rows of recalls that returned before it began
    are all under the pseudonym."""
    rng = random.Random(seed)
    user = unique("recalled")
    scope = MemoryScope(user_id=user)
    await store.import_records(small, (_record(user, i) for i in range(rows)))
    stop = asyncio.Event()
    returned_before: list[int] = []
    erasing = asyncio.Event()
    first_returned = asyncio.Event()

    async def reader(n: int) -> None:
        while not stop.is_set():
            if rng.random() < 0.5:
                await store.search(small, scope, vector=[1, 0, 0], limit=3)
            else:
                await store.recall(small, scope, query=f"m{n}", mode="text", max_results=2)
            if not erasing.is_set():
                returned_before.append(n)
                first_returned.set()
            await asyncio.sleep(rng.random() * 0.005)

    tasks = [asyncio.create_task(reader(n)) for n in range(readers)]
    # the erasure starts while recalls run: after the first has returned (a cluster's first
    # connections take longer than one server's), at a random point after it
    await asyncio.wait_for(first_returned.wait(), timeout=60)
    await asyncio.sleep(rng.random() * 0.05)
    erasing.set()
    counts = await store.erase_user(user)
    stop.set()
    await asyncio.gather(*tasks)
    assert returned_before, "no recall ran before the erasure"
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            under_user = conn.execute(
                sa.text("SELECT memory_ids FROM pgmemory_recall_audit WHERE user_id = :u"),
                {"u": user},
            ).all()
    finally:
        engine.dispose()
    # Left under the id: only recalls that ran after the erasure, and they found nothing.
    assert all(list(ids) == [] for (ids,) in under_user), len(under_user)
    assert counts["recall_audit_rows_pseudonymised"] >= len(returned_before)
