"""A study for bounding the keyword side: match only on a query's rare terms, and what it costs.

    python bench/retrieval/keyword_bound.py [--dataset locomo|lme] [--slice dev] [--json F]

The hybrid statement's keyword side (BM25 over the scope, ``pgmemory.store.queries``) reads
every scope row holding any query term; with common words among the terms that is most of the
scope, and the statement's time grows with it (``bench/store/hybrid_statement.py``). One way to
bound it: a term held by more than ``cap`` rows of the scope (found with a capped count, so at
most ``cap`` rows read per term) is *common*; only rows holding a rare term are matched (at
most ``cap`` per rare term), and common terms still score those rows, with their document
frequency taken as ``cap`` (all the capped count can tell). This replays both on a data set,
client-side in Python with the store's own terms (``pgmemory.text.terms``), and reports per
cap (a fraction of the scope's rows, at least ``--floor`` rows): the rows matched (the work), the overlap of the bounded BM25 pool (top 50, the hybrid
statement's default pool) and top 5 with the exact ones, and keyword-only recall@5 against the
data set's evidence. No database is involved: this says what the bound would change, not how
fast the SQL would be.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from bench._common.paths import DATA
from bench.retrieval._datasets import load_lme, load_locomo, score
from pgmemory.text import terms

POOL = 50
CAPS: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2)


def bm25(
    query: list[str],
    docs: list[Counter[str]],
    rows: list[int],
    df: dict[str, float],
    n: int,
) -> list[tuple[float, int]]:
    """BM25 (k1 1.2, b 0.75) of ``rows`` as the SQL scores them: a row's length is its number
    of distinct terms, against the average over the rows scored."""
    if not rows:
        return []
    avgdl = mean(len(docs[i]) for i in rows)
    scored = []
    for i in rows:
        dl = len(docs[i])
        total = 0.0
        for t in query:
            tf = docs[i].get(t, 0)
            if tf and t in df:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                total += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / avgdl))
        scored.append((total, i))
    scored.sort(key=lambda pair: (-pair[0], pair[1]))
    return scored


def study(dataset: Any, name: str, *, floor: int = 0) -> dict[str, Any]:
    per_cap: dict[str, dict[str, list[float]]] = {
        f"{cap:g}": {"matched": [], "pool_overlap": [], "top5_overlap": [], "recall5": []}
        for cap in CAPS
    }
    exact_matched: list[float] = []
    exact_recall: list[float] = []
    scope_sizes: list[int] = []
    cache: dict[str, tuple[list[str], list[Counter[str]]]] = {}
    for q in dataset.questions:
        docs = dataset.scopes[q.scope]
        if q.scope not in cache:
            cache[q.scope] = ([d.key for d in docs], [Counter(terms.terms(d.text)) for d in docs])
        keys, bags = cache[q.scope]
        n = len(bags)
        query = list(dict.fromkeys(terms.terms(q.text)))
        holders = {t: [i for i, bag in enumerate(bags) if t in bag] for t in query}
        df = {t: float(len(rows)) for t, rows in holders.items() if rows}
        matched = sorted({i for rows in holders.values() for i in rows})
        exact = bm25(query, bags, matched, df, n)
        exact_keys = [keys[i] for s, i in exact if s > 0]
        scope_sizes.append(n)
        exact_matched.append(len(matched))
        exact_recall.append(score(name, exact_keys[:10], q)[_metric(name)])
        for cap in CAPS:
            limit = max(1, floor, int(cap * n))
            rare = [t for t in query if 0 < df.get(t, 0) <= limit]
            rows = sorted({i for t in rare for i in holders[t]})
            estimated = {t: (df[t] if t in rare else float(limit)) for t in df}
            bounded = bm25(query, bags, rows, estimated, n)
            bounded_keys = [keys[i] for s, i in bounded if s > 0]
            row = per_cap[f"{cap:g}"]
            row["matched"].append(len(rows))
            row["pool_overlap"].append(_overlap(exact_keys[:POOL], bounded_keys[:POOL]))
            row["top5_overlap"].append(_overlap(exact_keys[:5], bounded_keys[:5]))
            row["recall5"].append(score(name, bounded_keys[:10], q)[_metric(name)])
    return {
        "dataset": name,
        "questions": len(dataset.questions),
        "scope_rows_mean": mean(scope_sizes),
        "floor": floor,
        "exact": {"matched_mean": mean(exact_matched), "recall5": mean(exact_recall)},
        "caps": {
            cap: {key: mean(values) for key, values in figures.items()}
            for cap, figures in per_cap.items()
        },
    }


def _metric(name: str) -> str:
    return "recall@5" if name == "locomo" else "recall_all@5"


def _overlap(exact: list[str], bounded: list[str]) -> float:
    return len(set(exact) & set(bounded)) / len(exact) if exact else 1.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=("locomo", "lme"), default="locomo")
    p.add_argument("--slice", choices=("dev", "test"), default="dev", help="LongMemEval slice")
    p.add_argument(
        "--floor", type=int, default=0,
        help="a term is common only when more than max(FLOOR, cap x scope rows) rows hold it",
    )  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args()
    if args.dataset == "lme":
        data = load_lme(DATA / f"lme_s_{args.slice}.json.gz")
    else:
        data = load_locomo(DATA / "locomo10.json.gz")
    figures = study(data, args.dataset, floor=args.floor)
    print(
        f"{figures['dataset']}: {figures['questions']} questions, scopes of "
        f"{figures['scope_rows_mean']:.0f} rows on average; exact BM25 matches "
        f"{figures['exact']['matched_mean']:.0f} rows a query, keyword-only recall@5 "
        f"{figures['exact']['recall5']:.4f}"
    )
    print(f"{'cap':>6} {'matched':>8} {'pool overlap':>13} {'top-5 overlap':>14} {'recall@5':>9}")
    for cap, f in figures["caps"].items():
        print(
            f"{cap:>6} {f['matched']:>8.0f} {f['pool_overlap']:>13.3f} "
            f"{f['top5_overlap']:>14.3f} {f['recall5']:>9.4f}"
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
