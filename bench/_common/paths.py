"""Where the benchmarks keep things (the same folders whichever group a script is in)."""

from __future__ import annotations

from pathlib import Path

#: ``bench/``.
BENCH = Path(__file__).resolve().parents[1]
#: The repository (``examples/``, ``tests/``, ``pgmemory/``).
ROOT = BENCH.parent
#: Data draws, embeddings and the sized embedded server (gitignored).
CACHE = BENCH / ".cache"
#: One virtualenv per peer (gitignored).
PEER_ENVS = BENCH / ".peers"
#: The peer adapters and their measurement loop.
PEERS = BENCH / "peers"
#: The JSON figures the READMEs quote.
RESULTS = BENCH / "results"
#: LongMemEval and LoCoMo: ``shared/bench-data`` in the nearest folder above that has one (the
#: data sets are not redistributable, so they are never copied into the repository).
DATA = next(
    (p / "shared" / "bench-data" for p in BENCH.parents if (p / "shared" / "bench-data").is_dir()),
    ROOT.parent / "shared" / "bench-data",
)
