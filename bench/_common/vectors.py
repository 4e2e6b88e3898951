"""Real sentence embeddings for the store benchmarks: the USE vectors that ``bench/retrieval``
cached for LongMemEval's and LoCoMo's texts (about 21,000 distinct ones), read, never computed.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from bench._common.paths import CACHE

#: The model id the retrieval benchmark caches USE vectors under.
USE_MODEL = "google/universal-sentence-encoder-multilingual-3"
#: Where ``bench/retrieval`` keeps its embeddings.
USE_CACHE = CACHE / "embeddings.sqlite"


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1, as float32."""
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def use_vectors(paths: list[Path], dims: int) -> np.ndarray:
    """Every distinct cached USE vector in ``paths`` (SQLite caches of bench/retrieval), unit
    length, in the caches' order; exits naming the fix when there are none."""
    seen: dict[bytes, np.ndarray] = {}
    for p in paths:
        if not p.exists():
            continue
        with sqlite3.connect(f"file:{p}?mode=ro", uri=True) as c:
            for sha, vec in c.execute("SELECT sha, vec FROM emb WHERE model = ?", (USE_MODEL,)):
                seen[bytes(sha)] = np.frombuffer(vec, dtype=np.float32)
    if not seen:
        raise SystemExit(
            f"no USE embeddings in {', '.join(map(str, paths))}: run `python "
            "bench/retrieval/retrieval.py --dataset lme --slice dev` and `--dataset locomo` first"
        )
    x = np.stack(list(seen.values()))
    if x.shape[1] != dims:
        raise SystemExit(f"USE vectors have {x.shape[1]} dimensions, not {dims}")
    return unit(x)
