"""The approximate path: index scans (HNSW or IVFFlat) for the vector searches of large user scopes.

Exact search reads every row of a scope; past some ten thousand rows an approximate index
answers in a fraction of the time. Two kinds are offered (``method``): HNSW (a graph: the best
recall per row read, but slow to build, ~12 minutes for 1M rows of 384 d on 2 cores) and
IVFFlat (the rows clustered into lists around k-means centres: built in well under a minute
for the same rows; a search reads the ``probes`` lists nearest the query). Which one keeps
recall on a collection's data is for the probe to say. A collection gets the path only on
request (:meth:`AnnPaths.enable`),
and keeps it only while a recall probe, which compares index and exact answers on the
collection's own stored vectors, measures recall@10 at or above the floor (probed again
beside the searches, at most once a minute: :mod:`pgmemory.store.probing`). Then a search takes
the path when its scope is exactly one user whose memories numbered more than
``min_scope_rows`` at the last probe; every other search stays exact. The choice lives in the
process (in the store object), not in the database.

What stays exact, because a filter would thin the index's candidates below what the probe
measured: rows without a user (``user_id`` ``''``: they are no user scope, and the probe
ignores them), user scopes holding any memory with an ``expires_at`` (at the last probe), and
searches with a ``since``/``until`` window (see :func:`pgmemory.store.reads.search`). A probe
or a search on the path that fails turns into the exact path, logged without user data: the
approximate path never makes a search fail.

The index's DDL is made by PostgreSQL itself (``format()`` quotes the index name and the
collection literal) and runs through the driver without any parameters, so a collection name
such as ``100%`` or ``%(name)s`` is just text. On a memories table hash-partitioned by user
(:mod:`pgmemory.admin.partitioning`) the concurrent build is impossible, so :meth:`AnnPaths.enable`
refuses it with an error saying so.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from pgmemory.errors import DatabaseNotReadyError, InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.catalogue import Catalogue
from pgmemory.store.probing import Beside, due, sample_largest
from pgmemory.store.records import AnnStatus, MemoryHit, MemoryScope
from pgmemory.store.validation import check_choice, check_limit, check_number

logger = logging.getLogger(__name__)

#: Defaults of the approximate path. Measured on a 19k-row scope at 384 d (bench/scale.py):
#: exact ~50 ms; HNSW with iterative scan ~5 ms at ef_search 200, ~7 ms at 400. The probe
#: (recall@10 on stored vectors) gave 0.98 at 200, below the floor, so the default is 400.
ANN_MIN_SCOPE_ROWS = 10_000
ANN_EF_SEARCH = 400
ANN_RECALL_FLOOR = 0.99
#: Searches of a collection between two recall probes (each also refreshes which scopes are
#: large), which are also at least probing.PROBE_INTERVAL_S apart.
ANN_PROBE_EVERY = 1_000
#: Scope rows a probe's exact searches may read in all (about 2 s at 1 µs a row): a
#: collection whose large scopes are huge is probed on fewer of its stored rows. On
#: bench/store/scale.py's 1M rows a probe reads about 420k (a row of each of its 11 huge scopes).
ANN_PROBE_ROWS = 2_000_000
#: Stored rows a probe searches both ways, and the hits it compares for each.
ANN_PROBE_SAMPLES = 20
ANN_PROBE_LIMIT = 10
#: The kinds of approximate index (PostgreSQL access methods of pgvector).
ANN_METHODS = ("hnsw", "ivfflat")


def ivfflat_lists(rows: int) -> int:
    """An IVFFlat index's default number of lists for a collection of ``rows`` rows:
    pgvector's rule of thumb, rows / 1000 up to 1M rows and their square root beyond
    (at least 1). On ``bench/store/scale.py``'s 1M rows, 1,000 lists read 8-16 lists a
    search at recall@3 0.99-1.0 (docs/performance.md)."""
    if rows > 1_000_000:
        return max(1, math.isqrt(rows))
    return max(1, rows // 1_000)


def ivfflat_probes(lists: int) -> int:
    """An IVFFlat search's default lists read first: half the square root of ``lists``,
    rounded up (16 of 1,000), at least 1."""
    return max(1, math.ceil(math.sqrt(lists) / 2))


@dataclass(kw_only=True)
class AnnPath:
    """A collection's approximate path in this process, and what its last probe found."""

    ef_search: int
    recall_floor: float
    min_scope_rows: int
    #: The index's kind (:data:`ANN_METHODS`).
    method: str = "hnsw"
    #: IVFFlat: the lists a search reads first (None for HNSW).
    probes: int | None = None
    recall: float | None = None
    probed_scopes: int = 0
    searches: int = 0
    #: When the last probe began (``time.monotonic()``).
    probed_at: float = 0.0
    #: Users whose scope exceeded min_scope_rows at the last probe.
    large_users: frozenset[str] = frozenset()

    @property
    def enabled(self) -> bool:
        """Whether the last probe measured recall at or above the floor."""
        return self.recall is not None and self.recall >= self.recall_floor

    def status(self, collection: str) -> AnnStatus:
        """The path as the public :class:`AnnStatus`."""
        return AnnStatus(
            collection=collection,
            enabled=self.enabled,
            recall=self.recall,
            recall_floor=self.recall_floor,
            min_scope_rows=self.min_scope_rows,
            ef_search=self.ef_search,
            probed_scopes=self.probed_scopes,
            method=self.method,
            probes=self.probes,
        )

    def settings(self) -> tuple[str, dict[str, Any]]:
        """The statement (and its parameters) that sets a transaction up for this path."""
        if self.method == "ivfflat":
            return q.ANN_IVFFLAT_SETTINGS, {"probes": self.probes}
        return q.ANN_SETTINGS, {"ef_search": self.ef_search}


