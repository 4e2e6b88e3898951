"""The two-phase path: large user scopes ranked by a compact first pass, then re-ranked exactly.

An exact vector search reads every row of the scope (about 1.1-1.5 µs a row at 384-512
dimensions, most of it the vector's bytes: 2 kB a row at 512 d). Each memory also keeps a
compact copy of its vector, a stored generated column in an index of its own: its binary code
(``binary_quantize(embedding)``, one bit a dimension, 32 times smaller, migration 0013), and,
where an operator added them (:mod:`pgmemory.admin.half_vectors`, opt-in because every write
pays for them), its unit vector in half precision (``embedding_half``, half the bytes, up to
1,024 dimensions). A search of a large scope reads one of them index-only, keeps the rows
nearest by it (:func:`shortlist_for`), and re-ranks those by their exact cosine distance
(:func:`pgmemory.store._ranking.search.search_memories` with ``shortlist``). The hits' scores are the
exact similarities; what can differ from an exact search is which rows are found: a true top-k
row that the first pass does not rank among its shortlist is missed.

How well each pass keeps the right rows depends on the vectors, not only on the scope's size:
measured (docs/performance.md), real sentence embeddings (USE, 512 d) keep recall@3 >= 0.999
through codes at 40 rows per hit, while vectors that are nearly random within a topic (the
synthetic data of ``bench/store/scale.py``) need a fifth of the scope through codes, which is
no saving; half vectors keep recall 1.000 on both at 10 rows per hit, and read 0.5-0.65 of an
exact scan's time (codes 0.3). So the path is gated, per collection and process, by a recall
probe on the collection's own stored vectors: ``samples`` stored rows of the largest scopes
are searched exactly and through each pass (their own row left out of the comparison), and
searches take the cheaper pass (codes, then halves) whose recall@``PROBE_LIMIT`` is at or
above the floor, or stay exact when neither is.

Which scopes take it (only where the memories keep the copies: pgvector >= 0.7, see
:func:`pgmemory.store._engine.connector.first_passes`): a vector search (no ``since``/``until``
window) whose scope is exactly one user, whose rows numbered more than ``min_scope_rows`` at
the last probe; every other search stays exact. The sizes come from one aggregate over the
collection's rows (all its users, a fan-out on Citus), run with each probe: at the
collection's 100th vector search in the process (in that search; before it, every search is
exact), then after every ``probe_every`` searches of it, at most once a minute, beside the
searches (:mod:`pgmemory.store.probing`); a probe's exact searches read at most
SHORTLIST_PROBE_ROWS scope rows in all. A size that went stale costs speed, never
correctness: a user who grew past the threshold searches exactly until the next probe, and one
who shrank searches a smaller scope with the same shortlist (recall only rises). Scopes
narrower than a user (a session, an agent) stay exact. A probe that fails leaves the path off
(every search exact), logged without user data.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store._ranking.candidates import FirstPass
from pgmemory.store.probing import Beside, due, sample_largest
from pgmemory.store.records import MemoryHit, MemoryScope, TwoPhaseStatus

logger = logging.getLogger(__name__)

#: Scopes of more rows than this take the two-phase path (when the probe allows it): below it
#: the exact scan costs about as much as the first pass plus the re-rank (docs/performance.md).
SHORTLIST_MIN_SCOPE_ROWS = 1_000
#: Rows re-ranked per hit asked for, and at least (a search for 1 hit needs more than 40), by
#: first pass: codes keep the nearest rows among fewer of their neighbours than half vectors
#: do, so they re-rank more (docs/performance.md).
SHORTLIST_OVERSAMPLE: dict[FirstPass, int] = {"codes": 40, "halves": 10}
SHORTLIST_MIN_ROWS: dict[FirstPass, int] = {"codes": 160, "halves": 40}
#: The least recall the probe must measure for a first pass to be used.
SHORTLIST_RECALL_FLOOR = 0.99
#: A collection is first probed at its this-many-th search in the process (a process that
#: searches it a few times never pays for a probe it cannot amortise: up to about 0.5 s) ...
SHORTLIST_FIRST_PROBE = 100
#: ... and again (which also refreshes which scopes are large) after this many of its
#: searches, and no sooner than probing.PROBE_INTERVAL_S after its last probe.
SHORTLIST_PROBE_EVERY = 1_000
#: Stored rows a probe searches both ways, and the hits it compares for each.
SHORTLIST_PROBE_SAMPLES = 32
PROBE_LIMIT = 10
#: Scope rows the probe's exact searches may read in all (about 0.5 s at 1.3 µs a row): a
#: collection whose large scopes are huge is probed on fewer of its stored rows.
SHORTLIST_PROBE_ROWS = 400_000


@dataclass(frozen=True, slots=True)
class Shortlist:
    """A two-phase search: the first pass that ranks the scope, and the rows it keeps for the
    exact re-rank."""

    first_pass: FirstPass
    rows: int


def shortlist_for(limit: int, first_pass: FirstPass = "codes") -> Shortlist:
    """The two-phase search of ``limit`` hits through ``first_pass``: how many of the rows
    nearest by it are re-ranked."""
    rows = max(SHORTLIST_OVERSAMPLE[first_pass] * limit, SHORTLIST_MIN_ROWS[first_pass])
    return Shortlist(first_pass, rows)


class ShortlistSearch(Protocol):
    """An unaudited vector search with a given shortlist (exact when None): what probes compare."""

    async def __call__(
        self,
        collection: str,
        scope: MemoryScope,
        vector: Any,
        limit: int,
        shortlist: Shortlist | None,
    ) -> list[MemoryHit]: ...


@dataclass(kw_only=True)
class ShortlistState:
    """A collection's two-phase path in this process, as its last probe left it."""

    #: The first pass searches take (None: exact), and each pass's recall at the last probe.
    first_pass: FirstPass | None = None
    recalls: dict[FirstPass, float] = field(default_factory=dict)
    probed_scopes: int = 0
    searches: int = 0
    probed: bool = False
    probed_at: float = 0.0
    #: Users whose scope held more than min_scope_rows rows at the last probe.
    large_users: frozenset[str] = frozenset()


