"""What the audit's guard (migration 0006) costs a recall, side by side in one run.

    python bench/store/audit_guard.py [--queries 400] [--rows 500] [--dims 16]

One scratch database; one user's scope of ``--rows`` memories. Every round runs a block of
recalls in each configuration, in turn, so drift hits all alike:

* ``0006 as shipped``: the recall audit row's query hash keyed by ``pgmemory_keyed_sha256``
  (one index lookup of the user's secret) and stamped with ``row_sha256`` by the guard trigger;
* ``guard trigger off``: the same without the trigger (its cost is the difference);
* ``plain hash, trigger off``: the keyed-hash function replaced by one returning its input
  (the pre-0006 cost of the audit row);
* ``audit off``: no audit row at all.

Then the per-row cost of each part, from 20,000-row INSERT ... SELECT into the recall audit.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np
from sqlalchemy import text

from bench._common.scratch import Server
from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings

_TRIGGER = "ALTER TABLE pgmemory_recall_audit {} TRIGGER pgmemory_audit_guard"
_KEYED = """
CREATE OR REPLACE FUNCTION pgmemory_keyed_sha256(p_user_id text, p_sha256 text) RETURNS text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER AS $$
DECLARE
    s bytea;
BEGIN
    SELECT secret INTO s FROM pgmemory_user_secrets WHERE user_id = p_user_id;
    RETURN encode(sha256(s || decode(p_sha256, 'hex')), 'hex');
END
$$
"""
_PLAIN = """
CREATE OR REPLACE FUNCTION pgmemory_keyed_sha256(p_user_id text, p_sha256 text) RETURNS text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER AS $$ BEGIN RETURN p_sha256; END $$
"""
_BULK = """
INSERT INTO pgmemory_recall_audit
    (user_id, collection, application_id, agent_id, session_id, query_sha256, memory_ids, scores)
SELECT 'bench', 'bench', '', '', '', {hash}, '{{}}', '{{}}'
FROM generate_series(1, :n)
"""
_SHA = "encode(sha256(CAST(random()::text AS bytea)), 'hex')"


async def configure(store: MemoryStore, name: str) -> None:
    async with store.engine.begin() as conn:
        trigger = "ENABLE" if name == "0006 as shipped" else "DISABLE"
        await conn.execute(text(_TRIGGER.format(trigger)))
        await conn.execute(text(_PLAIN if name == "plain hash, trigger off" else _KEYED))


async def bulk(store: MemoryStore, *, keyed: bool, trigger: bool, n: int) -> float:
    """Microseconds per row of an n-row INSERT ... SELECT into the recall audit (rolled back)."""
    async with store.engine.connect() as conn:
        tx = await conn.begin()
        await conn.execute(text(_TRIGGER.format("ENABLE" if trigger else "DISABLE")))
        hash_sql = f"pgmemory_keyed_sha256('bench', {_SHA})" if keyed else _SHA
        t = time.perf_counter()
        await conn.execute(text(_BULK.format(hash=hash_sql)), {"n": n})
        elapsed = time.perf_counter() - t
        await tx.rollback()
    return elapsed / n * 1e6


async def run(url: str, queries: int, rows: int, dims: int) -> None:
    rng = np.random.default_rng(0)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(url, settings=settings) as store:
        await store.create_collection("bench", dimensions=dims, embedding_model="random")
        scope = MemoryScope(user_id="bench")
        vectors = rng.standard_normal((rows, dims)).astype(np.float32)
        await store.add(
            "bench",
            [
                MemoryRecord(content=f"memory {i}", scope=scope, embedding=v)
                for i, v in enumerate(vectors)
            ],
        )
        async with store.engine.begin() as conn:
            # Without the trigger nothing fills row_sha256 (NOT NULL): a default, for this run.
            await conn.execute(
                text("ALTER TABLE pgmemory_recall_audit ALTER COLUMN row_sha256 SET DEFAULT ''")
            )
        names = ["0006 as shipped", "guard trigger off", "plain hash, trigger off", "audit off"]
        timings: dict[str, list[float]] = {name: [] for name in names}
        probes = rng.standard_normal((queries, dims)).astype(np.float32)
        # Blocks of BLOCK recalls per configuration (a configuration change is DDL, which makes
        # the next statements plan again: the first WARM recalls of a block are not timed).
        block, warm = 50, 5
        for start in range(0, queries, block):
            for name in names:
                await configure(store, name)
                for i in range(start - warm, min(start + block, queries)):
                    t = time.perf_counter()
                    await store.search(
                        "bench", scope, vector=probes[i], limit=3, audit=name != "audit off"
                    )
                    if i >= start:
                        timings[name].append((time.perf_counter() - t) * 1000)
        await configure(store, "0006 as shipped")
        print(f"recall, exact top-3 of a {rows}-row scope, {dims}-d, {queries} rounds:")
        base = float(np.percentile(timings["audit off"], 50))
        for name in names:
            p50 = float(np.percentile(timings[name], 50))
            p95 = float(np.percentile(timings[name], 95))
            print(f"  {name:<26} p50 {p50:6.3f} ms  p95 {p95:6.3f} ms  (p50 +{p50 - base:.3f})")
        n = 20_000
        print(f"recall-audit INSERT ... SELECT of {n:,} rows, per row:")
        for keyed, trigger in ((True, True), (True, False), (False, True), (False, False)):
            cost = await bulk(store, keyed=keyed, trigger=trigger, n=n)
            label = (
                f"{'keyed hash' if keyed else 'plain hash'}, trigger {'on' if trigger else 'off'}"
            )
            print(f"  {label:<26} {cost:6.2f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--dims", type=int, default=16)
    args = parser.parse_args()
    server = Server()
    print(server.info())
    with server.scratch("audit_guard") as url:
        asyncio.run(run(url, args.queries, args.rows, args.dims))


if __name__ == "__main__":
    main()
