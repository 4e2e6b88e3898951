"""``MemoryStore``: the async PostgreSQL store under every memory provider."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from dataclasses import dataclass

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from pgmemory.embedders.base import Embedder
from pgmemory.errors import CollectionError, InvalidInputError, ScopeError
from pgmemory.settings import Settings
from pgmemory.store import migrate as migrations
from pgmemory.store import queries as q
from pgmemory.text import terms
from pgmemory.vocabulary import ROLES, SOURCE_TYPES
from pgmemory.store.connector import VectorList, check_database, make_engine
from pgmemory.store.embedded import EmbeddedServer
from pgmemory.store.models import COVERING_MAX_DIMENSIONS
from pgmemory.store.records import (
    AnnStatus,
    CollectionInfo,
    HistoryRow,
    Memory,
    MemoryHit,
    MemoryRecord,
    MemoryScope,
    RecallTrace,
    SearchWeights,
)
from pgmemory.store.uuid7 import uuid7
from pgmemory.store.validation import (
    check_choice,
    check_dimensions,
    check_limit,
    check_metadata,
    check_name,
    check_optional_name,
    check_score,
    check_text,
    check_vector,
    sha256_hex,
)

logger = logging.getLogger(__name__)

#: Rows per INSERT statement: each chunk is one statement with 16 array parameters, far below
#: PostgreSQL's 65,535 bind parameters, and keeps a statement's payload around a few MB.
INSERT_CHUNK_ROWS = 1_000
#: Defaults of the approximate path. Measured on a 19k-row scope at 384 d (bench/scale.py):
#: exact ~50 ms; HNSW with iterative scan ~5 ms at ef_search 200, ~7 ms at 400. The probe
#: (recall@10 on stored vectors) gave 0.98 at 200, below the floor, so the default is 400.
ANN_MIN_SCOPE_ROWS = 10_000
ANN_EF_SEARCH = 400
ANN_RECALL_FLOOR = 0.99
#: Searches of a collection between two recall probes (each also refreshes which scopes are large).
ANN_PROBE_EVERY = 1_000
#: Earliest and latest instants PostgreSQL and Python both represent (open time bounds).
_DISTANT_PAST = datetime(1, 1, 2, tzinfo=UTC)
_DISTANT_FUTURE = datetime(9999, 12, 30, tzinfo=UTC)


class MemoryStore:
    """Scoped memories, their audit trail and chat history in PostgreSQL + pgvector.

    Use it as an async context manager::

        async with MemoryStore(migrate=True) as store:
            await store.create_collection("chat")
            await store.add("chat", [MemoryRecord(content="I can't eat spicy food",
                                                  scope=MemoryScope(user_id="alice"))])
            hits = await store.search("chat", MemoryScope(user_id="alice"), query="order food")

    With no URL (argument or ``PGMEMORY_DATABASE_URL``) it starts, or reuses, the embedded
    PostgreSQL server under ``Settings.data_dir``. ``embedder`` embeds texts passed without a
    vector (default: :func:`pgmemory.make_embedder` of the settings, built on first use).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        embedder: Embedder | None = None,
        migrate: bool = False,
    ) -> None:
        self.settings = settings or Settings()
        if url is None and self.settings.database_url is not None:
            url = self.settings.database_url.get_secret_value()
        self._url = url
        #: The URL in use once open (the embedded server's when no URL was given).
        self._resolved_url: str | None = url
        self._embedder = embedder
        self._migrate = migrate
        self._server: EmbeddedServer | None = None
        self._engine: AsyncEngine | None = None
        self._collections: dict[str, CollectionInfo] = {}
        #: collection -> its approximate path (in this process; see enable_ann)
        self._ann: dict[str, _AnnPath] = {}

    # --- life cycle ------------------------------------------------------------------------

    async def open(self) -> MemoryStore:
        """Connect (starting the embedded server if needed), optionally migrate, then check."""
        if self._engine is not None:
            return self
        url = self._url
        if url is None:
            self._server = EmbeddedServer(self.settings.data_dir)
            url = await asyncio.to_thread(self._server.start)
        self._resolved_url = url
        try:
            if self._migrate:
                await asyncio.to_thread(migrations.upgrade, url)
            self._engine = make_engine(url, self.settings)
            await check_database(self._engine, expected_revision=migrations.head_revision())
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """Close the pool; release the embedded server (stopped when no process uses it)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.dispose()
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.stop)

    async def __aenter__(self) -> MemoryStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def migrate(self) -> None:
        """Upgrade the schema to this version's head (needs the store to know its URL)."""
        if self._resolved_url is None:
            raise RuntimeError("open the store first (the embedded server's URL is known then)")
        await asyncio.to_thread(migrations.upgrade, self._resolved_url)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL in use (password included: don't log it)."""
        if self._resolved_url is None:
            raise RuntimeError("the store is not open yet: its embedded server has no URL")
        return self._resolved_url

    @property
    def engine(self) -> AsyncEngine:
        """The pooled async engine (for advanced use and tests)."""
        if self._engine is None:
            raise RuntimeError("the store is not open: use `async with MemoryStore(...)`")
        return self._engine

    @contextlib.asynccontextmanager
    async def _reading(self) -> AsyncIterator[AsyncConnection]:
        """A connection for one read-only statement, in autocommit: no BEGIN/COMMIT round trips
        (and no ROLLBACK, after which psycopg would drop its prepared statements)."""
        async with self.engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    @property
    def embedder(self) -> Embedder:
        """The embedder used for texts given without a vector (built on first use)."""
        if self._embedder is None:
            from pgmemory.embedders import make_embedder

            self._embedder = make_embedder(self.settings)
        return self._embedder

    # --- collections -----------------------------------------------------------------------

    async def create_collection(
        self, name: str, *, dimensions: int | None = None, embedding_model: str | None = None
    ) -> CollectionInfo:
        """Create a collection, or return it if it exists with the same size and model.

        Size and model default to the store's embedder. An existing collection with another
        size or model is an error: vectors of different models are not comparable.
        """
        check_name(name, what="collection name")
        if dimensions is None or embedding_model is None:
            dimensions = dimensions if dimensions is not None else self.embedder.dimensions
            embedding_model = embedding_model or self.embedder.model_id
        check_dimensions(dimensions)
        check_name(embedding_model, what="embedding_model")
        async with self.engine.begin() as conn:
            await conn.execute(
                text(q.INSERT_COLLECTION),
                {"name": name, "dimensions": dimensions, "embedding_model": embedding_model},
            )
        info = await self.get_collection(name)
        if info.dimensions != dimensions or info.embedding_model != embedding_model:
            raise CollectionError(
                f"collection {name!r} exists with {info.dimensions} dimensions from model "
                f"{info.embedding_model!r}; asked for {dimensions} from {embedding_model!r}. "
                "Use another collection name for another model."
            )
        return info

    async def get_collection(self, name: str) -> CollectionInfo:
        """A collection's catalogue entry; :class:`CollectionError` if it does not exist."""
        cached = self._collections.get(name)
        if cached is not None:
            return cached
        async with self._reading() as conn:
            row = (await conn.execute(text(q.GET_COLLECTION), {"name": name})).mappings().first()
        if row is None:
            raise CollectionError(
                f"unknown collection {name!r}: create it first with "
                f"`await store.create_collection({name!r})`"
            )
        info = CollectionInfo(**row)
        self._collections[name] = info
        return info

    async def list_collections(self) -> list[CollectionInfo]:
        """Every collection in the catalogue."""
        async with self._reading() as conn:
            rows = (await conn.execute(text(q.LIST_COLLECTIONS))).mappings().all()
        return [CollectionInfo(**row) for row in rows]

    async def drop_collection(self, name: str, *, actor: str | None = None) -> int:
        """Delete a collection and all its memories (audited); returns memories deleted."""
        await self.get_collection(name)
        async with self.engine.begin() as conn:
            deleted = await conn.execute(
                text(q.delete_scope(())), {"collection": name, "actor": actor or ""}
            )
            count = len(deleted.all())
            await conn.execute(text(q.DELETE_COLLECTION), {"name": name})
        self._collections.pop(name, None)
        return count

    # --- writes ----------------------------------------------------------------------------

    async def add(
        self,
        collection: str,
        records: Sequence[MemoryRecord],
        *,
        actor: str | None = None,
        allow_unscoped: bool = False,
    ) -> list[uuid.UUID]:
        """Store a batch in ONE transaction (all rows or none); returns the new ids in order.

        Every record is checked, and texts without a vector embedded, before any SQL runs.
        Each row's insert is written to the audit table in the same statement. A record whose
        ``message_id`` the collection already holds in the same scope is skipped (a re-sent
        message is stored once), so the ids returned can be fewer than the records.
        """
        rows = await self._prepare(collection, records, actor=actor, allow_unscoped=allow_unscoped)
        if not rows["ids"]:
            return []
        info = await self.get_collection(collection)
        stored: set[uuid.UUID] = set()
        async with self.engine.begin() as conn:
            for start in range(0, len(rows["ids"]), INSERT_CHUNK_ROWS):
                chunk = {k: v[start : start + INSERT_CHUNK_ROWS] for k, v in rows.items()}
                chunk["embeddings"] = VectorList(chunk["embeddings"])
                result = await conn.execute(
                    text(q.INSERT_MEMORIES),
                    {
                        **chunk,
                        "collection": collection,
                        "embedding_model": info.embedding_model,
                        "actor": actor or "",
                    },
                )
                stored.update(result.scalars())
        logger.info("stored %d memories in collection %s", len(stored), collection)
        return [i for i in rows["ids"] if i in stored]

    async def import_records(
        self,
        collection: str,
        records: Iterable[MemoryRecord],
        *,
        actor: str | None = None,
        batch_rows: int = 10_000,
        progress: bool = False,
        allow_unscoped: bool = False,
    ) -> int:
        """Bulk-load records with binary COPY, all in ONE transaction; returns rows stored.

        Faster than :meth:`add` for large loads (no per-row parameter handling). Rows go through
        a temporary staging table so that every row is still audited; nothing is visible, and
        nothing stays, unless the whole import succeeds. Messages already stored (same
        ``message_id`` and scope) are skipped, as in :meth:`add`. The import is not bound by
        ``statement_timeout_ms`` (moving a million staged rows takes minutes).
        """
        from tqdm.auto import tqdm

        info = await self.get_collection(collection)
        total = 0
        bar = tqdm(desc=f"import {collection}", unit="rows", disable=not progress)
        async with self.engine.begin() as conn:
            await conn.execute(text(q.NO_STATEMENT_TIMEOUT))
            await conn.execute(text(q.CREATE_STAGING))
            cursor = (await _driver_connection(conn)).cursor()
            batch: list[MemoryRecord] = []

            async def flush() -> None:
                nonlocal total
                rows = await self._prepare(
                    collection, batch, actor=actor, allow_unscoped=allow_unscoped
                )
                async with cursor.copy(q.COPY_STAGING) as copy:
                    copy.set_types(list(q.STAGING_TYPES))
                    for i in range(len(rows["ids"])):
                        await copy.write_row(
                            [rows[_STAGING_SOURCE[c]][i] for c in q.STAGING_COLUMNS]
                        )
                total += len(rows["ids"])
                bar.update(len(rows["ids"]))
                batch.clear()

            for record in records:
                batch.append(record)
                if len(batch) >= batch_rows:
                    await flush()
            if batch:
                await flush()
            result = await conn.execute(
                text(q.INSERT_FROM_STAGING),
                {
                    "collection": collection,
                    "embedding_model": info.embedding_model,
                    "actor": actor or "",
                },
            )
            total = len(result.all())
        bar.close()
        logger.info("imported %d memories into collection %s", total, collection)
        return total

    async def _prepare(
        self,
        collection: str,
        records: Sequence[MemoryRecord],
        *,
        actor: str | None,
        allow_unscoped: bool,
    ) -> dict[str, list[Any]]:
        """Validate a batch and turn it into parallel column lists (embedding missing texts)."""
        info = await self.get_collection(collection)
        check_optional_name(actor, what="actor")
        max_chars = self.settings.max_text_chars
        columns: dict[str, list[Any]] = {name: [] for name in _BATCH_COLUMNS}
        to_embed: list[int] = []
        for i, record in enumerate(records):
            where = f"records[{i}]"
            if not isinstance(record, MemoryRecord):
                raise InvalidInputError(
                    f"{where} is a {type(record).__name__}; pass MemoryRecord objects"
                )
            if not isinstance(record.scope, MemoryScope):
                raise ScopeError(f"{where}.scope must be a MemoryScope, got {record.scope!r}")
            if record.scope.is_empty and not allow_unscoped:
                raise ScopeError(
                    f"{where} has an empty scope: tag it with a user, session, agent or "
                    "application id (or pass allow_unscoped=True to store it for everybody)"
                )
            content = check_text(record.content, what=f"{where}.content", max_chars=max_chars)
            scope = record.scope.column_values()
            columns["ids"].append(uuid7())
            columns["user_ids"].append(scope["user_id"])
            columns["application_ids"].append(scope["application_id"])
            columns["agent_ids"].append(scope["agent_id"])
            columns["session_ids"].append(scope["session_id"])
            columns["roles"].append(check_choice(record.role, what=f"{where}.role", choices=ROLES))
            columns["author_names"].append(
                check_optional_name(record.author_name, what=f"{where}.author_name")
            )
            columns["message_ids"].append(
                check_optional_name(record.message_id, what=f"{where}.message_id")
            )
            columns["source_types"].append(
                check_choice(record.source_type, what=f"{where}.source_type", choices=SOURCE_TYPES)
            )
            columns["source_ids"].append(
                check_optional_name(record.source_id, what=f"{where}.source_id")
            )
            columns["contents"].append(content)
            columns["content_sha256s"].append(sha256_hex(content))
            columns["terms"].append(terms.document(content))
            if record.embedding is None:
                to_embed.append(i)
                columns["embeddings"].append(None)
            else:
                columns["embeddings"].append(
                    check_vector(
                        record.embedding, dimensions=info.dimensions, what=f"{where}.embedding"
                    )
                )
            columns["created_ats"].append(_aware(record.created_at, f"{where}.created_at"))
            columns["expires_ats"].append(_aware(record.expires_at, f"{where}.expires_at"))
            columns["metadatas"].append(
                Jsonb(check_metadata(record.metadata, what=f"{where}.metadata"))
            )
        if to_embed:
            vectors = await self._embed([columns["contents"][i] for i in to_embed], info)
            for i, vector in zip(to_embed, vectors, strict=True):
                columns["embeddings"][i] = check_vector(
                    vector, dimensions=info.dimensions, what=f"records[{i}] embedding"
                )
        return columns

    async def _embed(self, texts: list[str], info: CollectionInfo) -> np.ndarray:
        embedder = self.embedder
        if embedder.model_id != info.embedding_model:
            raise CollectionError(
                f"collection {info.name!r} holds vectors of model {info.embedding_model!r}, but "
                f"the store's embedder is {embedder.model_id!r}: pass a matching embedder to "
                "MemoryStore(embedder=...), or pass vectors yourself"
            )
        return await embedder.embed(texts)

    # --- reads -----------------------------------------------------------------------------

    async def search(
        self,
        collection: str,
        scope: MemoryScope,
        *,
        query: str | None = None,
        vector: Sequence[float] | np.ndarray | None = None,
        limit: int = 3,
        mode: str = "vector",
        weights: SearchWeights | None = None,
        min_score: float | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        allow_unscoped: bool = False,
        audit: bool = True,
        trace: RecallTrace | None = None,
    ) -> list[MemoryHit]:
        """The ``limit`` best memories of the scope for ``query`` (or ``vector``), best first.

        Exact: every live row of the scope is considered (recall@k = 1.0 against brute force).
        ``mode`` picks the ranking: ``"vector"`` (cosine similarity, the ``score``), ``"text"``
        (keyword match ranked by BM25 within the scope) or ``"hybrid"`` (reciprocal-rank fusion of similarity,
        keywords and recency, tuned by ``weights``). ``min_score`` drops hits scoring lower;
        ``since``/``until`` bound ``created_at`` (``since`` inclusive). Unless ``audit=False``,
        the recall is recorded in ``pgmemory_recall_audit`` by the same statement.
        """
        self._check_search_scope(scope, allow_unscoped)
        info = await self.get_collection(collection)
        check_limit(limit)
        check_choice(mode, what="mode", choices=q.SEARCH_MODES)
        weights = weights or SearchWeights()
        if (query is None) == (vector is None):
            raise InvalidInputError("pass exactly one of query= (text) or vector=")
        if query is None and mode != "vector":
            raise InvalidInputError(f"mode={mode!r} matches keywords: pass query= (text)")
        if query is not None:
            check_text(query, what="query", max_chars=self.settings.max_text_chars)
            if mode != "text":
                vector = (await self._embed([query], info))[0]
            query_hash = sha256_hex(query)
        if vector is not None:
            vector = check_vector(vector, dimensions=info.dimensions, what="query vector")
        if query is None:
            query_hash = sha256_hex(vector.tobytes().hex())
        dimensions = tuple(scope.as_dict())
        ann = await self._ann_path(collection, scope) if mode == "vector" else None
        statement = q.search_memories(
            dimensions,
            covering=info.dimensions <= COVERING_MAX_DIMENSIONS,
            audit=audit,
            mode=mode,
            ann_dimensions=info.dimensions if ann is not None else None,
        )
        params: dict[str, Any] = {
            **scope.as_dict(),
            "collection": collection,
            "query": vector,
            "terms": terms.query(query) if query is not None else "",
            "term_list": list(dict.fromkeys(terms.terms(query))) if query is not None else [],
            "pool": max(weights.pool, limit),
            "rrf_k": weights.rrf_k,
            "vector_weight": weights.vector,
            "text_weight": weights.text,
            "recency_weight": weights.recency,
            "limit": limit,
            "ann_candidates": max(4 * limit, 40),
            "min_score": -2.0 if min_score is None else check_score(min_score),
            "since": _aware(since, "since") or _DISTANT_PAST,
            "until": _aware(until, "until") or _DISTANT_FUTURE,
        }
        if audit:
            trace = trace or RecallTrace()
            stored = scope.column_values()
            params.update(
                audit_user_id=stored["user_id"],
                audit_application_id=stored["application_id"],
                audit_agent_id=stored["agent_id"],
                audit_session_id=stored["session_id"],
                provider=trace.provider,
                mode=trace.mode,
                requesting_session_id=trace.session_id,
                query_sha256=query_hash,
                query_text=query if trace.include_query_text else None,
            )
        async with self.engine.begin() if audit or ann else self._reading() as conn:
            if audit:
                await self._relax_audit_commit(conn)
            if ann is not None:
                await conn.execute(text(q.ANN_SETTINGS), {"ef_search": ann.ef_search})
            rows = (await conn.execute(text(statement), params)).mappings().all()
        return [MemoryHit(_memory(row), float(row["score"])) for row in rows]

    async def _relax_audit_commit(self, conn: AsyncConnection) -> None:
        """Unless Settings.durable_recall_audit, don't wait for the audit row's disk flush
        (it costs a few ms per recall; memories themselves always commit synchronously)."""
        if not self.settings.durable_recall_audit:
            await conn.execute(text(q.ASYNC_COMMIT))

    # --- large scopes: the approximate path --------------------------------------------

    async def enable_ann(
        self,
        collection: str,
        *,
        min_scope_rows: int = ANN_MIN_SCOPE_ROWS,
        ef_search: int = ANN_EF_SEARCH,
        recall_floor: float = ANN_RECALL_FLOOR,
        m: int = 16,
        ef_construction: int = 64,
        maintenance_work_mem: str | None = None,
    ) -> AnnStatus:
        """Let vector searches of large user scopes use an HNSW index.

        Builds the collection's index if it is missing (``CREATE INDEX CONCURRENTLY``: writes
        go on; it takes a while and wants ``maintenance_work_mem``), then probes: stored vectors
        of the largest user scopes are searched through the index and exactly, and the path is
        used only while recall@10 >= ``recall_floor``. A search takes the path when its scope
        is exactly one user's (``MemoryScope(user_id=...)``, the shape the probe measures)
        whose memories numbered more than ``min_scope_rows`` at the last probe; the probe, and
        that list, are renewed every ANN_PROBE_EVERY searches of the collection. Every other
        search stays exact. Inserts into the collection get slower (the index is kept up to
        date). The setting lives in this store object: call it after each start-up (the index
        build is then skipped). The build runs without a statement timeout;
        ``maintenance_work_mem`` (e.g. ``"1GB"``) speeds it up when the server can spare it.
        """
        info = await self.get_collection(collection)
        check_limit(ef_search, what="ef_search", maximum=1_000)
        check_limit(min_scope_rows, what="min_scope_rows", maximum=100_000_000)
        check_score(recall_floor)
        params = {
            "collection": collection,
            "dimensions": info.dimensions,
            "m": check_limit(m, what="m", maximum=100),
            "ef_construction": check_limit(ef_construction, what="ef_construction", maximum=1_000),
        }
        async with self._reading() as conn:
            valid = (await conn.execute(text(q.ANN_INDEX_VALID), params)).scalar()
            # The DDL comes back quoted by PostgreSQL's format(); it runs as is (exec_driver_sql
            # does not look for bind parameters in it).
            if valid is False:  # a failed concurrent build leaves an invalid index behind
                drop = (await conn.execute(text(q.ANN_DROP_DDL), params)).scalar_one()
                await conn.exec_driver_sql(drop)
            if not valid:
                ddl = (await conn.execute(text(q.ANN_INDEX_DDL), params)).scalar_one()
                await conn.execute(
                    text(q.ANN_BUILD_SETTINGS), {"maintenance_work_mem": maintenance_work_mem}
                )
                try:
                    await conn.exec_driver_sql(ddl)
                finally:
                    await conn.exec_driver_sql(q.ANN_BUILD_RESET)
        self._ann[collection] = _AnnPath(
            ef_search=ef_search, recall_floor=recall_floor, min_scope_rows=min_scope_rows
        )
        return await self.probe_ann(collection)

    async def disable_ann(self, collection: str, *, drop_index: bool = False) -> None:
        """Search every scope of the collection exactly again (optionally drop the index)."""
        self._ann.pop(collection, None)
        if drop_index:
            async with self._reading() as conn:
                ddl = (
                    await conn.execute(text(q.ANN_DROP_DDL), {"collection": collection})
                ).scalar_one()
                await conn.exec_driver_sql(ddl)

    async def probe_ann(self, collection: str, *, samples: int = 20, limit: int = 10) -> AnnStatus:
        """Measure the approximate path's recall@``limit`` against exact search, and decide.

        The queries are stored vectors of the collection's largest user scopes (above the
        path's ``min_scope_rows``), so no outside data is needed. Audit is off for the probe.
        """
        path = self._ann.get(collection)
        if path is None:
            raise InvalidInputError(
                f"collection {collection!r} has no approximate path: call enable_ann() first"
            )
        params = {"collection": collection, "min_rows": path.min_scope_rows, "samples": samples}
        async with self._reading() as conn:
            path.large_users = frozenset(
                (await conn.execute(text(q.ANN_LARGE_USERS), params)).scalars()
            )
            rows = (await conn.execute(text(q.ANN_PROBE_SAMPLE), params)).all()
        found = total = 0
        for user_id, embedding in rows:
            scope = MemoryScope(user_id=user_id)
            exact = await self._probe_search(collection, scope, embedding, limit, ann=None)
            approx = await self._probe_search(collection, scope, embedding, limit, ann=path)
            found += len({h.memory.id for h in approx} & {h.memory.id for h in exact})
            total += len(exact)
        path.recall = found / total if total else None
        path.probed_scopes = len({user_id for user_id, _ in rows})
        path.searches = 0
        status = path.status(collection)
        logger.info(
            "approximate path of %s: recall %s over %d scopes -> %s",
            collection,
            "n/a" if status.recall is None else f"{status.recall:.3f}",
            status.probed_scopes,
            "on" if status.enabled else "off (exact)",
        )
        return status

    async def _probe_search(
        self, collection: str, scope: MemoryScope, vector: Any, limit: int, ann: _AnnPath | None
    ) -> list[MemoryHit]:
        """A search on the given path (exact when None); other tasks' searches are unaffected."""
        token = _PROBE_PATH.set(ann)
        try:
            return await self.search(collection, scope, vector=vector, limit=limit, audit=False)
        finally:
            _PROBE_PATH.reset(token)

    async def _ann_path(self, collection: str, scope: MemoryScope) -> _AnnPath | None:
        """The approximate path if this search should take it, else None (exact)."""
        probing = _PROBE_PATH.get()
        if probing is not _NOT_PROBING:
            return probing  # type: ignore[return-value]
        path = self._ann.get(collection)
        if path is None:
            return None
        path.searches += 1
        if path.searches > ANN_PROBE_EVERY:
            await self.probe_ann(collection)
        if not path.enabled:
            return None
        large = set(scope.as_dict()) == {"user_id"} and scope.user_id in path.large_users
        return path if large else None

    async def list(
        self,
        collection: str,
        scope: MemoryScope,
        *,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = True,
        since: datetime | None = None,
        until: datetime | None = None,
        allow_unscoped: bool = False,
    ) -> list[Memory]:
        """Live memories of a scope in time order (newest first by default), one page."""
        self._check_search_scope(scope, allow_unscoped)
        await self.get_collection(collection)
        check_limit(limit)
        if not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset is {offset!r}; expected an integer >= 0")
        statement = q.list_memories(tuple(scope.as_dict()), newest_first=newest_first)
        params = {
            **scope.as_dict(),
            "collection": collection,
            "limit": limit,
            "offset": offset,
            "since": _aware(since, "since") or _DISTANT_PAST,
            "until": _aware(until, "until") or _DISTANT_FUTURE,
        }
        async with self._reading() as conn:
            rows = (await conn.execute(text(statement), params)).mappings().all()
        return [_memory(row) for row in rows]

    async def count(
        self, collection: str, scope: MemoryScope, *, allow_unscoped: bool = False
    ) -> int:
        """How many live memories the scope holds."""
        self._check_search_scope(scope, allow_unscoped)
        await self.get_collection(collection)
        statement = q.count_memories(tuple(scope.as_dict()))
        async with self._reading() as conn:
            result = await conn.execute(
                text(statement), {**scope.as_dict(), "collection": collection}
            )
            return int(result.scalar_one())

    async def record_recall(
        self,
        collection: str,
        scope: MemoryScope,
        *,
        memory_ids: Sequence[uuid.UUID],
        scores: Sequence[float],
        query: str | None,
        trace: RecallTrace | None = None,
    ) -> None:
        """Append a recall audit row for memories a caller put together itself.

        Use it when what went into an answer is more than one :meth:`search` (which audits
        itself), e.g. similar memories plus the most recent ones. ``scores`` pairs with
        ``memory_ids``; the query is kept as its sha256 unless the trace asks for the text.
        """
        if len(memory_ids) != len(scores):
            raise InvalidInputError("memory_ids and scores must have the same length")
        trace = trace or RecallTrace()
        params = {
            **scope.column_values(),
            "collection": collection,
            "provider": trace.provider,
            "mode": trace.mode,
            "requesting_session_id": trace.session_id,
            "query_sha256": sha256_hex(query or ""),
            "query_text": query if trace.include_query_text else None,
            "memory_ids": list(memory_ids),
            "scores": [float(x) for x in scores],
        }
        async with self.engine.begin() as conn:
            await self._relax_audit_commit(conn)
            await conn.execute(text(q.RECORD_RECALL), params)

    # --- deletes ---------------------------------------------------------------------------

    async def delete(
        self,
        collection: str,
        *,
        ids: Sequence[uuid.UUID | str] | None = None,
        scope: MemoryScope | None = None,
        actor: str | None = None,
        allow_unscoped: bool = False,
    ) -> int:
        """Delete memories by id, or every memory of a scope (erasure); audited; returns count."""
        await self.get_collection(collection)
        check_optional_name(actor, what="actor")
        if (ids is None) == (scope is None):
            raise InvalidInputError("pass exactly one of ids= or scope=")
        if ids is not None:
            try:
                id_list = [i if isinstance(i, uuid.UUID) else uuid.UUID(str(i)) for i in ids]
            except ValueError as exc:
                raise InvalidInputError(f"ids must be UUIDs: {exc}") from exc
            statement, params = q.DELETE_BY_IDS, {"ids": id_list}
        else:
            assert scope is not None
            self._check_search_scope(scope, allow_unscoped)
            statement = q.delete_scope(tuple(scope.as_dict()))
            params = dict(scope.as_dict())
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text(statement), {**params, "collection": collection, "actor": actor or ""}
            )
            count = len(result.all())
        logger.info("deleted %d memories from collection %s", count, collection)
        return count

    async def expire(
        self, collection: str | None = None, *, now: datetime | None = None, actor: str | None = None
    ) -> int:
        """Delete memories whose ``expires_at`` has passed (audited as 'expire'); returns count.

        Searches already skip expired rows; this reclaims them.
        """
        if collection is not None:
            await self.get_collection(collection)
        check_optional_name(actor, what="actor")
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text(q.DELETE_EXPIRED),
                {
                    "collection": collection,
                    "now": _aware(now, "now") or datetime.now(UTC),
                    "actor": actor or "",
                },
            )
            return len(result.all())

    async def erase_user(self, user_id: str, *, actor: str | None = None) -> dict[str, int]:
        """Erase everything stored about a user, in ONE transaction (right to erasure).

        Deletes the user's memories in every collection (each deletion audited, by content hash
        only), facts and chat history, and blanks the personal values kept in the fact audit and
        the query texts kept in the recall audit. Returns counts per kind.
        """
        check_name(user_id, what="user_id")
        check_optional_name(actor, what="actor")
        params = {"user_id": user_id, "actor": actor or ""}
        async with self.engine.begin() as conn:
            memories = len((await conn.execute(text(q.ERASE_USER_MEMORIES), params)).all())
            facts = (await conn.execute(text(q.ERASE_USER_FACTS), params)).rowcount
            history = (await conn.execute(text(q.ERASE_USER_HISTORY), params)).rowcount
            fact_audit = (await conn.execute(text(q.REDACT_USER_FACT_AUDIT), params)).rowcount
            recall_audit = (await conn.execute(text(q.REDACT_USER_RECALL_AUDIT), params)).rowcount
        counts = {
            "memories": memories,
            "facts": int(facts),
            "history_messages": int(history),
            "fact_audit_rows_redacted": int(fact_audit),
            "recall_audit_rows_redacted": int(recall_audit),
        }
        logger.info("erased a user: %s", counts)
        return counts

    # --- chat history ----------------------------------------------------------------------

    async def append_history(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], *, user_id: str = ""
    ) -> int:
        """Append messages to a session's history in ONE transaction; returns rows inserted.

        Each message is a JSON-native dict with ``message_id`` and ``role``; a message id already
        in the session is skipped (so a retried save does not duplicate).
        """
        check_name(session_id, what="session_id")
        if user_id:
            check_name(user_id, what="user_id")
        ids: builtins.list[str] = []
        roles: builtins.list[str] = []
        payloads: builtins.list[Jsonb] = []
        seen: set[str] = set()
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise InvalidInputError(f"messages[{i}] must be a dict, got {type(message).__name__}")
            message_id = check_name(message.get("message_id"), what=f"messages[{i}].message_id")
            role = check_choice(message.get("role"), what=f"messages[{i}].role", choices=ROLES)
            if message_id in seen:
                continue
            seen.add(message_id)
            ids.append(message_id)
            roles.append(role)
            payloads.append(Jsonb(check_metadata(message, what=f"messages[{i}]")))
        if not ids:
            return 0
        params = {"session_id": session_id, "user_id": user_id}
        async with self.engine.begin() as conn:
            await conn.execute(text(q.LOCK_HISTORY), params)
            result = await conn.execute(
                text(q.APPEND_HISTORY),
                {**params, "message_ids": ids, "roles": roles, "messages": payloads},
            )
            return int(result.rowcount)

    async def read_history(
        self,
        session_id: str,
        *,
        user_id: str = "",
        after_seq: int = 0,
        limit: int | None = None,
    ) -> builtins.list[HistoryRow]:
        """A session's messages in order: those after ``after_seq``, at most ``limit``."""
        check_name(session_id, what="session_id")
        if limit is not None:
            check_limit(limit, maximum=1_000_000)
        async with self._reading() as conn:
            rows = (
                await conn.execute(
                    text(q.READ_HISTORY),
                    {
                        "session_id": session_id,
                        "user_id": user_id,
                        "after_seq": after_seq,
                        "limit": limit,
                    },
                )
            ).mappings().all()
        return [HistoryRow(**row) for row in rows]

    async def count_history(self, session_id: str, *, user_id: str = "") -> int:
        """How many messages a session's history holds."""
        async with self._reading() as conn:
            result = await conn.execute(
                text(q.COUNT_HISTORY), {"session_id": session_id, "user_id": user_id}
            )
            return int(result.scalar_one())

    async def delete_history(self, session_id: str, *, user_id: str = "") -> int:
        """Erase a session's history; returns rows deleted."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                text(q.DELETE_HISTORY), {"session_id": session_id, "user_id": user_id}
            )
            return int(result.rowcount)

    # --- facts -----------------------------------------------------------------------------

    async def get_facts(self, namespace: str, scope: MemoryScope) -> dict[str, Any]:
        """The facts stored for exactly this scope (unset dimensions are part of the key)."""
        params = self._facts_params(namespace, scope)
        async with self._reading() as conn:
            facts = (await conn.execute(text(q.GET_FACTS), params)).scalar()
        return dict(facts or {})

    async def merge_facts(
        self,
        namespace: str,
        scope: MemoryScope,
        updates: Mapping[str, Any],
        *,
        actor: str | None = None,
    ) -> dict[str, Any]:
        """Merge ``updates`` into the scope's facts in ONE transaction; returns the result.

        A key whose value is ``None`` is removed; any other value sets or overwrites the key.
        Each key that actually changes gets an audit row with its old and new value.
        """
        check_optional_name(actor, what="actor")
        clean = check_metadata(updates, what="fact updates")
        params = self._facts_params(namespace, scope)
        async with self.engine.begin() as conn:
            await conn.execute(text(q.ENSURE_FACTS), params)
            current = dict((await conn.execute(text(q.GET_FACTS_FOR_UPDATE), params)).scalar() or {})
            merged = dict(current)
            changes: builtins.list[tuple[str, Any, Any]] = []
            for key, value in clean.items():
                old = current.get(key)
                if value is None:
                    if key in merged:
                        del merged[key]
                        changes.append((key, old, None))
                elif old != value:
                    merged[key] = value
                    changes.append((key, old, value))
            if changes:
                await conn.execute(text(q.UPDATE_FACTS), {**params, "facts": Jsonb(merged)})
                await conn.execute(
                    text(q.AUDIT_FACTS),
                    {
                        **params,
                        "actor": actor or "",
                        "keys": [c[0] for c in changes],
                        "old_values": [None if c[1] is None else Jsonb(c[1]) for c in changes],
                        "new_values": [None if c[2] is None else Jsonb(c[2]) for c in changes],
                    },
                )
        if changes:
            logger.info("changed %d facts in namespace %s", len(changes), namespace)
        return merged

    async def delete_facts(self, scope: MemoryScope, *, namespace: str | None = None) -> int:
        """Erase the scope's facts (one namespace, or all); returns rows deleted."""
        params = self._facts_params(namespace or "-", scope)
        params["namespace"] = namespace
        async with self.engine.begin() as conn:
            return int((await conn.execute(text(q.DELETE_FACTS), params)).rowcount)

    def _facts_params(self, namespace: str, scope: MemoryScope) -> dict[str, Any]:
        check_name(namespace, what="namespace")
        if not isinstance(scope, MemoryScope) or scope.is_empty:
            raise ScopeError(f"facts need a non-empty MemoryScope, got {scope!r}")
        return {**scope.column_values(), "namespace": namespace}

    # --- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _check_search_scope(scope: MemoryScope, allow_unscoped: bool) -> None:
        if not isinstance(scope, MemoryScope):
            raise ScopeError(f"scope must be a MemoryScope, got {scope!r}")
        if scope.is_empty and not allow_unscoped:
            raise ScopeError(
                "the search scope sets no dimension, so it would cover every user's memories; "
                "set user_id (or session_id, agent_id, application_id), or pass "
                "allow_unscoped=True if that is really meant"
            )


