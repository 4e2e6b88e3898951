"""SyncMemoryStore: the async store's methods, blocking, shared by many threads at once."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

from pgmemory import MemoryRecord, MemoryScope
from pgmemory.embedders import CachedEmbedder
from pgmemory.errors import CollectionError
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore
from pgmemory.sync import SyncMemoryStore

THREADS = 16
CALLS = 300


def _vector(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(16)
    return (v / np.linalg.norm(v)).tolist()


def test_same_methods_as_the_async_store() -> None:
    public = {
        name
        for name in dir(MemoryStore)
        if not name.startswith("_") and callable(getattr(MemoryStore, name))
    }
    missing = {name for name in public if not callable(getattr(SyncMemoryStore, name, None))}
    assert not missing
    # Signatures and docstrings are the async store's own.
    assert SyncMemoryStore.search.__doc__ == MemoryStore.search.__doc__


def test_sixteen_threads_share_one_store(database_url: str, embedder: CachedEmbedder) -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    collection = f"sync_{uuid.uuid4().hex[:8]}"
    failures: list[BaseException] = []
    written: dict[int, int] = {}
    start = threading.Barrier(THREADS)

    with SyncMemoryStore(database_url, settings=settings, embedder=embedder) as store:
        store.create_collection(collection, dimensions=16, embedding_model="test@16")

        def worker(n: int) -> None:
            rng = np.random.default_rng(n)
            scope = MemoryScope(user_id=f"user-{n}")
            added = 0
            start.wait()
            for i in range(CALLS):
                try:
                    kind = i % 3
                    if kind == 0:
                        store.add(
                            collection,
                            [
                                MemoryRecord(
                                    content=f"note {i}", scope=scope, embedding=_vector(rng)
                                )
                            ],
                        )
                        added += 1
                    elif kind == 1:
                        hits = store.search(collection, scope, vector=_vector(rng), limit=3)
                        assert all(h.memory.scope.user_id == scope.user_id for h in hits)
                    else:
                        assert store.count(collection, scope) >= added
                except BaseException as exc:
                    failures.append(exc)
            written[n] = added

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        assert failures == []
        assert len(written) == THREADS
        for n, added in written.items():
            assert store.count(collection, MemoryScope(user_id=f"user-{n}")) == added == CALLS // 3
        # Errors cross the thread boundary as themselves.
        with pytest.raises(CollectionError):
            store.get_collection("no_such_collection")
    # Closed: the background loop is gone, and closing again is harmless.
    assert store.loop.is_closed()
    store.close()


def test_open_close_without_context_manager(database_url: str, embedder: CachedEmbedder) -> None:
    store = SyncMemoryStore(database_url, settings=Settings(_env_file=None), embedder=embedder)  # type: ignore[call-arg]
    assert store.open() is store
    try:
        assert store.url == database_url or store.url.endswith(database_url.rsplit("/", 1)[1])
        assert isinstance(store.list_collections(), list)
    finally:
        store.close()
