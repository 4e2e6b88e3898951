"""Argument checks name the argument the caller passed and fit what it measures."""

from __future__ import annotations

import math

import pytest

from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from pgmemory.store.validation import check_name, check_number, check_text
from tests.conftest import unique


async def test_min_score_range_follows_the_mode(store: MemoryStore, collection: str) -> None:
    user = unique("u")
    scope = MemoryScope(user_id=user)
    await store.add(collection, [MemoryRecord(content="pizza pizza margherita", scope=scope)])
    # BM25 relevance exceeds 1, so a text-mode floor above 1 is meaningful.
    hits = await store.search(collection, scope, query="pizza", mode="text", audit=False)
    assert hits and hits[0].score > 0
    kept = await store.search(
        collection, scope, query="pizza", mode="text", min_score=hits[0].score / 2, audit=False
    )
    assert [h.memory.id for h in kept] == [hits[0].memory.id]
    assert await store.search(collection, scope, query="pizza", mode="text", min_score=1e9) == []
    await store.search(collection, scope, query="pizza", mode="hybrid", min_score=5, audit=False)
    with pytest.raises(InvalidInputError, match="min_score is 2; expected a number from -1 to 1"):
        await store.search(collection, scope, query="pizza", mode="vector", min_score=2)
    with pytest.raises(InvalidInputError, match="min_score is nan; expected a finite number"):
        await store.search(collection, scope, query="pizza", mode="text", min_score=math.nan)


async def test_a_bad_recall_floor_is_reported_as_recall_floor(
    store: MemoryStore, collection: str
) -> None:
    with pytest.raises(
        InvalidInputError, match="recall_floor is 1.5; expected a number from 0 to 1"
    ):
        await store.enable_ann(collection, recall_floor=1.5)


def test_one_text_check_for_contents_names_and_scope_values() -> None:
    with pytest.raises(InvalidInputError, match="content contains a NUL character at index 2"):
        check_text("ab\x00", what="content", max_chars=10)
    with pytest.raises(InvalidInputError, match="actor contains a NUL character at index 1"):
        check_name("a\x00", what="actor")
    with pytest.raises(ScopeError, match="user_id contains a NUL character at index 1"):
        MemoryScope(user_id="a\x00")
    with pytest.raises(InvalidInputError, match="actor is blank"):
        check_name(" ", what="actor")
    with pytest.raises(InvalidInputError, match="actor is 257 characters long"):
        check_name("x" * 257, what="actor")


def test_check_number_refuses_bools_and_infinities() -> None:
    assert check_number(3, what="x") == 3.0
    for bad in (True, math.inf, "1", None):
        with pytest.raises(InvalidInputError, match="x is"):
            check_number(bad, what="x")