class PathSearch(Protocol):
    """An unaudited vector search forced onto ``path`` (exact when None): what probes compare."""

    async def __call__(
        self, collection: str, scope: MemoryScope, vector: Any, limit: int, path: AnnPath | None
    ) -> list[MemoryHit]: ...


class AnnPaths:
    """The approximate paths of one store's collections.

    Args:
        db: The database.
        catalogue: The collections.
        search: Runs a search on a given path (the probe's exact and approximate searches).
        beside: Where probes that searches make due run (the store's).
    """

    def __init__(
        self, db: Database, catalogue: Catalogue, search: PathSearch, *, beside: Beside
    ) -> None:
        self._db = db
        self._catalogue = catalogue
        self._search = search
        self._beside = beside
        self._paths: dict[str, AnnPath] = {}

    async def enable(
        self,
        collection: str,
        *,
        min_scope_rows: int,
        ef_search: int,
        recall_floor: float,
        m: int,
        ef_construction: int,
        maintenance_work_mem: str | None,
        method: str = "hnsw",
        lists: int | None = None,
        probes: int | None = None,
    ) -> AnnStatus:
        """Build the collection's index of kind ``method`` if it is missing (or invalid, or of
        the other kind), then probe it.

        An index of the requested kind already built is kept as it was built (drop it with
        ``disable(collection, drop_index=True)`` to build it anew, e.g. after the collection
        grew much: an IVFFlat index's lists are k-means centres of the rows stored when it was
        built). IVFFlat's ``lists`` default to :func:`ivfflat_lists` of the collection's rows,
        its ``probes`` to :func:`ivfflat_probes` of the lists; a search reads more lists while
        too few of their rows pass the scope filter (iterative scan). On Citus every shard
        builds the index over its own rows, with the collection's number of lists."""
        info = await self._catalogue.get(collection)
        check_choice(method, what="method", choices=ANN_METHODS)
        check_limit(ef_search, what="ef_search", maximum=1_000)
        check_limit(min_scope_rows, what="min_scope_rows", maximum=100_000_000)
        check_number(recall_floor, what="recall_floor", low=0.0, high=1.0)
        if lists is not None:
            check_limit(lists, what="lists", maximum=32_768)  # pgvector's own maximum
        if probes is not None:
            check_limit(probes, what="probes", maximum=32_768)
        params = {
            "collection": collection,
            "dimensions": info.dimensions,
            "m": check_limit(m, what="m", maximum=100),
            "ef_construction": check_limit(ef_construction, what="ef_construction", maximum=1_000),
        }
        async with self._db.ddl() as conn:
            state = (await conn.execute(clause(q.ANN_INDEX_STATE), params)).first()
            valid, built = state if state is not None else (None, None)
            if valid is False or (built is not None and built != method):
                # A failed concurrent build leaves an invalid index behind; an index of the
                # other kind is replaced.
                drop = (await conn.execute(clause(q.ANN_DROP_DDL), params)).scalar_one()
                await _run_ddl(conn, drop)
                valid = None
            if method == "ivfflat":
                if lists is None:
                    rows = (await conn.execute(clause(q.ANN_COLLECTION_ROWS), params)).scalar_one()
                    lists = ivfflat_lists(rows)
                params["lists"] = lists
                probes = min(probes or ivfflat_probes(lists), lists)
            else:
                probes = None
            if not valid and (await conn.execute(clause(q.MEMORIES_RELKIND))).scalar() == "p":
                raise DatabaseNotReadyError(
                    f"the approximate path of collection {collection!r} needs its index "
                    "built with CREATE INDEX CONCURRENTLY, which PostgreSQL refuses on the "
                    "partitioned pgmemory_memories table (pgmemory db partition); nothing was "
                    "changed. Leave the path off (searches stay exact over the user's one "
                    "partition), or use an unpartitioned database for enable_ann"
                )
            if not valid:
                make = q.ANN_IVFFLAT_DDL if method == "ivfflat" else q.ANN_INDEX_DDL
                ddl = (await conn.execute(clause(make), params)).scalar_one()
                await conn.execute(
                    clause(q.MAINTENANCE_SETTINGS), {"maintenance_work_mem": maintenance_work_mem}
                )
                try:
                    await _run_ddl(conn, ddl)
                finally:
                    await conn.execute(clause(q.MAINTENANCE_RESET))
        self._paths[collection] = AnnPath(
            ef_search=ef_search,
            recall_floor=recall_floor,
            min_scope_rows=min_scope_rows,
            method=method,
            probes=probes,
        )
        return await self.probe(collection, samples=ANN_PROBE_SAMPLES, limit=ANN_PROBE_LIMIT)

    async def disable(self, collection: str, *, drop_index: bool) -> None:
        """Search every scope of the collection exactly again (optionally drop the index)."""
        self._paths.pop(collection, None)
        if drop_index:
            async with self._db.ddl() as conn:
                ddl = (
                    await conn.execute(clause(q.ANN_DROP_DDL), {"collection": collection})
                ).scalar_one()
                await _run_ddl(conn, ddl)

    async def probe(self, collection: str, *, samples: int, limit: int) -> AnnStatus:
        """Measure the path's recall@``limit`` against exact search, and decide.

        Only user scopes are probed (rows without a user are no scope of their own), and only
        those without expiring memories (the only ones the path serves). A probe that fails
        leaves the path off (exact), logged without user data.

        Raises:
            InvalidInputError: The collection has no approximate path, or a bad argument.
        """
        path = self._paths.get(collection)
        if path is None:
            raise InvalidInputError(
                f"collection {collection!r} has no approximate path: call enable_ann() first"
            )
        check_limit(samples, what="samples", maximum=1_000)
        check_limit(limit, maximum=1_000)
        path.searches = 0
        path.probed_at = time.monotonic()
        try:
            await self._measure(collection, path, samples=samples, limit=limit)
        except Exception as exc:
            path.recall = None
            path.probed_scopes = 0
            logger.warning(
                "recall probe of %s failed (%s): its searches stay exact",
                collection,
                type(exc).__name__,
            )
        status = path.status(collection)
        logger.info(
            "approximate path of %s: recall %s over %d scopes -> %s",
            collection,
            "n/a" if status.recall is None else f"{status.recall:.3f}",
            status.probed_scopes,
            "on" if status.enabled else "off (exact)",
        )
        return status

    async def _measure(self, collection: str, path: AnnPath, *, samples: int, limit: int) -> None:
        """Refresh the large scopes and measure recall on their stored vectors (see probe)."""
        params = {"collection": collection, "min_rows": path.min_scope_rows}
        async with self._db.ddl() as conn:
            result = await conn.execute(clause(q.ANN_LARGE_USERS), params)
            sizes = {str(user_id): int(memories) for user_id, memories in result}
            rows = await sample_largest(
                conn, collection, sizes, samples=samples, max_rows=ANN_PROBE_ROWS
            )
        large_users = frozenset(sizes)
        found = total = 0
        for user_id, _, embedding in rows:
            scope = MemoryScope(user_id=user_id)
            exact = await self._search(collection, scope, embedding, limit, None)
            approx = await self._search(collection, scope, embedding, limit, path)
            found += len({h.memory.id for h in approx} & {h.memory.id for h in exact})
            total += len(exact)
        path.large_users = large_users
        path.recall = found / total if total else None
        path.probed_scopes = len({user_id for user_id, _, _ in rows})

    async def route(self, collection: str, scope: MemoryScope) -> AnnPath | None:
        """The path a vector search of ``scope`` should take: the approximate one, or None (exact).

        Counts the search; when the path is due for a probe again (:func:`probing.due
        <pgmemory.store.probing.due>`: ANN_PROBE_EVERY searches and a minute), starts one
        beside the searches, and answers with the last probe's decision meanwhile. Never
        raises: a failing probe leaves the path off.
        """
        path = self._paths.get(collection)
        if path is None:
            return None
        path.searches += 1
        if due(path.searches, ANN_PROBE_EVERY, path.probed_at):
            self._beside.start(
                f"ann {collection}",
                lambda: self.probe(collection, samples=ANN_PROBE_SAMPLES, limit=ANN_PROBE_LIMIT),
            )
        if not path.enabled:
            return None
        large = set(scope.as_dict()) == {"user_id"} and scope.user_id in path.large_users
        return path if large else None


async def _run_ddl(conn: AsyncConnection, ddl: str) -> None:
    """Run DDL text as it is: through psycopg with no parameters, so no ``%`` in it (e.g. in a
    quoted collection name) is taken for a placeholder. ``conn`` is in autocommit."""
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    assert driver is not None
    await driver.execute(ddl)
