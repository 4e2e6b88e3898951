"""Start-up figures of a fresh process, printed as one JSON line (run by bench/store/scale.py).

    python bench/store/_startup.py import
    python bench/store/_startup.py recall URL NPZ QUERY_INDEX

``import``: seconds to ``import pgmemory``. ``recall``: the same, then to get ``MemoryStore``
(``pgmemory`` imports its store lazily), to open a store on URL (an existing database at
head), its first scoped top-3 search (one of NPZ's recall queries, audit on: new connection,
catalogue read, statement prepared) and its second.
"""

from __future__ import annotations

import json
import os
import sys
import time

# The repo root first (this checkout's pgmemory, bench.peers), with os.path: pathlib would be
# imported before the clock starts and taken out of the import figure.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

started = time.perf_counter()
import pgmemory  # noqa: E402, F401

imported = time.perf_counter() - started


async def recall(url: str, npz: str, j: int) -> dict[str, float]:
    import numpy as np

    from bench.peers import _harness as h

    z = np.load(npz, allow_pickle=False)
    vector, user = z["q_vec"][j], h.user_name(z["q_user"][j])
    t = time.perf_counter()
    from pgmemory import MemoryScope, MemoryStore, Settings

    store_imported = time.perf_counter() - t
    t = time.perf_counter()
    store = await MemoryStore(url, settings=Settings(_env_file=None)).open()  # type: ignore[call-arg]
    opened = time.perf_counter() - t
    scope = MemoryScope(user_id=user)
    times = []
    for _ in range(2):
        t = time.perf_counter()
        await store.search("scale", scope, vector=vector, limit=3)
        times.append(time.perf_counter() - t)
    await store.close()
    return {
        "store_import_s": store_imported,
        "open_s": opened,
        "first_recall_s": times[0],
        "second_recall_s": times[1],
    }


if __name__ == "__main__":
    out: dict[str, float] = {"import_s": imported}
    if sys.argv[1] == "recall":
        import asyncio

        out.update(asyncio.run(recall(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    print(json.dumps(out))
