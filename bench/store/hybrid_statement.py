"""The hybrid search statement against the vector statement, at 100, 1,000 and 10,000 messages.

    python bench/store/hybrid_statement.py [--sizes 100 1000 10000] [--queries 100]
        [--before 81aab31] [--json bench/results/hybrid-statement.json]

One collection on a scratch database (embedded server, or PGMEMORY_DATABASE_URL), one user per
size holding that many chat messages (18 words each, conversations of 20 messages, one topic
or two per conversation, words drawn Zipf-like so a few terms match most rows). Vectors come
from a bag-of-words embedder of the benchmark's own (each word a fixed random 512-d vector,
a text the normalised sum of its words'), so similarity follows shared words and no model is
needed; queries are 5-8 words of one of the scope's messages plus two others.

Three figures per size, each query run on every side in rotating order:

* **statement**: the search statement alone (``limit=12``, audit off, precomputed query vector),
  run as the store runs it (one prepared round trip on psycopg): ``vector``, today's ``hybrid``
  and the ``before`` hybrid statement (``pgmemory/store/queries.py`` at ``--before``, read with
  ``git show``), with the default :class:`SearchWeights`;
* **end to end**: ``store.search(query=..., limit=12)`` (embedding and audit included) in vector
  and hybrid mode, and the ``before`` read path's hybrid search on the same store (left out,
  with the reason printed, when that checkout's read path does not run on today's
  ``Database``: issue 22's reference, 026b354, is such a checkout);
* **overlap**: per query, the share of the before statement's top-5 that today's top-5 holds.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np

from bench._common.layout import ranking_at, ranking_now
from bench._common.scratch import Server
from bench.retrieval.recall_ab import reads_at

DIMS = 512
COLLECTION = "hybrid"
LIMIT = 12
WORDS_PER_MESSAGE = 18
CONVERSATION = 20


# --- data ---------------------------------------------------------------------------------


def vocabulary(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` distinct pronounceable words (two to four syllables)."""
    onsets = [*"bcdfghjklmnprstvwz", "ch", "sh", "th", "br", "st", "pl", "gr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ee"]
    seen: dict[str, None] = {}
    while len(seen) < n:
        k = int(rng.integers(2, 5))
        word = "".join(onsets[rng.integers(len(onsets))] + vowels[rng.integers(len(vowels))]
                       for _ in range(k))  # fmt: skip
        seen.setdefault(word, None)
    return list(seen)


class Corpus:
    """Chat messages: Zipf-distributed common words mixed with per-conversation topic words."""

    def __init__(self, seed: int = 7, words: int = 5000, topics: int = 300) -> None:
        self.rng = np.random.default_rng(seed)
        self.words = vocabulary(words, self.rng)
        ranks = np.arange(1, words + 1, dtype=np.float64)
        self.zipf = 1 / ranks**1.05
        self.zipf /= self.zipf.sum()
        # topic words come from the less common part of the vocabulary
        self.topics = [
            self.rng.choice(np.arange(300, words), size=25, replace=False) for _ in range(topics)
        ]

    def messages(self, n: int) -> list[str]:
        out: list[str] = []
        for start in range(0, n, CONVERSATION):
            chosen = self.rng.choice(len(self.topics), size=2, replace=False)
            for _ in range(min(CONVERSATION, n - start)):
                topic = self.topics[chosen[0] if self.rng.random() < 0.7 else chosen[1]]
                common = self.rng.choice(len(self.words), size=WORDS_PER_MESSAGE, p=self.zipf)
                local = self.rng.choice(topic, size=WORDS_PER_MESSAGE)
                picks = np.where(self.rng.random(WORDS_PER_MESSAGE) < 0.4, local, common)
                out.append(" ".join(self.words[i] for i in picks))
        return out

    def query(self, message: str) -> str:
        words = message.split()
        k = int(self.rng.integers(5, 9))
        kept = list(self.rng.choice(words, size=min(k, len(words)), replace=False))
        kept += [self.words[i] for i in self.rng.choice(len(self.words), size=2, p=self.zipf)]
        return " ".join(kept)