_BATCH_COLUMNS = (
    "ids", "user_ids", "application_ids", "agent_ids", "session_ids", "roles", "author_names",
    "message_ids", "source_types", "source_ids", "contents", "content_sha256s", "terms",
    "embeddings", "created_ats", "expires_ats", "metadatas",
)  # fmt: skip
#: Staging column -> batch column list.
_STAGING_SOURCE = dict(zip(q.STAGING_COLUMNS, _BATCH_COLUMNS, strict=True))


def _aware(value: datetime | None, what: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None:
        raise InvalidInputError(
            f"{what} {value.isoformat()} has no time zone; pass an aware datetime, e.g. "
            "datetime.now(UTC)"
        )
    return value


def _memory(row: Mapping[str, Any]) -> Memory:
    return Memory(
        id=row["id"],
        collection=row["collection"],
        scope=MemoryScope(
            application_id=row["application_id"] or None,
            agent_id=row["agent_id"] or None,
            user_id=row["user_id"] or None,
            session_id=row["session_id"] or None,
        ),
        role=row["role"],
        content=row["content"],
        author_name=row["author_name"],
        message_id=row["message_id"],
        source_type=row["source_type"],
        source_id=row["source_id"],
        embedding_model=row["embedding_model"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        metadata=row["metadata"],
    )


async def _driver_connection(conn: AsyncConnection) -> Any:
    """The psycopg AsyncConnection under a SQLAlchemy connection (for COPY)."""
    raw = await conn.get_raw_connection()
    return raw.driver_connection


@dataclass(kw_only=True)
class _AnnPath:
    """A collection's approximate path in this process, and its last probe."""

    ef_search: int
    recall_floor: float
    min_scope_rows: int
    recall: float | None = None
    probed_scopes: int = 0
    searches: int = 0
    #: Users whose scope exceeded min_scope_rows at the last probe.
    large_users: frozenset[str] = frozenset()

    @property
    def enabled(self) -> bool:
        return self.recall is not None and self.recall >= self.recall_floor

    def status(self, collection: str) -> AnnStatus:
        return AnnStatus(
            collection=collection,
            enabled=self.enabled,
            recall=self.recall,
            recall_floor=self.recall_floor,
            min_scope_rows=self.min_scope_rows,
            ef_search=self.ef_search,
            probed_scopes=self.probed_scopes,
        )


#: Set by probe_ann for its own searches (in its task only): the path to take, None = exact.
_NOT_PROBING = object()
_PROBE_PATH: contextvars.ContextVar[object] = contextvars.ContextVar(
    "pgmemory_probe_path", default=_NOT_PROBING
)
