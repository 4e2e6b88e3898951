"""Bad input never corrupts or half-writes: each case gets a clear error before any SQL."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sqlalchemy import text

from pgmemory.errors import CollectionError, InvalidInputError, ScopeError
from pgmemory.settings import Settings
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import unique


def good(user: str, content: str = "fine") -> MemoryRecord:
    return MemoryRecord(content=content, scope=MemoryScope(user_id=user))


async def _rows(store: MemoryStore, user: str) -> tuple[int, int]:
    async with store.engine.connect() as conn:
        memories = (
            await conn.execute(
                text("SELECT count(*) FROM pgmemory_memories WHERE user_id = :u"), {"u": user}
            )
        ).scalar_one()
        audit = (
            await conn.execute(
                text("SELECT count(*) FROM pgmemory_memory_audit WHERE user_id = :u"), {"u": user}
            )
        ).scalar_one()
    return memories, audit


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (dict(content=""), "empty or whitespace only"),
        (dict(content="  \n\t "), "empty or whitespace only"),
        (dict(content=None), "must be a string"),
        (dict(embedding=[math.nan] * 512), "non-finite value nan at index 0"),
        (dict(embedding=[0.1] * 511 + [math.inf]), "non-finite value inf at index 511"),
        (dict(embedding=[0.0] * 512), "all zeros"),
        (dict(embedding=[0.1] * 3), "3 dimensions; this collection holds 512"),
        (dict(role="wizard"), r"role is not one of .*'user'.*got a str of 6 characters"),
        (dict(source_type="rumour"), "source_type is not one of"),
        (dict(metadata={"when": object()}), "not JSON-serialisable"),
        (dict(metadata={"k": math.nan}), "not JSON-serialisable"),
    ],
)
async def test_a_bad_record_fails_the_whole_batch(
    store: MemoryStore, collection: str, bad: dict, message: str
) -> None:
    user = unique("u")
    fields = {"content": "bad one", "scope": MemoryScope(user_id=user), **bad}
    batch = [good(user), MemoryRecord(**fields), good(user)]
    with pytest.raises(InvalidInputError, match=message) as info:
        await store.add(collection, batch)
    assert "records[1]" in str(info.value)
    assert await _rows(store, user) == (0, 0)


async def test_text_over_the_cap_names_the_setting(
    database_url: str, embedder, collection: str
) -> None:
    settings = Settings(_env_file=None, max_text_chars=10)  # type: ignore[call-arg]
    async with MemoryStore(database_url, settings=settings, embedder=embedder) as small:
        with pytest.raises(
            InvalidInputError, match=r"11 characters.*limit is 10.*PGMEMORY_MAX_TEXT_CHARS"
        ):
            await small.add(collection, [good(unique("u"), "x" * 11)])
        # A query is never refused for its length: it is cut to its head (max_text_chars).
        assert await small.search(collection, MemoryScope(user_id="u"), query="y" * 11) == []


async def test_unknown_collection(store: MemoryStore) -> None:
    with pytest.raises(
        CollectionError, match=r"unknown collection 'nope'.*create_collection\('nope'\)"
    ):
        await store.add("nope", [good("u")])
    with pytest.raises(CollectionError, match="unknown collection"):
        await store.search("nope", MemoryScope(user_id="u"), query="x")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(user_id=""), "user_id is blank"),
        (dict(session_id="   "), "session_id is blank"),
        (dict(agent_id="a\x00"), "NUL character"),
        (dict(user_id=42), "must be a string or None"),
        (dict(application_id="x" * 300), "300 characters long"),
    ],
)
def test_bad_scope_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ScopeError, match=message):
        MemoryScope(**kwargs)


async def test_bad_search_arguments(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id="u")
    with pytest.raises(InvalidInputError, match="exactly one of query"):
        await store.search(collection, scope)
    with pytest.raises(InvalidInputError, match="limit is 0"):
        await store.search(collection, scope, query="x", limit=0)
    with pytest.raises(InvalidInputError, match="min_score is 2"):
        await store.search(collection, scope, query="x", mode="vector", min_score=2)
    with pytest.raises(InvalidInputError, match="non-finite"):
        await store.search(collection, scope, vector=[math.nan] * 512)
    with pytest.raises(CollectionError, match="4 dimensions"):
        await store.search(collection, scope, vector=np.ones(4))
    from datetime import datetime

    with pytest.raises(InvalidInputError, match="no time zone"):
        await store.search(collection, scope, query="x", since=datetime(2024, 1, 1))


async def test_bad_collection_definitions(store: MemoryStore) -> None:
    with pytest.raises(CollectionError, match="1 to 2000 dimensions"):
        await store.create_collection(unique("c"), dimensions=4096, embedding_model="m")
    with pytest.raises(InvalidInputError, match="collection name"):
        await store.create_collection("  ", dimensions=4, embedding_model="m")


def test_scope_round_trips_through_json() -> None:
    import json

    scope = MemoryScope(user_id="alice", session_id="s1")
    assert MemoryScope.from_dict(json.loads(json.dumps(scope.to_dict()))) == scope
    with pytest.raises(ScopeError, match="unknown scope keys"):
        MemoryScope.from_dict({"tenant": "x"})


@pytest.mark.parametrize("scale", [1e30, 1e-30])
def test_vectors_whose_squares_overflow_or_underflow_are_still_accepted(scale: float) -> None:
    from pgmemory.store.validation import check_vector

    vector = np.full(512, scale, dtype=np.float32)
    assert np.array_equal(check_vector(vector, dimensions=512, what="v"), vector)
    vector[7] = math.nan  # and one bad value among huge ones is still named
    with pytest.raises(InvalidInputError, match="non-finite value nan at index 7"):
        check_vector(vector, dimensions=512, what="v")


def test_the_quick_entry_bound_is_never_below_an_exact_entry() -> None:
    """The shortcut of check_index_entries: the bound over all fields is at least every entry."""
    from pgmemory.store import validation as v

    rng = np.random.default_rng(5)
    alphabet = ["a", "é", "中", "😀"]
    shapes = (
        *v.MEMORY_INDEXES, v.MESSAGE_INDEX, v.COVERING_INDEX, v.CODES_INDEX, v.HALVES_INDEX,
        *v.MEMORY_AUDIT_INDEXES,
    )  # fmt: skip
    for _ in range(300):
        values: dict[str, object] = {
            field: "".join(rng.choice(alphabet, size=int(rng.integers(0, 200))))
            for field in ("collection", "user_id", "application_id", "agent_id", "session_id",
                          "message_id")
        }  # fmt: skip
        values["embedding"] = int(rng.integers(1, 2001))
        if rng.random() < 0.3:
            values["message_id"] = None
        exact = max(v.entry_bytes(shape, values) for shape in shapes)
        assert v._entry_bound(shapes, values) >= exact
