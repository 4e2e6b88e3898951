"""A posting table for the keyword side, measured beside the store's own: its reads and its writes.

    python bench/store/keyword_postings.py [--sizes 1000 10000] [--queries 100] [--json F]

A study for issue 22's keyword side; nothing of it is in the library. The store finds a user's
rows holding a query term through the scoped term index (a GIN index: it returns row ids only),
then reads each (term, row) pair's row from the heap for the term's frequency and the row's
length. Here the same numbers are kept in a table of their own, one row per memory and distinct
term, ``(collection, user_id, term, id, tf, dl)``, under a B-tree on ``(collection, user_id,
term) INCLUDE (id, tf, dl)``: a query term's postings are then one index-only range read.

Data: ``bench/store/hybrid_statement.py``'s (one user per size, 18-word chat messages drawn
Zipf-like, so a few terms match most rows; its queries). The posting table is built from the
stored rows' ``search_vector`` once they are seeded.

* **reads**, per size, each query run on every side in rotating order on the store's own
  connection (prepared, generic plans): ``store text``, the statement
  ``store.search(mode="text", limit=50, audit=False)`` sends (captured); ``postings``, BM25
  with the store's formula (k1 1.2, b 0.75, idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``, N
  the scope's live rows, the average length over the rows holding a query term) over the
  posting table, best 50, N counted in the statement as the text statement counts it; and
  ``postings, N given``, the same with N passed in, as the hybrid and recall statements have
  it (a count of their candidates; both postings sides must give the same scores). Also the
  share of the store's top 10 that the postings' top 10 holds (1.000 where the store's
  ranking is exact; its bounded pool above 2,000 rows is not);
* **writes**: ``store.add`` of two memories into the first size's user, as shipped; with the
  posting table kept by a statement-level trigger (a library would write the postings in its
  own insert statements: Citus runs triggers on distributed tables only with
  ``citus.enable_unsafe_triggers``); the same with the scoped term index dropped (which the
  postings would replace); and with neither.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np

from bench._common.scratch import Server
from bench.store.hybrid_statement import COLLECTION, BagEmbedder, Corpus, seed_users

BUILD_POSTINGS = """
CREATE TABLE scratch_postings AS
SELECT m.collection, m.user_id, t.lexeme AS term, m.id,
       cardinality(t.positions) AS tf, length(m.search_vector) AS dl
FROM pgmemory_memories AS m, unnest(m.search_vector) AS t
"""
INDEX_POSTINGS = (
    "CREATE INDEX scratch_postings_terms ON scratch_postings (collection, user_id, term) "
    "INCLUDE (id, tf, dl)"
)
#: BM25 of the query's terms over the posting table, best 50 (the store's formula).
POSTINGS_BM25 = """
WITH q AS (SELECT DISTINCT unnest(CAST(%(terms)s AS text[])) AS term),
p AS (
    SELECT q.term, s.id, s.tf, s.dl
    FROM q CROSS JOIN LATERAL (
        SELECT s.id, s.tf, s.dl FROM scratch_postings AS s
        WHERE s.collection = %(collection)s AND s.user_id = %(user_id)s AND s.term = q.term
    ) AS s
),
n AS ({scope_size}),
df AS (SELECT term, CAST(count(*) AS float8) AS df FROM p GROUP BY term),
ranked AS (SELECT CAST(avg(dl) AS float8) AS avgdl FROM (SELECT DISTINCT id, dl FROM p) AS r),
idf AS (SELECT df.term, ln(1 + (n.n - df.df + 0.5) / (df.df + 0.5)) AS idf FROM df CROSS JOIN n),
bm25 AS (
    SELECT p.id, sum(i.idf * p.tf * 2.2 / (p.tf + 0.3 + 0.9 / r.avgdl * p.dl)) AS relevance
    FROM p JOIN idf AS i USING (term) CROSS JOIN ranked AS r
    GROUP BY p.id
)
SELECT id, relevance FROM bm25 ORDER BY relevance DESC, id LIMIT 50
"""
#: N counted in the statement, as the store's text statement counts it ...
COUNTED = """SELECT CAST(count(*) AS float8) AS n FROM pgmemory_memories AS m
    WHERE m.collection = %(collection)s AND m.user_id = %(user_id)s
      AND (m.expires_at IS NULL OR m.expires_at > now())"""
#: ... or given, as the hybrid and recall statements have it (a count of their candidates).
GIVEN = "SELECT CAST(%(n)s AS float8) AS n"
SIDES: dict[str, str] = {
    "store text": "",  # the store's own statement, captured per query
    "postings": POSTINGS_BM25.format(scope_size=COUNTED),
    "postings, N given": POSTINGS_BM25.format(scope_size=GIVEN),
}
POSTINGS_TRIGGER = """
CREATE FUNCTION scratch_post() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO scratch_postings
    SELECT n.collection, n.user_id, t.lexeme, n.id, cardinality(t.positions),
           length(n.search_vector)
    FROM new_rows AS n, unnest(n.search_vector) AS t;
    RETURN NULL;
