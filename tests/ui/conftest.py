"""Fixtures of the audit-page tests: a user with memories, recalls, facts and chat history."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np
import pytest_asyncio

from pgmemory.store.records import MemoryRecord, MemoryScope, RecallTrace, SearchWeights
from pgmemory.store.store import MemoryStore
from tests.conftest import unique

#: A memory whose text is markup: the page must show it as text, never run it.
SCRIPT_MEMORY = '<script>alert("pwned")</script><img src=x onerror=alert(2)> & "quotes"'
#: User ids that break naive URL handling or HTML.
AWKWARD_USER_IDS = ("a/b", "100%", "o'brien", 'say "hi"', "中文用户", "😀 emoji", "x?y=1&z#w")


@dataclass
class Seeded:
    """What :func:`seed_user` stored."""

    user: str
    collection: str
    session: str
    memory_ids: list[uuid.UUID]
    deleted_id: uuid.UUID
    recall_query: str


async def seed_user(store: MemoryStore, collection: str, user: str | None = None) -> Seeded:
    """A user with four memories (one of them markup), two recalls (one with its text kept),
    one of the recalled memories deleted since, facts changed twice, and a chat session."""
    user = user or unique("user")
    session = unique("sess")
    scope = MemoryScope(user_id=user, session_id=session)
    texts = [
        "I am allergic to peanuts",
        "My favourite cuisine is Sichuan, very spicy",
        SCRIPT_MEMORY,
        "I live in Lyon and cycle to work",
    ]
    ids = await store.add(
        collection,
        [
            MemoryRecord(content=t, scope=scope, role="user", message_id=f"m{i}")
            for i, t in enumerate(texts)
        ],
        actor="seed",
    )
    query = "what food can I order for dinner?"
    hits = await store.search(
        collection,
        MemoryScope(user_id=user),
        query=query,
        limit=3,
        mode="hybrid",
        # the pages' tests expect the hits of fusion without neighbours (with them, these four
        # memories of one conversation lend each other score and the hits change); ranking
        # itself is tested in tests/store
        weights=SearchWeights(neighbour=0.0),
        trace=RecallTrace(
            provider="agent", mode="hybrid", session_id=session, include_query_text=True
        ),
    )
    assert len(hits) == 3
    await store.search(
        collection,
        MemoryScope(user_id=user),
        query="where do I live",
        limit=2,
        trace=RecallTrace(provider="agent", mode="vector", session_id=session),
    )
    # Delete one memory the first recall returned, so its page shows it as gone.
    deleted = hits[-1].memory.id
    await store.delete(collection, ids=[deleted], scope=MemoryScope(user_id=user), actor="seed")
    await store.merge_facts(
        "profile", MemoryScope(user_id=user), {"name": "Ana", "age": 31}, actor="seed"
    )
    await store.merge_facts("profile", MemoryScope(user_id=user), {"age": 32}, actor="seed")
    await store.append_history(
        session,
        [
            {
                "message_id": "h1",
                "role": "user",
                "text": "Can you order dinner?",
                "contents": [{"type": "text", "text": "Can you order dinner?"}],
            },
            {
                "message_id": "h2",
                "role": "assistant",
                "text": "Sure, nothing with peanuts.",
                "contents": [{"type": "text", "text": "Sure, nothing with peanuts."}],
            },
        ],
        user_id=user,
    )
    return Seeded(user, collection, session, ids, deleted, query)


@pytest_asyncio.fixture
async def token(store: MemoryStore) -> str:
    """A live token issued for the audit page (as `pgmemory token create` issues one)."""
    from pgmemory.admin import Admin

    return (await Admin(store).issue_token(unique("operator"))).token


@pytest_asyncio.fixture
async def seeded(store: MemoryStore, collection: str) -> Seeded:
    """One freshly seeded user in a fresh collection."""
    return await seed_user(store, collection)


def random_vectors(n: int, seed: int, dims: int = 512) -> np.ndarray:
    """Unit-free random vectors (for bulk rows that need no real embedding)."""
    return np.random.default_rng(seed).standard_normal((n, dims)).astype(np.float32)