class BagEmbedder:
    """Each word a fixed random unit vector (seeded by its sha256); a text the normalised sum."""

    model_id = "bench-bag-of-words"
    dimensions = DIMS

    def __init__(self) -> None:
        self._words: dict[str, np.ndarray] = {}

    def word(self, w: str) -> np.ndarray:
        v = self._words.get(w)
        if v is None:
            seed = int.from_bytes(hashlib.sha256(w.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32)
            self._words[w] = v
        return v

    def vector(self, text: str) -> np.ndarray:
        v = np.sum([self.word(w) for w in text.lower().split()], axis=0)
        return (v / np.linalg.norm(v)).astype(np.float32)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vector(t) for t in texts])


async def seed_users(
    store: Any, collection: str, embedder: BagEmbedder, corpus: Corpus, sizes: Sequence[int]
) -> list[str]:
    """Create ``collection`` and give user ``user{n}`` the first ``n`` corpus messages for each
    size ``n`` (conversations of CONVERSATION messages, a minute apart, user and assistant in
    turn); returns the messages."""
    from pgmemory import MemoryRecord, MemoryScope

    texts = corpus.messages(max(sizes))
    vectors = await embedder.embed(texts)
    start = datetime(2025, 1, 1, tzinfo=UTC)
    await store.create_collection(collection, dimensions=DIMS, embedding_model=embedder.model_id)
    for n in sizes:
        await store.import_records(
            collection,
            (
                MemoryRecord(
                    content=texts[i],
                    scope=MemoryScope(user_id=f"user{n}", session_id=f"c{i // CONVERSATION}"),
                    role="user" if i % 2 == 0 else "assistant",
                    message_id=f"m{i}",
                    embedding=vectors[i],
                    created_at=start + timedelta(minutes=i),
                )
                for i in range(n)
            ),
        )
    return texts


# --- the statements -----------------------------------------------------------------------


def statement_params(user: str, vector: np.ndarray, query: str) -> dict[str, Any]:
    """What :func:`pgmemory.store.reads.search` binds for a search without audit."""
    from pgmemory.store.records import SearchWeights
    from pgmemory.text import terms

    weights = SearchWeights()
    found = terms.distinct(query)
    return {
        "collection": COLLECTION,
        "user_id": user,
        "query": vector,
        "terms": terms.or_query(found),
        "term_list": found,
        "pool": max(weights.pool, LIMIT),
        "rrf_k": weights.rrf_k,
        "vector_weight": weights.vector,
        "text_weight": weights.text,
        "recency_weight": weights.recency,
        "neighbour_weight": weights.neighbour,
        "limit": LIMIT,
        "ann_candidates": max(4 * LIMIT, 40),
        "min_score": -2.0,
    }


def statement(module: Any, mode: str) -> str:
    return module.search_memories(
        ("user_id",),
        covering=True,
        audit=False,
        mode=mode,
        fusion="score",
        neighbours=mode == "hybrid",
    )


