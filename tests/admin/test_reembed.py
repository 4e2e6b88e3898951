"""Re-embedding a collection with another model: staged beside the vectors searches use
(resumable), switched over in one transaction; processes on the old model are refused after."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest
from sqlalchemy import text

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from pgmemory.admin import Admin
from pgmemory.errors import CollectionError, EmbeddingError
from pgmemory.store import catalogue
from tests.conftest import unique

WORDS = ["tea", "coffee", "train", "dentist", "budget", "sister", "park", "cake", "lyon", "project"]


class Bag:
    """A deterministic bag-of-words embedder: each word a fixed random vector."""

    def __init__(self, dimensions: int, *, fail_after: int | None = None) -> None:
        self.dimensions = dimensions
        self.model_id = f"test-bag@{dimensions}"
        self.texts: list[str] = []
        self.fail_after = fail_after

    def vector(self, content: str) -> np.ndarray:
        out = np.zeros(self.dimensions, dtype=np.float32)
        for word in content.lower().split():
            seed = int.from_bytes(hashlib.sha256(f"{self.dimensions}:{word}".encode()).digest()[:4])
            out += np.random.default_rng(seed).standard_normal(self.dimensions).astype(np.float32)
        return out / (np.linalg.norm(out) or 1)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail_after is not None and len(self.texts) >= self.fail_after:
            raise EmbeddingError("the new model's endpoint went away")
        self.texts.extend(texts)
        return np.stack([self.vector(t) for t in texts])


def _texts(n: int) -> list[str]:
    return [f"{WORDS[i % 10]} and {WORDS[(3 * i + 1) % 10]} number {i}" for i in range(n)]


async def _seed(url: str, users: list[str], n: int) -> tuple[str, Bag]:
    old = Bag(8)
    name = f"c_{unique('re').replace('-', '_')}"
    async with MemoryStore(url, embedder=old) as store:  # type: ignore[arg-type]
        await store.create_collection(name)
        for user in users:
            await store.add(
                name, [MemoryRecord(content=t, scope=MemoryScope(user_id=user)) for t in _texts(n)]
            )
    return name, old


async def _top(store: MemoryStore, name: str, user: str, query: str) -> list[str]:
    hits = await store.search(name, MemoryScope(user_id=user), query=query, limit=3, mode="vector")
    return [h.memory.content for h in hits]


async def test_staging_leaves_searches_alone_resumes_and_switches_whole(
    store_url: str, owner_engine: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    users = [unique("u") for _ in range(3)]
    name, old = await _seed(store_url, users, 10)
    async with MemoryStore(store_url, embedder=old) as before:  # type: ignore[arg-type]
        tops = {u: await _top(before, name, u, "tea and train") for u in users}

        # A run whose embedder fails in its second batch stages the first and stops.
        broken = Bag(12, fail_after=8)
        with pytest.raises(EmbeddingError):
            await Admin(before).reembed(name, broken, batch_size=8)  # type: ignore[arg-type]
        assert {u: await _top(before, name, u, "tea and train") for u in users} == tops

        # Another model is refused while this one is staged, unless restarted.
        with pytest.raises(CollectionError, match="being re-embedded"):
            await Admin(before).reembed(name, Bag(16), switch=False)  # type: ignore[arg-type]

        # The same model resumes: only what is missing is embedded; staged only, no switch.
        new = Bag(12)
        staged = await Admin(before).reembed(name, new, batch_size=8, switch=False)  # type: ignore[arg-type]
        assert staged.embedded == 30 - 8 and not staged.switched
        assert len(new.texts) == 22
        assert {u: await _top(before, name, u, "tea and train") for u in users} == tops

        # A memory written meanwhile by the old model is caught up by the switch.
        await before.add(
            name, [MemoryRecord(content="cake in lyon", scope=MemoryScope(user_id=users[0]))]
        )
        done = await Admin(before).reembed(name, new, batch_size=8)  # type: ignore[arg-type]
        assert (done.embedded, done.total, done.switched) == (1, 31, True)
        assert (done.model, done.dimensions) == ("test-bag@12", 12)

        # The old process is refused once it reads the catalogue again.
        monkeypatch.setattr(catalogue, "RECHECK_S", 0.0)
        with pytest.raises(CollectionError, match="test-bag@12"):
            await _top(before, name, users[0], "tea")

    async with owner_engine.connect() as conn:  # type: ignore[attr-defined]
        rows = (
            await conn.execute(
                text(
                    "SELECT embedding_model, vector_dims(embedding) AS d, "
                    "embedding_next IS NULL AS clear FROM pgmemory_memories "
                    "WHERE collection = :c"
                ),
                {"c": name},
            )
        ).all()
        entry = (
            await conn.execute(
                text(
                    "SELECT dimensions, embedding_model, next_embedding_model "
                    "FROM pgmemory_collections WHERE name = :c"
                ),
                {"c": name},
            )
        ).one()
    assert len(rows) == 31 and set(rows) == {("test-bag@12", 12, True)}
    assert tuple(entry) == (12, "test-bag@12", None)

    async with MemoryStore(store_url, embedder=Bag(12)) as after:  # type: ignore[arg-type]
        query = _texts(1)[0]  # one memory's own text ranks first under either model
        for user in users:
            assert (await _top(after, name, user, query))[0] == query
        # A memory the old model wrote after the switch (a process not restarted yet) is
        # re-embedded by the next run.
        async with owner_engine.begin() as conn:  # type: ignore[attr-defined]
            await conn.execute(
                text("UPDATE pgmemory_memories SET embedding_model = 'test-bag@8' "
                     "WHERE collection = :c AND content = 'cake in lyon'"),
                {"c": name},
            )  # fmt: skip
        again = await Admin(after).reembed(name, Bag(12))  # type: ignore[arg-type]
        assert (again.embedded, again.switched) == (1, True)


async def test_restart_drops_what_another_model_staged(store_url: str) -> None:
    users = [unique("u")]
    name, old = await _seed(store_url, users, 6)
    async with MemoryStore(store_url, embedder=old) as store:  # type: ignore[arg-type]
        await Admin(store).reembed(name, Bag(12), switch=False)  # type: ignore[arg-type]
        other = Bag(16)
        done = await Admin(store).reembed(name, other, restart=True)  # type: ignore[arg-type]
        assert (done.embedded, done.dimensions, done.switched) == (6, 16, True)
    async with MemoryStore(store_url, embedder=Bag(16)) as store:  # type: ignore[arg-type]
        assert len(await _top(store, name, users[0], "tea")) == 3


async def test_unknown_collection_and_bad_batch(store: MemoryStore) -> None:
    with pytest.raises(CollectionError, match="unknown collection"):
        await Admin(store).reembed("c_nope_" + unique("x").replace("-", "_"), Bag(4))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        await Admin(store).reembed("c", Bag(4), batch_size=0)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_the_cli_reembeds_with_progress_and_json(store_url: str) -> None:
    """``pgmemory db reembed C --embedder minilm --json``: the local MiniLM model."""
    users = [unique("u")]
    name, _ = await _seed(store_url, users, 5)
    env = {**os.environ, "PGMEMORY_DATABASE_URL": store_url}
    done = subprocess.run(
        [sys.executable, "-m", "pgmemory", "db", "reembed", name, "--embedder", "minilm",
         "--batch-size", "2", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["collection"] == name and report["switched"] is True
    assert report["embedded"] == 5 and report["dimensions"] == 384
    assert "5/5" in done.stderr  # progress, on stderr


async def test_a_switch_never_swaps_in_vectors_of_a_run_that_was_replaced(
    store_url: str, owner_engine: object
) -> None:
    """Run B staged, then a run for C restarted over it: B's switch (racing C's run) is refused
    and swaps nothing in."""
    from pgmemory.admin import reembedding

    users = [unique("u")]
    name, old = await _seed(store_url, users, 4)
    async with MemoryStore(store_url, embedder=old) as store:  # type: ignore[arg-type]
        await Admin(store).reembed(name, Bag(12), switch=False)  # type: ignore[arg-type]
        await Admin(store).reembed(name, Bag(16), switch=False, restart=True)  # type: ignore[arg-type]
        params = {"collection": name, "model": "test-bag@12", "dimensions": 12}
        with pytest.raises(CollectionError, match="another run"):
            await reembedding._switch(store.database, Bag(12), params, batch_size=8)  # type: ignore[arg-type]
    async with owner_engine.connect() as conn:  # type: ignore[attr-defined]
        models = (
            (
                await conn.execute(
                    text(
                        "SELECT DISTINCT embedding_model FROM pgmemory_memories WHERE collection = :c"
                    ),
                    {"c": name},
                )
            )
            .scalars()
            .all()
        )
    assert models == ["test-bag@8"]