END $$;
CREATE TRIGGER scratch_post AFTER INSERT ON pgmemory_memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION scratch_post();
"""


def p50(values: list[float]) -> float:
    return float(np.percentile(values, 50))


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
    from pgmemory.store._engine import fastpath

    embedder = BagEmbedder()
    corpus = Corpus()
    captured: list[tuple[str, dict[str, Any]]] = []
    run = fastpath.run

    async def spy(conn: Any, statement: str, params: Any, **options: Any) -> Any:
        captured.append((statement, dict(params)))
        return await run(conn, statement, params, **options)

    figures: dict[str, Any] = {"reads": {}, "writes": {}}
    settings = Settings(_env_file=None)
    async with MemoryStore(url, settings=settings, embedder=embedder) as store:
        texts = await seed_users(store, COLLECTION, embedder, corpus, args.sizes)
        raw = await psycopg.AsyncConnection.connect(
            url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
        )
        try:
            t = time.perf_counter()
            await raw.execute(BUILD_POSTINGS)
            await raw.execute(INDEX_POSTINGS)
            await raw.execute("VACUUM ANALYZE scratch_postings")
            row = await (await raw.execute("SELECT count(*) FROM scratch_postings")).fetchone()
            postings = int(row[0]) if row else 0
            figures["postings"] = {"rows": postings, "build_s": time.perf_counter() - t}
            print(f"posting table: {postings} rows, built in {time.perf_counter() - t:.2f} s")
            for n in args.sizes:
                scope = MemoryScope(user_id=f"user{n}")
                calls = []
                for i in corpus.rng.integers(0, n, size=args.queries):
                    captured.clear()
                    fastpath.run = spy
                    try:
                        await store.search(
                            COLLECTION, scope, query=corpus.query(texts[i]), mode="text",
                            limit=50, audit=False,
                        )  # fmt: skip
                    finally:
                        fastpath.run = run
                    calls.append(captured[0])
                lat: dict[str, list[float]] = {side: [] for side in SIDES}
                overlap = []
                async with store.database.connections.driver_autocommit() as conn:
                    for j, (statement, params) in enumerate(calls):
                        got: dict[str, list[str]] = {}
                        scores: dict[str, list[float]] = {}
                        sides = list(SIDES)
                        for side in sides[j % len(sides) :] + sides[: j % len(sides)]:
                            t0 = time.perf_counter()
                            if side == "store text":
                                rows = await fastpath.run(conn, statement, params)
                                got[side] = [str(r["id"]) for r in rows[:10]]
                            else:
                                cursor = conn.cursor()
                                await cursor.execute(
                                    SIDES[side],
                                    {
                                        "terms": params["term_list"],
                                        "collection": COLLECTION,
                                        "user_id": scope.user_id,
                                        "n": n,
                                    },
                                    prepare=True,
                                )
                                found = (await cursor.fetchall())[:10]
                                got[side] = [str(r[0]) for r in found]
                                scores[side] = [round(float(r[1]), 9) for r in found]
                            if j >= args.warm_up:
                                lat[side].append((time.perf_counter() - t0) * 1000)
                        store_top = got["store text"]
                        overlap.append(
                            len(set(store_top) & set(got["postings"])) / max(1, len(store_top))
                        )
                        # the same scores (sums in another order may swap the ids of near ties)
                        if scores["postings"] != scores["postings, N given"]:
                            raise SystemExit(f"{n} messages, query {j}: N counted != N given")
                s = {side: p50(v) for side, v in lat.items()}
                sized: dict[str, Any] = {
                    "p50_ms": s,
                    "p95_ms": {side: float(np.percentile(v, 95)) for side, v in lat.items()},
                    "top10_overlap": float(np.mean(overlap)),
                    "queries": len(lat["postings"]),
                }
                figures["reads"][str(n)] = sized
                print(
                    f"{n:>6} messages, p50: store text {s['store text']:.3f} ms, postings "
                    f"{s['postings']:.3f} ms ({s['postings'] / s['store text']:.2f}x), N given "
                    f"{s['postings, N given']:.3f} ms; top-10 overlap {sized['top10_overlap']:.3f}",
                    flush=True,
                )

            writer = MemoryScope(user_id=f"user{args.sizes[0]}", session_id="writes")
            vectors = await embedder.embed(texts[:400])
            written = [0]

            async def add_two() -> None:
                i = written[0]
                written[0] += 2
                await store.add(
                    COLLECTION,
                    [
                        MemoryRecord(
                            content=texts[(i + k) % 400], scope=writer, role="user",
                            embedding=vectors[(i + k) % 400],
                        )
                        for k in range(2)
                    ],
                )  # fmt: skip

            async def timed(label: str, step: Callable[[], Awaitable[None]]) -> None:
                for _ in range(30):
                    await step()
                lat = []
                for _ in range(args.writes):
                    t0 = time.perf_counter()
                    await step()
                    lat.append((time.perf_counter() - t0) * 1000)
                figures["writes"][label] = {
                    "p50_ms": p50(lat),
                    "p95_ms": float(np.percentile(lat, 95)),
                }
                print(f"store.add of 2, {label}: {p50(lat):.3f} ms p50", flush=True)

            await timed("as shipped", add_two)
            await raw.execute(POSTINGS_TRIGGER)
            await timed("+ posting table (trigger)", add_two)
            await raw.execute("DROP INDEX ix_pgmemory_memories_scope_terms")
            await timed("+ posting table, scoped term index dropped", add_two)
            await raw.execute("DROP TRIGGER scratch_post ON pgmemory_memories")
            await timed("neither posting table nor scoped term index", add_two)
        finally:
            await raw.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--warm-up", type=int, default=10, help="queries left out of the figures")
    parser.add_argument("--writes", type=int, default=300, help="timed store.add calls a variant")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    server = Server()
    info = server.info()
    print(info)
    try:
        with server.scratch("keyword_postings") as url:
            figures = asyncio.run(measure(url, args))
    finally:
        server.close()
    if args.json:
        args.json.write_text(json.dumps({"server": info, **figures}, indent=2) + "\n")


if __name__ == "__main__":
    main()