def p50(values: list[float]) -> float:
    return float(np.percentile(values, 50))


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from pgmemory import MemoryScope, MemoryStore, Settings
    from pgmemory.store._engine import fastpath

    now, before_queries = ranking_now(), ranking_at(args.before)
    before_reads = reads_at(args.before)
    #: Whether the before checkout's own read path runs on today's Database (it may not).
    before_runs = True
    embedder = BagEmbedder()
    corpus = Corpus()
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    statements = {
        "vector": statement(now, "vector"),
        "hybrid": statement(now, "hybrid"),
        "before": statement(before_queries, "hybrid"),
    }
    figures: dict[str, Any] = {}
    async with MemoryStore(url, settings=settings, embedder=embedder) as store:
        texts = await seed_users(store, COLLECTION, embedder, corpus, args.sizes)
        async with store.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            await driver.set_autocommit(True)
            await driver.execute("VACUUM (ANALYZE) pgmemory_memories")
            await driver.set_autocommit(False)

        db = store._db
        for n in args.sizes:
            user = f"user{n}"
            scope = MemoryScope(user_id=user)
            picks = corpus.rng.integers(0, n, size=args.queries + args.warm_up)
            qs = [corpus.query(texts[i]) for i in picks]
            lat: dict[str, list[float]] = {k: [] for k in statements}
            e2e: dict[str, list[float]] = {"vector": [], "hybrid": [], "before": []}
            overlaps: list[float] = []
            sides = list(statements)
            for j, qtext in enumerate(qs):
                params = statement_params(user, embedder.vector(qtext), qtext)
                tops: dict[str, list[Any]] = {}
                order = sides[j % 3 :] + sides[: j % 3]
                for side in order:
                    async with db.connections.driver_autocommit() as conn:
                        t = time.perf_counter()
                        rows = await fastpath.run(conn, statements[side], params)
                        elapsed = (time.perf_counter() - t) * 1000
                    tops[side] = [r["id"] for r in rows]
                    if j >= args.warm_up:
                        lat[side].append(elapsed)
                for side in order:
                    t = time.perf_counter()
                    if side == "before":
                        if not before_runs:
                            continue
                        try:
                            await before_reads.search(
                                db, store._catalogue, store._ann, COLLECTION, scope,
                                query=qtext, vector=None, limit=LIMIT, mode="hybrid",
                                weights=None, min_score=None, since=None, until=None,
                                allow_unscoped=False, audit=True, trace=None,
                            )  # fmt: skip
                        except AttributeError as exc:  # that checkout's Database was another
                            before_runs = False
                            print(
                                f"{args.before}'s read path does not run here ({exc}): "
                                "its end-to-end time is not measured"
                            )
                            continue
                    else:
                        await store.search(COLLECTION, scope, query=qtext, limit=LIMIT, mode=side)
                    elapsed = (time.perf_counter() - t) * 1000
                    if j >= args.warm_up:
                        e2e[side].append(elapsed)
                if j >= args.warm_up:
                    old5 = tops["before"][:5]
                    if old5:
                        overlaps.append(len(set(old5) & set(tops["hybrid"][:5])) / len(old5))
            figures[str(n)] = {
                "statement_p50_ms": {k: p50(v) for k, v in lat.items()},
                "statement_p95_ms": {k: float(np.percentile(v, 95)) for k, v in lat.items()},
                "end_to_end_p50_ms": {k: p50(v) if v else None for k, v in e2e.items()},
                "hybrid_over_vector": p50(lat["hybrid"]) / p50(lat["vector"]),
                "before_over_vector": p50(lat["before"]) / p50(lat["vector"]),
                "end_to_end_hybrid_over_vector": p50(e2e["hybrid"]) / p50(e2e["vector"]),
                "top5_overlap": float(np.mean(overlaps)) if overlaps else None,
                "queries": args.queries,
            }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--before", default="81aab31", help="git ref of the exact hybrid")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    server = Server()
    try:
        info = server.info()
        print(info)
        with server.scratch("hybrid") as url:
            figures = asyncio.run(measure(url, args))
    finally:
        server.close()
    print(f"{args.queries} queries per size, limit {LIMIT}, default SearchWeights; p50 ms")
    print(f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"{'messages':>8} | {'vector':>7} {'hybrid':>7} {'before':>7} {'ratio':>6} | "
        f"{'e2e vec':>7} {'e2e hyb':>7} {'e2e bef':>7} {'ratio':>6} | {'top5 overlap':>12}"
    )
    for n, f in figures.items():
        s, e = f["statement_p50_ms"], f["end_to_end_p50_ms"]
        before = f"{e['before']:>7.2f}" if e["before"] is not None else f"{'-':>7}"
        print(
            f"{n:>8} | {s['vector']:>7.2f} {s['hybrid']:>7.2f} {s['before']:>7.2f} "
            f"{f['hybrid_over_vector']:>5.2f}x | {e['vector']:>7.2f} {e['hybrid']:>7.2f} "
            f"{before} {f['end_to_end_hybrid_over_vector']:>5.2f}x | "
            f"{f['top5_overlap']:>12.3f}"
        )
    if args.json:
        out = {
            "before": args.before,
            "limit": LIMIT,
            "server": info,
            "cpus": os.cpu_count(),
            "load_average_after": os.getloadavg(),
            "sizes": figures,
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
