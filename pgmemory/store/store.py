"""``MemoryStore``: the async PostgreSQL store under every memory provider.

The class is a front: each method checks nothing and runs no SQL itself, but hands over to the
module that owns the concern (see the package docstring of :mod:`pgmemory.store`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.settings import Settings
from pgmemory.store import ann, erasure, facts, history, reads, recall, requests, writes
from pgmemory.store._engine import lifecycle
from pgmemory.store._engine.database import Database
from pgmemory.store._engine.retry import retried_read
from pgmemory.store.catalogue import Catalogue
from pgmemory.store.modes import SearchMode
from pgmemory.store.probing import Beside
from pgmemory.store.records import (
    AnnStatus,
    CollectionInfo,
    HistoryRow,
    Memory,
    MemoryHit,
    MemoryRecord,
    MemoryScope,
    Recall,
    RecallReason,
    RecallTrace,
    SearchWeights,
    Signals,
    TwoPhaseStatus,
)
from pgmemory.store.requests import RecallRequest
from pgmemory.store.shortlist import Shortlists

if TYPE_CHECKING:
    from pgmemory.embedders.base import Embedder


class MemoryStore:
    """Scoped memories, their audit trail, chat history and facts in PostgreSQL + pgvector.

    Use it as an async context manager::

        async with MemoryStore(migrate=True) as store:
            await store.create_collection("chat")
            await store.add("chat", [MemoryRecord(content="I can't eat spicy food",
                                                  scope=MemoryScope(user_id="alice"))])
            hits = await store.search("chat", MemoryScope(user_id="alice"), query="order food")

    Args:
        url: A libpq or SQLAlchemy URL. Default: ``PGMEMORY_DATABASE_URL``; with neither, the
            store starts, or reuses, the embedded PostgreSQL server under ``Settings.data_dir``.
        settings: Pool, timeouts, limits (default: ``Settings()``, read from the environment).
        embedder: Embeds texts passed without a vector (default: :func:`pgmemory.make_embedder`
            of the settings, built on first use).
        migrate: Upgrade the schema to this version's head when opening.
        engine: The application's own async engine (``postgresql+psycopg``), instead of a URL
            (pgmemory teaches its connections pgvector's types and hides statement parameters
            in errors; pool and timeouts stay the application's; closing leaves it open).
        embedded: Whether a missing URL may start the embedded server (default:
            ``Settings.embedded``, ``PGMEMORY_EMBEDDED``, true; it logs a WARNING when it does).
        read_urls: Hot standbys serving searches, lists, counts and history reads (default:
            ``Settings.read_urls``, ``PGMEMORY_READ_URLS``). A user's reads wait (up to
            ``replica_wait_ms``) for a replica to replay the user's writes, else go to the
            primary; writes and recall audit rows go to the primary (docs/scaling.md).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        embedder: Embedder | None = None,
        migrate: bool = False,
        engine: AsyncEngine | None = None,
        embedded: bool | None = None,
        read_urls: Sequence[str] | None = None,
    ) -> None:
        self.settings = settings or Settings()
        if embedded is not None:
            self.settings = self.settings.model_copy(update={"embedded": embedded})
        if url is None and engine is None and self.settings.database_url is not None:
            url = self.settings.database_url.get_secret_value()
        self._embedder = embedder
        if read_urls is None:
            read_urls = self.settings.read_url_list()
        self._db = Database(
            url, settings=self.settings, migrate=migrate, engine=engine, read_urls=read_urls
        )
        self._catalogue = Catalogue(self._db, lambda: self.embedder)
        self._probes = Beside()
        self._ann: ann.AnnPaths = ann.AnnPaths(
            self._db,
            self._catalogue,
            beside=self._probes,
            search=lambda *probe: reads.probe_search(self._db, self._catalogue, self._ann, *probe),
        )
        self._shortlists = Shortlists(
            self._db,
            beside=self._probes,
            search=lambda c, s, v, k, n: reads.probe_search(
                self._db, self._catalogue, self._ann, c, s, v, k, None, shortlist=n
            ),
        )

    # --- life cycle ------------------------------------------------------------------------

    async def open(self) -> MemoryStore:
        """Connect (starting the embedded server if needed), optionally migrate, then check.

        Raises:
            DatabaseNotReadyError: pgvector or pgmemory's schema is missing or out of date.
        """
        await self._db.open()
        return self

    async def close(self) -> None:
        """Close the store for good: later calls raise :class:`~pgmemory.errors.StoreClosedError`;
        calls in flight may finish (their connections are awaited, at most
        ``lifecycle.CLOSE_GRACE_S``); then the pool closes and the embedded server is released
        (stopped when no process uses it); running probes are cancelled. Twice is harmless."""
        await self._probes.close()
        await self._db.close()

    async def __aenter__(self) -> MemoryStore:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def migrate(self) -> None:
        """Upgrade the schema to this version's head (needs the store to know its URL)."""
        await self._db.migrate()

    @property
    def url(self) -> str:
        """The SQLAlchemy URL in use (password included: don't log it)."""
        return self._db.url

    @property
    def database(self) -> Database:
        """The store's database and its statement verbs (for :mod:`pgmemory.admin`)."""
        return self._db

    @property
    def engine(self) -> AsyncEngine:
        """The pooled async engine (for advanced use and tests)."""
        return self._db.engine

    @property
    def embedder(self) -> Embedder:
        """The embedder used for texts given without a vector (built on first use)."""
        if self._embedder is None:
            from pgmemory.embedders import make_embedder

            self._embedder = make_embedder(self.settings)
        return self._embedder

    def shared_transaction(self, *, deferred: bool = False) -> AbstractAsyncContextManager[None]:
        """A block whose writes commit together, or not at all.

        Every write of this store by the current task (or tasks it starts) joins one
        transaction, committed when the block ends, rolled back if it raises; blocks nest (the
        outer one's way wins). Reads outside it do not see its writes; ``create_collection``
        must not run inside. A turn's providers write in one block::

            async with store.shared_transaction(deferred=True):
                await store.append_history(session_id, messages, user_id="alice")
                await store.add("chat", records)  # both, or neither

        ``deferred``: ``add`` and ``append_history`` go with the commit, one round trip, unless
        the block writes otherwise (that sends them first); they return what they sent.
        """
        return self._db.unit_of_work(deferred=deferred)

    # --- collections -----------------------------------------------------------------------

    async def create_collection(
        self, name: str, *, dimensions: int | None = None, embedding_model: str | None = None
    ) -> CollectionInfo:
        """Create a collection, or return it if it exists with the same size and model.

        Args:
            name: The collection's name.
            dimensions: Its vectors' size (default: the store's embedder's).
            embedding_model: The model making its vectors (default: the store's embedder's).

        Raises:
            CollectionError: It exists with another size or model (vectors of different
                models are not comparable), or the size is out of range.
        """
        return await self._catalogue.create(
            name, dimensions=dimensions, embedding_model=embedding_model
        )

    @retried_read
    async def get_collection(self, name: str) -> CollectionInfo:
        """A collection's catalogue entry; :class:`~pgmemory.errors.CollectionError` if it does not exist."""
        return await self._catalogue.get(name)

    @retried_read
    async def list_collections(self) -> list[CollectionInfo]:
        """Every collection in the catalogue."""
        return await self._catalogue.entries()

    async def drop_collection(self, name: str, *, actor: str | None = None) -> int:
        """Delete a collection and all its memories (audited); returns memories deleted."""
        return await self._catalogue.drop(name, actor=actor)

    # --- memories: writes ------------------------------------------------------------------

    async def add(
        self,
        collection: str,
        records: Sequence[MemoryRecord],
        *,
        actor: str | None = None,
        allow_unscoped: bool = False,
    ) -> list[uuid.UUID]:
        """Store a batch in ONE transaction (all rows or none), each row's insert audited.

        A record's ``message_id`` is its idempotency key: a record whose ``message_id`` the
        collection already holds in the same scope is skipped, so a retried or re-run write
        stores each message once (give every record you may send twice a stable id, e.g. your
        message's id; records without one are always stored). Every record is checked, and
        texts without a vector embedded, before any SQL runs. Text is normalised, never refused for its
        characters: NUL and lone surrogates in contents, author names and metadata become
        U+FFFD (see :mod:`pgmemory.text.clean`); a content over ``max_text_chars`` is refused
        (cut it yourself if you want it stored). Ids are keys and are refused instead: see
        :class:`MemoryScope` for their limits, in characters and in index bytes. Rows are
        inserted in the order of their message key, so concurrent batches of the same messages
        never deadlock; a record without ``created_at`` is stamped with the transaction's
        start plus its position in microseconds, so a batch keeps its order in time.

        Args:
            collection: Where to store.
            records: The memories.
            actor: Who writes, for the audit rows.
            allow_unscoped: Accept records with an empty scope (visible to every search).

        Returns:
            The new ids in record order; fewer than the records when messages were skipped.

        Raises:
            InvalidInputError: A record is unusable (the message names it); nothing is stored.
        """
        return await writes.add(
            self._db,
            self._catalogue,
            collection,
            records,
            actor=actor,
            allow_unscoped=allow_unscoped,
        )

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

        Faster than :meth:`add` for large loads. Rows go through a temporary staging table so
        that every row is still audited; nothing is visible, and nothing stays, unless the
        whole import succeeds. Messages already stored are skipped, as in :meth:`add`. The
        import is not bound by ``statement_timeout_ms``. An import of 1,000 rows or more that is
        at least a tenth of the table then runs ``VACUUM (ANALYZE)``, so the next searches are
        planned for the rows just loaded and read them from the covering index alone.

        Args:
            collection: Where to store.
            records: The memories, possibly a generator (read ``batch_rows`` at a time).
            actor: Who writes, for the audit rows.
            batch_rows: Records checked, embedded and copied at a time.
            progress: Show a progress bar.
            allow_unscoped: Accept records with an empty scope.
        """
        return await writes.import_records(
            self._db,
            self._catalogue,
            collection,
            records,
            actor=actor,
            batch_rows=batch_rows,
            progress=progress,
            allow_unscoped=allow_unscoped,
        )

    # --- memories: reads -------------------------------------------------------------------

    @retried_read
    async def search(
        self,
        collection: str,
        scope: MemoryScope,
        *,
        query: str | None = None,
        vector: Sequence[float] | np.ndarray | None = None,
        limit: int = 3,
        mode: SearchMode | None = None,
        weights: SearchWeights | None = None,
        min_score: float | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        allow_unscoped: bool = False,
        audit: bool = True,
        trace: RecallTrace | None = None,
        explain: bool = False,
    ) -> list[MemoryHit]:
        """The ``limit`` best memories of the scope for ``query`` (or ``vector``), best first.

        Exact (recall@k = 1.0 against brute force), unless :meth:`enable_ann` gave the
        collection an approximate path for large scopes (windowless vector searches only).

        Args:
            collection: Where to search.
            scope: Whose memories; every dimension set must match.
            query: The text to search for (embedded unless ``mode="text"``). Cleaned like
                stored text (NUL and lone surrogates become U+FFFD) and cut to its first
                ``max_text_chars`` characters: a long query is never refused.
            vector: Or a query vector (``mode="vector"`` only).
            limit: How many hits at most.
            mode: ``"hybrid"`` (a fusion of similarity, keywords and recency: normalised
                scores by default, or reciprocal ranks; see ``weights``), ``"vector"``
                (cosine similarity) or ``"text"`` (keyword match ranked by BM25 within the
                scope); see :class:`MemoryHit` for each mode's ``score``. Default: hybrid
                for a ``query`` (as the providers, CLI and UI), vector for a ``vector``.
            weights: The hybrid fusion's weights and kind (:class:`SearchWeights`).
            min_score: Drop hits scoring lower: from -1 to 1 in vector mode, any finite number
                in the other modes.
            since: Only memories created at or after this (aware) time.
            until: Only memories created before this (aware) time.
            allow_unscoped: Allow an empty scope (every tenant's memories).
            audit: Record the recall in ``pgmemory_recall_audit`` (in the same statement).
            trace: Who is recalling, for the audit row.
            explain: Give each hit its :class:`Signals` (what each signal contributed to
                its score); the audit row records them with each hit's reason.

        Raises:
            InvalidInputError: A bad argument (the message names it).
            ScopeError: The scope is empty without ``allow_unscoped``.
            CollectionError: Unknown collection, or a vector of another size or model.
        """
        return await reads.search(
            self._db,
            self._catalogue,
            self._ann,
            collection,
            scope,
            query=query,
            vector=vector,
            limit=limit,
            mode=mode,
            weights=weights,
            min_score=min_score,
            since=since,
            until=until,
            allow_unscoped=allow_unscoped,
            audit=audit,
            trace=trace,
            explain=explain,
            shortlists=self._shortlists,
        )

    @retried_read
    async def recall(
        self,
        collection: str,
        scope: MemoryScope,
        request: RecallRequest | None = None,
        **options: Any,
    ) -> Recall:
        """What a memory provider shows the model for a turn, in ONE audited round trip.

        The newest ``recent_turns`` user turns of the scope and what followed them, and the
        best ``max_results`` matches for ``query`` (None or blank: recent turns only), less
        tool calls and results (unless ``include_tools``), near-duplicates and the messages
        in ``exclude_message_ids`` (sent to the model anyway), fitted into ``max_tokens`` under
        ``heading``; the audit row holds exactly the shown memories, the mode used and each
        one's reason and signals (:mod:`pgmemory.store.recall`). Raises as :meth:`search` does.

        ``request`` is a :class:`~pgmemory.store.requests.RecallRequest` (its fields are the
        options and their defaults); ``options`` are its fields as keywords
        (``recall(c, scope, query="...", max_results=5)``), set on ``request`` if both are
        given."""
        checked = requests.build(RecallRequest, request, options)
        return await recall.recall(self._db, self._catalogue, collection, scope, checked)

    @retried_read
    async def count(
        self, collection: str, scope: MemoryScope, *, allow_unscoped: bool = False
    ) -> int:
        """How many live memories the scope holds."""
        return await reads.count(
            self._db, self._catalogue, collection, scope, allow_unscoped=allow_unscoped
        )

    # --- memories: the approximate path for large scopes -----------------------------------

    async def enable_ann(
        self,
        collection: str,
        *,
        min_scope_rows: int = ann.ANN_MIN_SCOPE_ROWS,
        ef_search: int = ann.ANN_EF_SEARCH,
        recall_floor: float = ann.ANN_RECALL_FLOOR,
        m: int = 16,
        ef_construction: int = 64,
        maintenance_work_mem: str | None = None,
        method: str = "hnsw",
        lists: int | None = None,
        probes: int | None = None,
    ) -> AnnStatus:
        """Let vector searches of large user scopes use an approximate index.

        Builds the index if missing (``CREATE INDEX CONCURRENTLY``; one of the other
        ``method`` is replaced), then probes it: the path serves one user's scope of more than
        ``min_scope_rows`` memories only while recall@10 >= ``recall_floor`` (probed again
        beside the searches, at most once a minute). Inserts get slower. The setting lives in
        this store object: call it after each start-up. ``method`` is ``"hnsw"`` (``ef_search``,
        ``m``, ``ef_construction``) or ``"ivfflat"`` (``lists``, ``probes``: built in a fraction
        of HNSW's time, from the rows stored then); ``maintenance_work_mem`` (e.g. ``"1GB"``) is
        the build's memory. Details: :meth:`pgmemory.store.ann.AnnPaths.enable`.
        """
        return await self._ann.enable(
            collection,
            min_scope_rows=min_scope_rows,
            ef_search=ef_search,
            recall_floor=recall_floor,
            m=m,
            ef_construction=ef_construction,
            maintenance_work_mem=maintenance_work_mem,
            method=method,
            lists=lists,
            probes=probes,
        )

    async def disable_ann(self, collection: str, *, drop_index: bool = False) -> None:
        """Search every scope of the collection exactly again (optionally drop the index)."""
        await self._ann.disable(collection, drop_index=drop_index)

    async def probe_ann(
        self,
        collection: str,
        *,
        samples: int = ann.ANN_PROBE_SAMPLES,
        limit: int = ann.ANN_PROBE_LIMIT,
    ) -> AnnStatus:
        """Measure the approximate path's recall@``limit`` against exact search, and decide: the
        queries are ``samples`` stored vectors of its largest user scopes (no outside data; no
        audit)."""
        return await self._ann.probe(collection, samples=samples, limit=limit)

    async def probe_two_phase(self, collection: str) -> TwoPhaseStatus:
        """Measure the two-phase path of the collection's large user scopes now (each first pass
        kept against the exact search, on their stored rows; no audit), and decide which one
        their searches take (:mod:`pgmemory.store.shortlist`). :class:`~pgmemory.errors.CollectionError` if
        there is no such collection."""
        await self._catalogue.get(collection)
        return await self._shortlists.measure(collection)

    async def _ann_path(self, collection: str, scope: MemoryScope) -> ann.AnnPath | None:
        """The path a vector search of ``scope`` would take now (None: exact); counts as one."""
        return await self._ann.route(collection, scope)

    # --- memories: recall audit and deletes ------------------------------------------------

    async def record_recall(
        self,
        collection: str,
        scope: MemoryScope,
        *,
        memory_ids: Sequence[uuid.UUID],
        scores: Sequence[float],
        query: str | None,
        trace: RecallTrace | None = None,
        reasons: Sequence[RecallReason] | None = None,
        signals: Sequence[Signals | None] | None = None,
    ) -> None:
        """Append a recall audit row for memories a caller put together itself (a
        :meth:`search` and a :meth:`recall` audit themselves). ``scores``, and ``reasons``
        and ``signals`` when given, pair with ``memory_ids``; the query is kept as its sha256
        unless the trace asks for the text.
        """
        await recall.record(
            self._db,
            collection,
            scope,
            memory_ids=memory_ids,
            scores=scores,
            query=query,
            trace=trace,
            reasons=reasons,
            signals=signals,
        )

    async def delete(
        self,
        collection: str,
        *,
        ids: Sequence[uuid.UUID | str] | None = None,
        scope: MemoryScope | None = None,
        actor: str | None = None,
        allow_unscoped: bool = False,
    ) -> int:
        """Delete memories by id within a scope, or a scope's every memory; audited; returns count.

        ``scope`` is always required: with ``ids`` it confines the delete to the caller's
        scope (ids are unique per user, so another user's rows with the same ids are never
        touched); alone, it erases every memory of the scope.

        Raises:
            ScopeError: No scope, or an empty one without ``allow_unscoped``.
            InvalidInputError: An id is not a UUID.
        """
        return await erasure.delete(
            self._db,
            self._catalogue,
            collection,
            ids=ids,
            scope=scope,
            actor=actor,
            allow_unscoped=allow_unscoped,
        )

    async def expire(
        self,
        collection: str | None = None,
        *,
        now: datetime | None = None,
        actor: str | None = None,
    ) -> int:
        """Delete memories whose ``expires_at`` has passed (audited as 'expire'), of one
        collection or all; returns the count (searches already skip expired rows)."""
        return await erasure.expire(self._db, self._catalogue, collection, now=now, actor=actor)

    async def erase_user(self, user_id: str, *, actor: str | None = None) -> dict[str, int]:
        """Erase everything stored about a user, in ONE transaction (right to erasure).

        Deletes the user's memories in every collection (each deletion audited, by keyed
        content hash only), facts, chat history and pending derivation jobs; in every audit row
        the user id becomes a pseudonym (``erased:`` + hex), kept fact values and query texts
        are blanked, and the user's audit secret is destroyed, so nothing left can be linked to
        the user or confirm a guessed text (docs/security.md, "What stays after erasure").
        Returns counts per kind: ``memories``, ``facts``, ``history_messages``,
        ``derivation_jobs``, and ``{memory,recall,fact}_audit_rows_pseudonymised``.
        """
        return await erasure.erase_user(self._db, user_id, actor=actor)

    # --- chat history ----------------------------------------------------------------------

    async def append_history(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], *, user_id: str = ""
    ) -> int:
        """Append messages (JSON-native dicts with ``message_id`` and ``role``) to a session's
        history in ONE transaction, skipping message ids it holds; returns rows inserted."""
        return await history.append(self._db, session_id, messages, user_id=user_id)

    @retried_read
    async def read_history(
        self, session_id: str, *, user_id: str = "", after_seq: int = 0, limit: int | None = None
    ) -> list[HistoryRow]:
        """A session's messages in order: those after ``after_seq``, at most ``limit``."""
        return await history.read(
            self._db, session_id, user_id=user_id, after_seq=after_seq, limit=limit
        )

    @retried_read
    async def count_history(self, session_id: str, *, user_id: str = "") -> int:
        """How many messages a session's history holds."""
        return await history.count(self._db, session_id, user_id=user_id)

    async def delete_history(self, session_id: str, *, user_id: str = "") -> int:
        """Erase a session's history; returns rows deleted."""
        return await history.delete(self._db, session_id, user_id=user_id)

    # --- facts -----------------------------------------------------------------------------

    @retried_read
    async def get_facts(self, namespace: str, scope: MemoryScope) -> dict[str, Any]:
        """The facts stored for exactly this scope (unset dimensions are part of the key)."""
        return await facts.get(self._db, namespace, scope)

    async def merge_facts(
        self,
        namespace: str,
        scope: MemoryScope,
        updates: Mapping[str, Any],
        *,
        actor: str | None = None,
        sources: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Merge ``updates`` into the scope's facts in ONE transaction; returns the result.

        A key whose value is ``None`` is removed; any other value sets or overwrites the key.
        Each key that actually changes gets an audit row with its old and new value, and
        ``sources`` (what they came from, e.g. ``{"message_ids": [...]}``) when given.
        """
        return await facts.merge(self._db, namespace, scope, updates, actor=actor, sources=sources)

    async def delete_facts(self, scope: MemoryScope, *, namespace: str | None = None) -> int:
        """Erase the scope's facts (one namespace, or all); returns rows deleted."""
        return await facts.delete(self._db, scope, namespace=namespace)

    # --- last, because its name shadows the builtin `list` in annotations after it ----------

    @retried_read
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
        """Live memories of a scope in time order (newest first by default), one page:
        ``limit``/``offset`` page through them; ``since`` (inclusive), ``until`` bound time."""
        return await reads.page(
            self._db,
            self._catalogue,
            collection,
            scope,
            limit=limit,
            offset=offset,
            newest_first=newest_first,
            since=since,
            until=until,
            allow_unscoped=allow_unscoped,
        )


lifecycle.refuse_when_closed(MemoryStore, lambda store: store._db.closed, keep=["close"])
