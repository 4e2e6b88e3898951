"""Exploration of recall candidates, client-side, on the same data and cached vectors as retrieval.py.

    python bench/recall_lab.py --dataset lme --slice dev
    python bench/recall_lab.py --dataset locomo

Not the benchmark of record: ``retrieval.py`` ranks in PostgreSQL through the store. This
replays the store's two rankings in numpy, exactly (cosine over the scope; the store's BM25
formula over pgmemory's terms: idf ln(1 + (N - df + 0.5) / (df + 0.5)), k1 1.2, b 0.75, a row's
length its distinct terms, avgdl over the matching rows) so that many candidates (stemming,
fusion by ranks or by normalised scores, weights, multi-vector memories, LoCoMo turn formats)
can be compared in seconds; the chosen one is then run in SQL by ``retrieval.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import retrieval as R

from pgmemory.text import terms as pgterms

# --- BM25 exactly as the store's SQL computes it ---------------------------------------------


class BM25:
    def __init__(self, texts: list[str]) -> None:
        self.tfs = [Counter(pgterms.terms(t)) for t in texts]
        self.dl = np.array([len(tf) for tf in self.tfs], dtype=float)  # distinct terms
        self.n = len(texts)
        self.df: Counter = Counter()
        for tf in self.tfs:
            self.df.update(tf.keys())

    def scores(self, query: str) -> np.ndarray:
        q = list(dict.fromkeys(t for t in pgterms.terms(query) if t != "or"))
        out = np.zeros(self.n)
        matched = [i for i, tf in enumerate(self.tfs) if any(t in tf for t in q)]
        if not matched:
            return out
        avgdl = float(np.mean(self.dl[matched]))
        for t in q:
            df = self.df.get(t, 0)
            if not df:
                continue
            idf = math.log(1 + (self.n - df + 0.5) / (df + 0.5))
            for i in matched:
                f = min(self.tfs[i].get(t, 0), 256)  # a tsvector keeps at most 256 positions
                if f:
                    out[i] += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * self.dl[i] / avgdl))
        return out


# --- chunks of a long memory ----------------------------------------------------------------


def chunk_words(parts: list[str], max_words: int) -> list[str]:
    """Consecutive parts packed into chunks of at most ``max_words`` words (longer parts split)."""
    chunks: list[str] = []
    cur: list[str] = []
    n = 0
    for part in parts:
        words = part.split()
        while len(words) > max_words:
            if cur:
                chunks.append(" ".join(cur))
                cur, n = [], 0
            chunks.append(" ".join(words[:max_words]))
            words = words[max_words:]
        if not words:
            continue
        if n + len(words) > max_words and cur:
            chunks.append(" ".join(cur))
            cur, n = [], 0
        cur.extend(words)
        n += len(words)
    if cur:
        chunks.append(" ".join(cur))
    return chunks or [""]


def lme_parts(path: Path) -> dict[str, list[str]]:
    raw = json.loads(gzip.decompress(path.read_bytes()))
    return {
        sid: [t["content"] for t in turns if t["role"] == "user"]
        for sid, turns in raw["sessions"].items()
    }


# --- fusion -----------------------------------------------------------------------------------


def ranks_of(scores: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """1-based rank per item by descending score (ties by index); inf where mask is False."""
    order = np.argsort(-scores, kind="stable")
    r = np.empty(len(scores))
    r[order] = np.arange(1, len(scores) + 1)
    if mask is not None:
        r[~mask] = np.inf
    return r


def minmax(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    m = np.ones(len(x), bool) if mask is None else mask
    if not m.any():
        return np.zeros(len(x))
    lo, hi = x[m].min(), x[m].max()
    out = (x - lo) / (hi - lo) if hi > lo else np.where(m, 1.0, 0.0)
    return np.where(m, out, 0.0)


# --- the lab --------------------------------------------------------------------------------


async def embed_all(name: str, texts: list[str], threads: int, desc: str) -> dict[str, np.ndarray]:
    emb = R.make_embedder(name, threads, R.CACHE_DIR)
    await emb.warm(texts, desc=desc)
    vecs = await emb.embed(texts)
    return dict(zip(texts, vecs, strict=True))


def evaluate(dataset: str, data: R.Dataset, rankers: dict[str, Any]) -> dict[str, dict[str, float]]:
    names = R.LME_METRICS if dataset == "lme" else R.LOCOMO_METRICS
    out = {}
    for label, fn in rankers.items():
        rows = []
        for q in data.questions:
            ranked = fn(q)
            rows.append(R.score(dataset, ranked, q))
        out[label] = R.mean_scores(rows, names)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", choices=("lme", "locomo"), default="lme")
    ap.add_argument("--slice", choices=("dev", "test"), default="dev")
    ap.add_argument("--data-dir", default=str(R.DEFAULT_DATA_DIR))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--embedders", nargs="+", default=["use", "minilm"])
    ap.add_argument(
        "--chunk-words", type=int, default=0, help="multi-vector memories of N-word chunks (LME)"
    )
    ap.add_argument("--locomo-doc", choices=("speaker", "plain"), default="speaker")
    ap.add_argument(
        "--grid", action="store_true", help="print the fusion grid, not just the named rows"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--norm-weights",
        type=float,
        nargs="*",
        default=[],
        help="only score fusion (BM25 / its max) at these text weights, with and without chunks",
    )
    ap.add_argument(
        "--warm-only", action="store_true", help="only fill the embedding cache (any slice)"
    )
    args = ap.parse_args()
    if args.dataset == "lme" and args.slice == "test" and not args.warm_only:
        ap.error("the lab explores on lme_s_dev and LoCoMo only")
    R.LOCOMO_DOC = args.locomo_doc
    data_dir = Path(args.data_dir)
    if args.dataset == "lme":
        path = data_dir / f"lme_s_{args.slice}.json.gz"
        data = R.load_lme(path)
        parts = lme_parts(path) if args.chunk_words else {}
    else:
        data = R.load_locomo(data_dir / "locomo10.json.gz")
        parts = {}
    t0 = time.perf_counter()
    docs_by_scope = data.scopes
    all_texts = sorted({d.text for docs in docs_by_scope.values() for d in docs})
    q_texts = sorted({q.text for q in data.questions})
    chunks: dict[str, list[str]] = {}
    if args.chunk_words:
        # the memory's own vector stays (it sees the prefix, MiniLM truncating at 256 word
        # pieces); the extra vectors are the chunks after the first (turns packed into chunks of
        # at most N words): nothing to add for a memory of one chunk
        for docs in docs_by_scope.values():
            for d in docs:
                chunks[d.key] = chunk_words(parts[d.key], args.chunk_words)[1:]
    chunk_texts = sorted({c for cs in chunks.values() for c in cs})
    vec: dict[str, dict[str, np.ndarray]] = {}
    for e in args.embedders:
        vec[e] = asyncio.run(
            embed_all(e, all_texts + q_texts + chunk_texts, args.threads, f"embed ({e})")
        )
    print(f"embedded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.warm_only:
        return

    # per scope: BM25 (stemmed and not), doc matrices, chunk matrices
    per_scope: dict[str, dict[str, Any]] = {}
    for scope, docs in docs_by_scope.items():
        texts = [d.text for d in docs]
        s: dict[str, Any] = {
            "keys": [d.key for d in docs],
            "created": np.array([d.created_at.timestamp() for d in docs]),
        }
        pgterms.STEMMING = False
        s["bm25_plain"] = BM25(texts)
        pgterms.STEMMING = True
        s["bm25_stem"] = BM25(texts)
        for e in args.embedders:
            s[f"M_{e}"] = np.stack([vec[e][t] for t in texts])
            if chunks:
                owner, rows = [], []
                for i, d in enumerate(docs):
                    for c in [d.text, *chunks[d.key]]:
                        owner.append(i)
                        rows.append(vec[e][c])
                s[f"C_{e}"] = (np.array(owner), np.stack(rows))
        per_scope[scope] = s

    # per question: raw signals
    signals: dict[str, dict[str, np.ndarray]] = {}
    for q in data.questions:
        s = per_scope[q.scope]
        sig: dict[str, np.ndarray] = {}
        pgterms.STEMMING = False
        sig["bm25_plain"] = s["bm25_plain"].scores(q.text)
        pgterms.STEMMING = True
        sig["bm25_stem"] = s["bm25_stem"].scores(q.text)
        for e in args.embedders:
            qv = vec[e][q.text]
            sig[f"cos_{e}"] = s[f"M_{e}"] @ qv
            if chunks:
                owner, C = s[f"C_{e}"]
                cs = C @ qv
                best = np.full(len(s["keys"]), -1.0)
                np.maximum.at(best, owner, cs)
                sig[f"chunkmax_{e}"] = best
        sig["recency"] = -ranks_of(s["created"])  # newest first
        signals[q.qid] = sig

    def keys_for(q: R.Question, score: np.ndarray) -> list[str]:
        s = per_scope[q.scope]
        order = np.argsort(-score, kind="stable")
        return [s["keys"][i] for i in order[:50]]

    def rrf_fn(parts_w: dict[str, float], k: int, pool: int = 50):
        def f(q: R.Question) -> list[str]:
            sig = signals[q.qid]
            total = np.zeros(len(per_scope[q.scope]["keys"]))
            for name, w in parts_w.items():
                x = sig[name]
                mask = x > 0 if name.startswith("bm25") else None
                r = ranks_of(x, mask)
                r[r > pool] = np.inf
                total += w / (k + r)
            return keys_for(q, total)

        return f

    def norm_fn(parts_w: dict[str, float], how: str = "minmax"):
        def f(q: R.Question) -> list[str]:
            sig = signals[q.qid]
            total = np.zeros(len(per_scope[q.scope]["keys"]))
            for name, w in parts_w.items():
                x = sig[name]
                if name.startswith("bm25"):
                    m = x > 0
                    if how == "max":
                        total += w * (x / x.max() if m.any() else 0)
                    else:
                        total += w * minmax(x, m)
                elif name == "recency":
                    total += w * minmax(x)
                else:
                    if how == "z":
                        total += w * (x - x.mean()) / (x.std() + 1e-9)
                    elif how == "raw":
                        total += w * x
                    else:
                        total += w * minmax(x)
            return keys_for(q, total)

        return f

    def single(name: str):
        return lambda q: keys_for(q, signals[q.qid][name])

    def text_only(name: str):
        def f(q: R.Question) -> list[str]:
            x = signals[q.qid][name]
            s = per_scope[q.scope]
            order = [i for i in np.argsort(-x, kind="stable") if x[i] > 0]
            return [s["keys"][i] for i in order[:50]]

        return f

    rankers: dict[str, Any] = {
        "text (plain terms)": text_only("bm25_plain"),
        "text (stemmed)": text_only("bm25_stem"),
    }
    for e in args.embedders:
        rankers[f"vector-{e}"] = single(f"cos_{e}")
        if chunks:
            rankers[f"vector-{e} chunkmax"] = single(f"chunkmax_{e}")
            rankers[f"vector-{e} doc+chunkmax"] = lambda q, e=e: keys_for(
                q, signals[q.qid][f"cos_{e}"] + signals[q.qid][f"chunkmax_{e}"]
            )
        for bm in ("bm25_plain", "bm25_stem"):
            tag = "stem" if bm == "bm25_stem" else "plain"
            rankers[f"rrf {e}+{tag} w1 k60 (today's default)"] = rrf_fn(
                {f"cos_{e}": 1.0, bm: 1.0}, 60
            )
        v = f"chunkmax_{e}" if chunks else f"cos_{e}"
        vt = "chunkmax" if chunks else "cos"
        if args.grid:
            for wt in (0.25, 0.5, 1.0, 2.0):
                for k in (5, 20, 60):
                    rankers[f"rrf {e}:{vt}+stem w{wt} k{k}"] = rrf_fn({v: 1.0, "bm25_stem": wt}, k)
            for how in ("minmax", "max", "z"):
                grid = (0.1, 0.2, 0.3, 0.5, 1.0) if how != "z" else (0.5, 1.0, 2.0)
                for wt in grid:
                    rankers[f"norm-{how} {e}:{vt}+stem w{wt}"] = norm_fn(
                        {v: 1.0, "bm25_stem": wt}, how
                    )
        else:
            for wt in (0.2, 0.3, 0.5):
                rankers[f"norm-minmax {e}:{vt}+stem w{wt}"] = norm_fn({v: 1.0, "bm25_stem": wt})
    if len(args.embedders) == 2 and args.grid:
        a, b = args.embedders
        va = f"chunkmax_{a}" if chunks else f"cos_{a}"
        vb = f"chunkmax_{b}" if chunks else f"cos_{b}"
        for wt in (0.2, 0.3, 0.5):
            rankers[f"norm-minmax {a}+{b}+stem w{wt}"] = norm_fn(
                {va: 0.5, vb: 0.5, "bm25_stem": wt}
            )
        rankers["rrf use+minilm+stem k60"] = rrf_fn({va: 1.0, vb: 1.0, "bm25_stem": 1.0}, 60)

    if args.norm_weights:
        rankers = {
            k: v for k, v in rankers.items() if k.startswith(("text", "vector")) or "today" in k
        }
        for e in args.embedders:
            for v in [f"cos_{e}"] + ([f"chunkmax_{e}"] if chunks else []):
                for wt in args.norm_weights:
                    rankers[f"norm-max {e}:{v.split('_')[0]}+stem w{wt}"] = norm_fn(
                        {v: 1.0, "bm25_stem": wt}, "max"
                    )
    results = evaluate(args.dataset, data, rankers)
    names = R.LME_METRICS if args.dataset == "lme" else R.LOCOMO_METRICS
    R.print_table(
        f"lab: {data.name} ({len(data.questions)} q), chunk_words={args.chunk_words}, locomo_doc={args.locomo_doc}",
        results,
        names,
        {},
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "dataset": args.dataset,
                    "slice": data.name,
                    "chunk_words": args.chunk_words,
                    "locomo_doc": args.locomo_doc,
                    "configs": results,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
