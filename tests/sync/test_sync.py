"""SyncMemoryStore: the async store's methods, blocking, shared by many threads at once."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
import threading
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from pgmemory import MemoryRecord, MemoryScope, _sync_gen
from pgmemory.embedders import CachedEmbedder
from pgmemory.errors import CollectionError
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore
from pgmemory.sync import SyncMemoryStore

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
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
    # Every generated method has the async method's signature, annotations (as written) included.
    for name, method in inspect.getmembers(MemoryStore, inspect.iscoroutinefunction):
        if name.startswith("_") or name in {"open", "close"}:
            continue
        assert inspect.signature(getattr(SyncMemoryStore, name)) == inspect.signature(method), name
        assert getattr(SyncMemoryStore, name).__doc__.startswith(
            f"Blocking :meth:`MemoryStore.{name}`"
        )


def test_same_attributes_as_the_async_store() -> None:
    """Properties and plain attributes are typed properties of the sync store (no __getattr__)."""
    store = MemoryStore("postgresql://nobody@localhost:1/none")  # never opened
    attributes = {n for n in vars(store) if not n.startswith("_")}
    attributes |= {n for n, v in vars(MemoryStore).items() if isinstance(v, property)}
    attributes = {n for n in attributes if not n.startswith("_")}
    assert attributes == {"url", "database", "engine", "embedder", "settings"}
    for name in attributes:
        assert isinstance(inspect.getattr_static(SyncMemoryStore, name), property), name


def test_generated_methods_are_up_to_date() -> None:
    """pgmemory/sync_generated.py is what the generator writes from today's MemoryStore."""
    expected = _sync_gen.render()
    current = _sync_gen.OUTPUT.read_text(encoding="utf-8")
    assert current == expected, (
        f"{_sync_gen.OUTPUT.name} is out of date with the async classes: run "
        f"`{_sync_gen.COMMAND}` and commit the result"
    )


_TYPED_SNIPPET = """
from pgmemory import MemoryHit, MemoryScope
from pgmemory.sync import SyncMemoryStore

def use(store: SyncMemoryStore) -> None:
    hits: list[MemoryHit] = store.search("chat", MemoryScope(user_id="a"), query="food")
    reveal_type(store.search("chat", MemoryScope(user_id="a"), query="food"))
    reveal_type(store.url)
    wrong: str = store.count("chat", MemoryScope(user_id="a"))
    store.search("chat", MemoryScope(user_id="a"), limt=3)
"""


def test_mypy_sees_the_methods(tmp_path: Path) -> None:
    """A type checker sees the blocking methods with their signatures and return types.

    mypy's incremental cache (``.mypy_cache``, shared with ``make lint``) makes this about a
    second; with a cold cache it analyses the package once (about 13 s).
    """
    mypy_api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "uses_sync.py"
    snippet.write_text(_TYPED_SNIPPET)
    config = str(ROOT / "pyproject.toml")
    stdout, stderr, _ = mypy_api.run(["--config-file", config, "--no-error-summary", str(snippet)])
    said: dict[int, str] = {}  # snippet line -> what mypy said about it
    for line in stdout.splitlines():
        # By file name: mypy may replay a cached report made under an earlier tmp_path.
        if line.split(":", 1)[0].endswith(f"/{snippet.name}"):
            number, message = line.split(":", 1)[1].split(": ", 1)
            said[int(number)] = said.get(int(number), "") + message
    assert set(said) == {7, 8, 9, 10}, stdout + stderr
    # Lines 6 and 7 of the snippet: search returns list[MemoryHit].
    assert re.fullmatch(
        r'note: Revealed type is "(builtins\.)?list\[pgmemory\.store\.records\.MemoryHit\]"',
        said[7],
    )
    assert re.fullmatch(r'note: Revealed type is "(builtins\.)?str"', said[8])
    # Line 9: count returns int, not str; line 10: search has no parameter "limt".
    assert said[9].startswith('error: Incompatible types in assignment (expression has type "int"')
    assert said[10].startswith('error: Unexpected keyword argument "limt" for "search"')


_ADMIN = '''
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

LIMIT = 50


class Admin:
    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    @property
    def prefix(self) -> str:
        """The prefix."""
        return self._prefix

    async def users(
        self, after: str = "", /, *names: str, limit: int = LIMIT, **extra: object
    ) -> Sequence[str]:
        """Users after one."""
        return [self._prefix, after, *names, str(limit), *sorted(extra)]
'''


class _RunPortal:
    def run(self, awaitable: Awaitable[T], /) -> T:
        async def wait() -> T:
            return await awaitable

        return asyncio.run(wait())


def test_the_generator_serves_any_async_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Target line gives another async class (say pgmemory.admin.Admin) its blocking twin:
    positional-only, variadic and keyword parameters, defaults naming module constants."""
    module = f"sync_fixture_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(_ADMIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    target = _sync_gen.Target(module, "Admin", "SyncAdmin", attribute="async_admin")
    code = _sync_gen.render([target])
    assert f"from {module} import LIMIT\n" in code  # a default is evaluated at run time
    namespace: dict[str, Any] = {}
    exec(compile(code, "generated", "exec"), namespace)
    methods = namespace["SyncAdminMethods"]
    admin = methods()
    admin._portal = _RunPortal()
    admin.async_admin = importlib.import_module(module).Admin("p")
    assert admin.prefix == "p"
    assert admin.users() == ["p", "", "50"]
    assert admin.users("a", "b", "c", limit=2, z=1) == ["p", "a", "b", "c", "2", "z"]
    assert str(inspect.signature(methods.users)) == (
        "(self, after: 'str' = '', /, *names: 'str', limit: 'int' = 50, **extra: 'object') "
        "-> 'Sequence[str]'"
    )


def test_the_generator_refuses_a_method_it_cannot_make_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"sync_fixture_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        _ADMIN + "\n    def session(self) -> object:\n        return object()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="session is neither a coroutine method nor a property"):
        _sync_gen.generate(module, "Admin", "SyncAdmin")
    assert (
        "session"
        not in _sync_gen.generate(module, "Admin", "SyncAdmin", hand_written=["session"]).source
    )


@pytest.mark.slow
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