class Shortlists:
    """The two-phase paths of one store's collections (see the module's docstring).

    Args:
        db: The database.
        search: Runs a vector search with a given shortlist (the probe's two searches).
        beside: Where probes that searches make due run (the store's).
    """

    def __init__(
        self,
        db: Database,
        search: ShortlistSearch,
        *,
        min_scope_rows: int = SHORTLIST_MIN_SCOPE_ROWS,
        recall_floor: float = SHORTLIST_RECALL_FLOOR,
        first_probe: int = SHORTLIST_FIRST_PROBE,
        probe_every: int = SHORTLIST_PROBE_EVERY,
        samples: int = SHORTLIST_PROBE_SAMPLES,
        beside: Beside,
    ) -> None:
        self._db = db
        self._search = search
        self._beside = beside
        self.min_scope_rows = min_scope_rows
        self.recall_floor = recall_floor
        self.first_probe = first_probe
        self.probe_every = probe_every
        self.samples = samples
        self._states: dict[str, ShortlistState] = {}

    def state(self, collection: str) -> ShortlistState:
        """The collection's state (a fresh, unprobed one if none yet)."""
        state = self._states.get(collection)
        if state is None:
            state = self._states[collection] = ShortlistState()
        return state

    async def route(self, collection: str, scope: MemoryScope, limit: int) -> Shortlist | None:
        """The two-phase search a vector search of ``scope`` makes, or None (exact).

        Counts the search; probes at the collection's ``first_probe``-th search in this
        process (in that search), then again beside the searches when due
        (:func:`probing.due <pgmemory.store.probing.due>`: ``probe_every`` searches and a
        minute), the last decision standing meanwhile. Never raises."""
        if scope.user_id is None or not self._db.first_passes or len(scope.as_dict()) != 1:
            return None
        state = self.state(collection)
        state.searches += 1
        if not state.probed:
            if state.searches >= self.first_probe:
                await self.probe(collection)
        elif due(state.searches, self.probe_every, state.probed_at):
            self._beside.start(f"shortlist {collection}", lambda: self.probe(collection))
        if scope.user_id not in state.large_users or state.first_pass is None:
            return None
        return shortlist_for(limit, state.first_pass)

    async def probe(self, collection: str) -> None:
        """Refresh the collection's large scopes and measure the path's recall on them. Never
        raises: a probe that fails leaves the path off (every search exact), logged."""
        with contextlib.suppress(Exception):
            await self.measure(collection)

    async def measure(self, collection: str) -> TwoPhaseStatus:
        """:meth:`probe`, returning what it measured and raising what made it fail (the path
        is then off)."""
        state = self.state(collection)
        # Searches arriving meanwhile see the path as probed (and keep its last decision).
        state.probed = True
        state.searches = 0
        state.probed_at = time.monotonic()
        try:
            await self._measure(collection, state)
        except Exception as exc:
            state.first_pass = None
            state.recalls = {}
            state.probed_scopes = 0
            state.large_users = frozenset()
            logger.warning(
                "two-phase probe of %s failed (%s): its searches stay exact",
                collection,
                type(exc).__name__,
            )
            raise
        logger.info(
            "two-phase path of %s: %d large scopes, recall %s over %d -> %s",
            collection,
            len(state.large_users),
            ", ".join(f"{p} {r:.4f}" for p, r in state.recalls.items()) or "n/a",
            state.probed_scopes,
            state.first_pass or "off (exact)",
        )
        return TwoPhaseStatus(
            collection=collection,
            first_passes=self._db.first_passes,
            first_pass=state.first_pass,
            recalls={str(p): r for p, r in state.recalls.items()},
            recall_floor=self.recall_floor,
            min_scope_rows=self.min_scope_rows,
            large_scopes=len(state.large_users),
            probed_scopes=state.probed_scopes,
        )

    async def _measure(self, collection: str, state: ShortlistState) -> None:
        """Each kept first pass's recall@PROBE_LIMIT on stored rows of the largest scopes;
        the first (the cheaper: codes before halves) at or above the floor is the one used."""
        params = {"collection": collection, "min_rows": self.min_scope_rows}
        async with self._db.ddl() as conn:
            result = await conn.execute(clause(q.SHORTLIST_LARGE_USERS), params)
            sizes: dict[str, int] = {str(row[0]): int(row[1]) for row in result}
            rows = await sample_largest(
                conn, collection, sizes, samples=self.samples, max_rows=SHORTLIST_PROBE_ROWS
            )
        passes = self._db.first_passes
        found = dict.fromkeys(passes, 0)
        total = 0
        limit = PROBE_LIMIT + 1  # the stored row itself is found both ways: left out below
        probed: set[str] = set()
        for user_id, own_id, embedding in rows:
            probed.add(user_id)
            scope = MemoryScope(user_id=user_id)
            exact = await self._search(collection, scope, embedding, limit, None)
            wanted = [h.memory.id for h in exact if h.memory.id != own_id][:PROBE_LIMIT]
            total += len(wanted)
            for first_pass in passes:
                two = await self._search(
                    collection, scope, embedding, limit, shortlist_for(limit, first_pass)
                )
                got = {h.memory.id for h in two if h.memory.id != own_id}
                if len(got) > PROBE_LIMIT:  # the stored row was not among them: the first 10
                    got = {h.memory.id for h in two[:PROBE_LIMIT]}
                found[first_pass] += sum(1 for i in wanted if i in got)
        state.large_users = frozenset(sizes)
        state.recalls = {p: found[p] / total for p in passes} if total else {}
        state.first_pass = next(
            (p for p in passes if state.recalls.get(p, 0.0) >= self.recall_floor), None
        )
        state.probed_scopes = len(probed)
