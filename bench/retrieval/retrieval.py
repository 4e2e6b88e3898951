"""Retrieval quality on LongMemEval_S and LoCoMo, through pgmemory's own store and recall path.

    python bench/retrieval/retrieval.py --dataset lme --slice test          # held-out LongMemEval figure
    python bench/retrieval/retrieval.py --dataset lme --slice dev --tune    # tune the hybrid weights
    python bench/retrieval/retrieval.py --dataset locomo --json out.json

Every memory is written with ``MemoryStore.import_records`` (binary COPY) into a scratch database
(created and dropped) on the embedded server or on the server ``PGMEMORY_DATABASE_URL`` points at,
and every ranking that is reported comes from ``MemoryStore.search`` (``mode="vector"``,
``"text"`` or ``"hybrid"``), except the rows marked *client* (``rrf3``, and the ``--diagnose``
rows), which are there to explain the library's figures.

* LongMemEval (session level, the benchmark's own protocol): one scope per question
  (``MemoryScope(user_id=question_id)``); each haystack session is one memory made of its user
  turns only, with ``created_at`` from ``haystack_dates``; targets are the ``answer_session_ids``
  holding a user turn with ``has_answer``; ``_abs`` questions and questions without such a target
  are skipped. Metrics: ``recall_all@5/@10``, ``ndcg_any@5/@10`` (LongMemEval's DCG), ``hit@1``,
  ``hit@5`` and ``mrr``.
* LoCoMo (turn level, as the paper defines it): one scope per conversation, one memory per turn
  (``"<speaker>: <text>"``, plus the shared photo's caption), ``created_at`` from the session date;
  ``recall@k`` is per question the fraction of its evidence turns in the top k (empty evidence
  counts as 1), averaged over all 1,986 questions, adversarial ones included.

Embeddings are cached on disk in ``bench/.cache/embeddings.sqlite`` keyed by (model id, sha256 of
the text), so a rerun embeds nothing. LoCoMo is CC BY-NC: it is read from ``../shared/bench-data``
(or ``--data-dir``) and never copied into the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

import numpy as np
import sqlalchemy as sa
from tqdm.auto import tqdm

from bench._common.scratch import Server
from bench.retrieval import _datasets
from bench.retrieval._datasets import (
    CACHE_DIR,
    DEFAULT_DATA_DIR,
    LME_METRICS,
    LOCOMO_METRICS,
    Dataset,
    DiskCachedEmbedder,
    Doc,
    ProviderMessage,
    Question,
    chunk_words,
    lme_parts,
    lme_provider_messages,
    load_lme,
    load_locomo,
    locomo_provider_messages,
    make_embedder,
    mean_scores,
    print_table,
    score,
)
from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.store.records import SearchWeights
from pgmemory.text import terms as pgterms

#: Hybrid weights chosen by ``--tune`` (vector weight fixed at 1: only ratios matter).
#: LongMemEval: tuned on lme_s_dev only (objective recall_all@5, then ndcg_any@10), applied
#: unchanged to lme_s_test. LoCoMo: tuned on LoCoMo itself (objective recall@5), so in-sample.
TUNED: dict[str, dict[str, dict[str, float | int]]] = {
    "lme": {
        "hybrid-use": {"vector": 1.0, "text": 0.25, "recency": 0.0, "rrf_k": 40},
        "hybrid-minilm": {"vector": 1.0, "text": 0.25, "recency": 0.0, "rrf_k": 20},
        "hybrid-use+recency": {"vector": 1.0, "text": 0.25, "recency": 0.05, "rrf_k": 60},
        "hybrid-minilm+recency": {"vector": 1.0, "text": 0.25, "recency": 0.1, "rrf_k": 20},
    },
    "locomo": {
        "hybrid-use": {"vector": 1.0, "text": 3.0, "recency": 0.0, "rrf_k": 20},
        "hybrid-minilm": {"vector": 1.0, "text": 1.0, "recency": 0.0, "rrf_k": 5},
        "hybrid-use+recency": {"vector": 1.0, "text": 3.0, "recency": 0.5, "rrf_k": 20},
        "hybrid-minilm+recency": {"vector": 1.0, "text": 1.5, "recency": 0.5, "rrf_k": 10},
    },
}


@dataclass(frozen=True)
class Config:
    name: str
    mode: str  # vector | text | hybrid | rrf3 (client-side fusion)
    embedder: str | None  # use | minilm | None
    tuned: bool = False  # weights from TUNED (else the library's defaults)
    note: str = ""
    # mode "candidate": the store's statement with the fusion and/or distance replaced (SQL)
    fusion: str = "score"  # score | rank (SearchWeights.fusion)
    chunks: bool = False  # multi-vector memories (LME sessions: chunks after the first)
    weights: tuple[tuple[str, float], ...] = ()  # SearchWeights fields passed explicitly


CONFIGS: dict[str, Config] = {
    c.name: c
    for c in (
        Config("text", "text", None, note="full-text only (BM25 over the scope, in SQL)"),
        Config("vector-use", "vector", "use", note="USE multilingual v3, 512-d"),
        Config("vector-minilm", "vector", "minilm", note="all-MiniLM-L6-v2, 384-d"),
        Config("hybrid-use", "hybrid", "use", tuned=True, note="tuned RRF, no recency"),
        Config("hybrid-minilm", "hybrid", "minilm", tuned=True, note="tuned RRF, no recency"),
        Config("hybrid-use+recency", "hybrid", "use", tuned=True, note="tuned RRF, with recency"),
        Config(
            "hybrid-minilm+recency", "hybrid", "minilm", tuned=True, note="tuned RRF, with recency"
        ),
        Config("rrf3", "rrf3", None, note="client RRF of text, vector-use, vector-minilm (k=60)"),
        # Ranked in SQL by the store's own hybrid statement and parameters, one recall at a time
        # and timed (candidate_rankings). The default is the one whose name starts with "default".
        Config(
            "default-use",
            "candidate",
            "use",
            fusion="score",
            note="THE DEFAULT: SearchWeights() = score fusion, vector 1, text 1, pool 50, "
            "neighbour 0.5",
        ),
        Config(
            "score-use-part2-default",
            "candidate",
            "use",
            fusion="score",
            weights=(("neighbour", 0.0),),
            note="the default before part 3: score fusion without neighbours",
        ),
        Config(
            "rrf-use-old-default",
            "candidate",
            "use",
            fusion="rank",
            note="the default before: SearchWeights(fusion='rank'), RRF k 60, pool 50",
        ),
        Config(
            "default-minilm",
            "candidate",
            "minilm",
            fusion="score",
            note="the default's fusion with MiniLM",
        ),
        Config(
            "score-minilm-part2-default",
            "candidate",
            "minilm",
            fusion="score",
            weights=(("neighbour", 0.0),),
            note="the part-2 default's fusion (no neighbours) with MiniLM",
        ),
        *(
            Config(
                f"score-use-neighbour{w:g}",
                "candidate",
                "use",
                fusion="score",
                weights=(("neighbour", w),),
                note=f"score fusion, neighbours weighted {w:g}",
            )
            for w in (0.25, 0.75)
        ),
        Config(
            "rrf-minilm-old-default",
            "candidate",
            "minilm",
            fusion="rank",
            note="the old default's fusion with MiniLM",
        ),
        *(
            Config(
                f"score-use-t{t:g}-pool{p}",
                "candidate",
                "use",
                fusion="score",
                weights=(("text", t), ("pool", p)),
                note=f"score fusion, text {t:g}, pool {p}",
            )
            for t in (0.5, 0.75, 1.5, 2.0)
            for p in (50,)
        ),
        *(
            Config(
                f"score-use-t1-pool{p}",
                "candidate",
                "use",
                fusion="score",
                weights=(("pool", p),),
                note=f"score fusion, text 1, pool {p}",
            )
            for p in (10, 20, 100, 10_000)
        ),
        Config(
            "score-use-t1-chunks",
            "candidate",
            "use",
            fusion="score",
            chunks=True,
            note="score fusion, text 1.0, multi-vector (200-word chunks; LME only)",
        ),
    )
}

#: What a run reports unless --configs says otherwise: the baselines, the default and the one
#: before it, with the default embedder (USE; the MiniLM configs are one --configs away).
DEFAULT_CONFIGS = (
    "text",
    "vector-use",
    "default-use",
    "score-use-part2-default",
    "rrf-use-old-default",
)


# --- scratch database ---------------------------------------------------------------------------


class ScratchDatabase:
    """A database of its own (bench/_common/scratch.py) for one run, and the versions it reports."""

    def __init__(self) -> None:
        self.server = Server()
        self._scratch = self.server.scratch("retrieval")
        self.url = self._scratch.__enter__()
        with sa.create_engine(self.url).connect() as conn:
            self.server_version = conn.execute(sa.text("SHOW server_version")).scalar()
            self.pgvector = conn.execute(
                sa.text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            ).scalar()

    def drop(self) -> None:
        try:
            self._scratch.__exit__(None, None, None)
        finally:
            self.server.close()


# --- the run ------------------------------------------------------------------------------------


@dataclass
class Index:
    """One collection per embedder, holding every scope of the dataset."""

    store: MemoryStore
    collection: str
    embedder: DiskCachedEmbedder
    key_of: dict[uuid.UUID, str] = field(default_factory=dict)  # memory id -> doc key


async def build_index(
    url: str, data: Dataset, emb_name: str, threads: int, cache_dir: Path
) -> Index:
    embedder = make_embedder(emb_name, threads, cache_dir)
    texts = [d.text for docs in data.scopes.values() for d in docs]
    await embedder.warm(
        texts,
        desc=f"embed {data.name} sessions ({emb_name})"
        if data.name.startswith("lme")
        else f"embed {data.name} turns ({emb_name})",
    )
    await embedder.warm([q.text for q in data.questions], desc=f"embed questions ({emb_name})")
    settings = Settings(max_text_chars=1_000_000, _env_file=None)  # type: ignore[call-arg]
    # migrate=True: brings the scratch database to the head of the pgmemory in use
    store = await MemoryStore(url, settings=settings, embedder=embedder, migrate=True).open()
    collection = f"{data.name.replace('-', '_')}_{emb_name}"
    await store.create_collection(collection)  # size and model from the embedder
    records = (
        MemoryRecord(
            content=d.text,
            scope=MemoryScope(user_id=scope, session_id=d.conversation),
            role="user",
            message_id=d.key,
            source_type="external",
            created_at=d.created_at,
            metadata={"doc": d.key},
        )
        for scope, docs in data.scopes.items()
        for d in docs
    )
    t = time.perf_counter()
    n = await store.import_records(collection, records, progress=True)
    async with store.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        await raw.driver_connection.set_autocommit(True)
        await raw.driver_connection.execute("VACUUM (ANALYZE) pgmemory_memories")
        await raw.driver_connection.set_autocommit(False)
    print(
        f"imported {n} memories into {collection} in {time.perf_counter() - t:.1f} s",
        file=sys.stderr,
    )
    return Index(store, collection, embedder)


async def ranked_keys(
    index: Index, q: Question, *, mode: str, limit: int, weights: SearchWeights | None = None
) -> list[tuple[str, uuid.UUID, datetime]]:
    hits = await index.store.search(
        index.collection,
        MemoryScope(user_id=q.scope),
        query=q.text,
        limit=limit,
        mode=mode,
        weights=weights,
        audit=False,
    )
    return [(h.memory.message_id or "", h.memory.id, h.memory.created_at) for h in hits]


async def run_all(
    index: Index,
    questions: list[Question],
    *,
    mode: str,
    limit: int,
    weights: SearchWeights | None,
    desc: str,
) -> list[list[tuple[str, uuid.UUID, datetime]]]:
    sem = asyncio.Semaphore(4)
    bar = tqdm(total=len(questions), desc=desc, leave=False)

    async def one(q: Question) -> list[tuple[str, uuid.UUID, datetime]]:
        async with sem:
            out = await ranked_keys(index, q, mode=mode, limit=limit, weights=weights)
            bar.update()
            return out

    results = await asyncio.gather(*(one(q) for q in questions))
    bar.close()
    return list(results)


def rrf(
    rankings: Sequence[Sequence[str]], weights: Sequence[float], k: int, pool: int
) -> list[str]:
    scores: dict[str, float] = {}
    for ranking, w in zip(rankings, weights, strict=True):
        if w == 0:
            continue
        for rank, key in enumerate(ranking[:pool], start=1):
            scores[key] = scores.get(key, 0.0) + w / (k + rank)
    return sorted(scores, key=lambda key: -scores[key])


def weights_for(dataset: str, cfg: Config) -> SearchWeights:
    if not cfg.tuned:
        return SearchWeights()
    return SearchWeights(**TUNED[dataset][cfg.name], fusion="rank")  # type: ignore[arg-type]


#: Provider-path variants besides the provider's own default options (weights passed explicitly).
PROVIDER_CANDIDATES: dict[str, SearchWeights] = {
    "old-default (rank fusion, recency 0.5)": SearchWeights(recency=0.5, fusion="rank"),
    "score fusion, recency 0": SearchWeights(),
    "score fusion, recency 0.1, no neighbours (part 2's provider default)": SearchWeights(
        recency=0.1, neighbour=0.0
    ),
    "score fusion, recency 0.1, neighbour 0.5": SearchWeights(recency=0.1),
    "score fusion, recency 0.25": SearchWeights(recency=0.25),
    "score fusion, recency 0.5": SearchWeights(recency=0.5),
}


# --- candidates for a new default, run in SQL: the store's own statement, one part changed -----

#: Multi-vector memories: a memory's distance is its best of its own vector and its chunks'.
CHUNK_DISTANCE = (
    "LEAST(m.embedding <=> :query, (SELECT min(x.embedding <=> :query) FROM bench_chunks AS x"
    " WHERE x.memory_id = m.id)) AS distance"
)


def candidate_statement(*, fusion: str, neighbours: bool, chunks: bool, dimensions: int) -> str:
    """The store's own hybrid statement for a scope of one user_id (no audit), with the
    distance taken over chunks when ``chunks`` (the only part a bench changes)."""
    from pgmemory.store._ranking.search import search_memories
    from pgmemory.store.models import COVERING_MAX_DIMENSIONS

    sql = search_memories(
        ("user_id",),
        covering=dimensions <= COVERING_MAX_DIMENSIONS,
        audit=False,
        mode="hybrid",
        fusion=fusion,
        neighbours=neighbours,
    )
    if chunks:
        assert sql.count("m.embedding <=> :query AS distance") == 1
        sql = sql.replace("m.embedding <=> :query AS distance", CHUNK_DISTANCE)
    return sql


async def add_chunks(index: Index, chunk_texts: dict[str, list[str]]) -> int:
    """Scratch table bench_chunks: the extra vectors of each memory (by message_id)."""
    texts = sorted({t for ts in chunk_texts.values() for t in ts})
    await index.embedder.warm(texts, desc="embed chunks")
    vecs = dict(zip(texts, await index.embedder.embed(texts), strict=True)) if texts else {}
    async with index.store.engine.begin() as conn:
        await conn.execute(
            sa.text(
                "CREATE TABLE IF NOT EXISTS bench_chunks (memory_id uuid, user_id text, embedding vector)"
            )
        )
        rows = (
            await conn.execute(
                sa.text(
                    "SELECT id, user_id, message_id FROM pgmemory_memories WHERE collection = :c"
                ),
                {"c": index.collection},
            )
        ).all()
        ids, users, embs = [], [], []
        for mid, uid, msg in rows:
            for t in chunk_texts.get(msg, []):
                ids.append(str(mid))
                users.append(uid)
                embs.append("[" + ",".join(f"{x:.7g}" for x in vecs[t]) + "]")
        await conn.execute(
            sa.text(
                "INSERT INTO bench_chunks SELECT * FROM unnest(CAST(:i AS uuid[]), CAST(:u AS text[]), CAST(:e AS vector[]))"
            ),
            {"i": ids, "u": users, "e": embs},
        )
        await conn.execute(
            sa.text("CREATE INDEX IF NOT EXISTS bench_chunks_memory ON bench_chunks (memory_id)")
        )
        await conn.execute(sa.text("ANALYZE bench_chunks"))
    return len(ids)


@dataclass
class Candidate:
    """One ranking run in SQL: the store's statement (see candidate_statement) and weights."""

    index: Index
    statement: str
    weights: SearchWeights


async def candidate_rankings(
    candidates: dict[str, Candidate], questions: list[Question], *, limit: int
) -> dict[str, tuple[list[list[str]], list[float]]]:
    """Rankings from each candidate, with the parameters the store passes, and the wall time
    of each recall (ms: the query's embedding, cached here, excluded; the SQL round trip and
    mapping included). One question at a time, every candidate in turn on its own connection,
    so a change of load on the shared machine hits every candidate alike."""
    out: dict[str, tuple[list[list[str]], list[float]]] = {n: ([], []) for n in candidates}
    vectors: dict[int, Any] = {}
    for c in candidates.values():
        if id(c.index) not in vectors:
            vectors[id(c.index)] = await c.index.embedder.embed([q.text for q in questions])
    conns = {}
    for name, c in candidates.items():
        conns[name] = await c.index.store.engine.connect()
    try:
        for i, q in enumerate(tqdm(questions, desc="candidates in SQL", leave=False)):
            for name, c in candidates.items():
                vec = vectors[id(c.index)][i]
                params = {
                    "user_id": q.scope,
                    "collection": c.index.collection,
                    "query": "[" + ",".join(f"{x:.7g}" for x in vec) + "]",
                    "terms": pgterms.query(q.text),
                    "term_list": list(dict.fromkeys(pgterms.terms(q.text))),
                    "pool": max(c.weights.pool, limit),
                    "rrf_k": c.weights.rrf_k,
                    "vector_weight": c.weights.vector,
                    "text_weight": c.weights.text,
                    "recency_weight": c.weights.recency,
                    "neighbour_weight": c.weights.neighbour,
                    "limit": limit,
                    "ann_candidates": max(4 * limit, 40),
                    "min_score": -2.0,
                    "since": datetime(1, 1, 2, tzinfo=UTC),
                    "until": datetime(9999, 12, 30, tzinfo=UTC),
                }
                t = time.perf_counter()
                rows = (await conns[name].execute(sa.text(c.statement), params)).mappings().all()
                out[name][1].append((time.perf_counter() - t) * 1000)
                out[name][0].append([r["message_id"] or "" for r in rows])
    finally:
        for conn in conns.values():
            await conn.rollback()
            await conn.close()
    return out


# --- the product's own path: one row per message, recalled by ChatHistoryMemoryProvider -------


async def build_provider_index(
    url: str,
    name: str,
    messages: dict[str, list[ProviderMessage]],
    emb_name: str,
    threads: int,
    cache_dir: Path,
) -> Index:
    """One row per message, written as ChatHistoryMemoryProvider.after_run writes it (render())."""
    from agent_framework import Message

    from pgmemory.integrations.agent_framework.rendering import render

    embedder = make_embedder(emb_name, threads, cache_dir)
    rendered = {
        (scope, m.message_id): render(Message(m.role, [m.text]))
        for scope, rows in messages.items()
        for m in rows
    }
    await embedder.warm(list(rendered.values()), desc=f"embed {name} messages ({emb_name})")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    store = await MemoryStore(url, settings=settings, embedder=embedder, migrate=True).open()
    collection = f"{name.replace('-', '_')}_msg_{emb_name}"
    await store.create_collection(collection)
    limit = settings.max_text_chars
    records = (
        MemoryRecord(
            content=(
                c if len(c := rendered[(scope, m.message_id)]) <= limit else c[: limit - 1] + "…"
            ),
            scope=MemoryScope(user_id=scope, session_id=m.session_id),
            role=m.role,
            message_id=m.message_id,
            created_at=m.created_at,
        )
        for scope, rows in messages.items()
        for m in rows
    )
    n = await store.import_records(collection, records, progress=True)
    async with store.engine.connect() as conn:
        raw = await conn.get_raw_connection()
        await raw.driver_connection.set_autocommit(True)
        await raw.driver_connection.execute("VACUUM (ANALYZE) pgmemory_memories")
        await raw.driver_connection.set_autocommit(False)
    print(f"imported {n} messages into {collection}", file=sys.stderr)
    index = Index(store, collection, embedder)
    index.key_of = {}  # filled per hit from message_id
    return index


async def provider_rankings(
    index: Index,
    questions: list[Question],
    key_of_message: dict[str, str],
    *,
    max_results: int,
    weights: SearchWeights | None,
    desc: str,
) -> tuple[list[list[str]], list[float]]:
    """Each question recalled by the provider's own _recall (its default options, except
    max_results raised to cover the metrics' depth, recent_turns 0 and no token budget, so the
    ranked list is its similar-memory ranking alone); recalled messages mapped to their keys, first occurrence kept.
    Returns the rankings and the wall time of each recall (ms)."""
    import dataclasses

    from agent_framework import AgentSession

    from pgmemory import ChatHistoryMemoryProvider, ChatHistoryMemoryProviderOptions

    options = dataclasses.replace(
        ChatHistoryMemoryProviderOptions(),
        max_results=max_results,
        recent_turns=0,
        max_context_tokens=None,  # the ranking itself, not what a budget keeps of it
    )
    if weights is not None:
        options = dataclasses.replace(options, weights=weights)
    # Each question is recalled for its own scope (below); the bound user is not used.
    provider = ChatHistoryMemoryProvider(
        index.store, index.collection, user_id="bench", options=options
    )
    out: list[list[str]] = []
    times: list[float] = []
    session = AgentSession(session_id="bench")
    for q in tqdm(questions, desc=desc, leave=False):
        state = ChatHistoryMemoryProvider.State(storage_scope=MemoryScope(user_id=q.scope))
        t = time.perf_counter()
        # what the provider's hook runs: the store's recall with the provider's keywords
        shown = await provider.store.recall(
            provider.collection_name, state.effective_search_scope, query=q.text,
            **provider._recall_options(session, heading=None, seen=()),
        )  # fmt: skip
        memories = shown.memories
        times.append((time.perf_counter() - t) * 1000)
        ranked = list(dict.fromkeys(key_of_message[m.message_id or ""] for m in memories))
        out.append(ranked)
    return out, times


# --- tuning: the library's fusion replayed client-side on its own rankings ---------------------


async def tune(
    dataset: str, data: Dataset, indexes: dict[str, Index], pool: int = 50
) -> dict[str, Any]:
    """Grid-search text weight, recency weight and rrf_k (vector weight 1, pool 50)."""
    objective = ("recall_all@5", "ndcg_any@10") if dataset == "lme" else ("recall@5", "recall@10")
    names = LME_METRICS if dataset == "lme" else LOCOMO_METRICS
    grid_text = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
    grid_rec = (0.0, 0.05, 0.1, 0.2, 0.35, 0.5)
    grid_k = (1, 5, 10, 20, 40, 60, 100)
    out: dict[str, Any] = {}
    for emb, index in indexes.items():
        # memory ids differ between collections: take every ranking from this one
        txt_all = await run_all(
            index, data.questions, mode="text", limit=pool, weights=None, desc="tune: text"
        )
        vec_all = await run_all(
            index, data.questions, mode="vector", limit=pool, weights=None, desc=f"tune: {emb}"
        )
        # newest first, ties by id descending, as the SQL does (over the same scope rows)
        recent_all = []
        for q in data.questions:
            rows = await index.store.list(
                index.collection, MemoryScope(user_id=q.scope), limit=pool
            )
            recent_all.append([(m.message_id or "", m.id, m.created_at) for m in rows])
        combos = [(wt, wr) for wt in grid_text for wr in grid_rec]
        wmat = np.array([[1.0, wt, wr] for wt, wr in combos]).T  # 3 x C
        per: dict[tuple[float, float, int], list[dict[str, float]]] = {}
        for q, v, t, r in zip(data.questions, vec_all, txt_all, recent_all, strict=True):
            ranking_set = (v[:pool], t[:pool], r[:pool])
            mids = sorted({mid for ranking in ranking_set for _, mid, _ in ranking})  # ties: id asc
            pos = {m: i for i, m in enumerate(mids)}
            keys = [""] * len(mids)
            ranks = np.full((3, len(mids)), np.inf)
            for j, ranking in enumerate(ranking_set):
                for rank, (doc, mid, _) in enumerate(ranking, start=1):
                    ranks[j, pos[mid]] = rank
                    keys[pos[mid]] = doc
            for k in grid_k:
                fused_scores = (1.0 / (k + ranks)).T @ wmat  # n x C (a missing rank adds 0)
                order = np.argsort(-fused_scores, axis=0, kind="stable")
                for c, (wt, wr) in enumerate(combos):
                    ranked = [keys[i] for i in order[:, c]]
                    per.setdefault((wt, wr, k), []).append(score(dataset, ranked, q))
        results = [
            ({"vector": 1.0, "text": wt, "recency": wr, "rrf_k": k}, mean_scores(rows, names))
            for (wt, wr, k), rows in per.items()
        ]
        best = {}
        for label, allow_rec in ((f"hybrid-{emb}", False), (f"hybrid-{emb}+recency", True)):
            cands = [r for r in results if allow_rec or r[0]["recency"] == 0.0]
            if allow_rec:
                cands = [r for r in cands if r[0]["recency"] > 0.0]
            w, m = max(cands, key=lambda r: tuple(r[1][o] for o in objective))
            best[label] = {"weights": w, "metrics": m}
        default = next(
            m for w, m in results if w == {"vector": 1.0, "text": 1.0, "recency": 0.0, "rrf_k": 60}
        )
        best[f"hybrid-{emb}-default (replayed)"] = {
            "weights": {"vector": 1.0, "text": 1.0, "recency": 0.0, "rrf_k": 60},
            "metrics": default,
        }
        out.update(best)
        # sensitivity: best objective per recency weight
        for w_rec in grid_rec:
            cands = [r for r in results if r[0]["recency"] == w_rec]
            w, m = max(cands, key=lambda r: tuple(r[1][o] for o in objective))
            print(
                f"  {emb} recency={w_rec:<5} best {objective[0]}={m[objective[0]]:.4f} at {w}",
                file=sys.stderr,
            )
    return out


# --- diagnostics: what the keyword ranking loses ------------------------------------------------


_BM25_STATS: dict[tuple[int, Any], tuple[list[Counter], list[int], float, dict[str, float]]] = {}


def bm25_rank(
    docs: list[Doc], query: str, tokenize: Any, k1: float = 1.5, b: float = 0.75
) -> list[str]:
    """Okapi BM25 (rank_bm25's BM25Okapi formula, IDF over the scope) over one scope's documents."""
    cache_key = (id(docs), tokenize)
    if cache_key not in _BM25_STATS:
        toks = [tokenize(d.text) for d in docs]
        n = len(toks)
        df: Counter = Counter()
        for t in toks:
            df.update(set(t))
        idf = {w: math.log((n - c + 0.5) / (c + 0.5) + 1) for w, c in df.items()}
        _BM25_STATS[cache_key] = (
            [Counter(t) for t in toks],
            [len(t) for t in toks],
            sum(map(len, toks)) / max(n, 1),
            idf,
        )
    tfs, lengths, avgdl, idf = _BM25_STATS[cache_key]
    qterms = tokenize(query)
    scores = []
    for tf, length in zip(tfs, lengths, strict=True):
        s = 0.0
        for w in qterms:
            f = tf.get(w, 0)
            if f:
                s += idf[w] * f * (k1 + 1) / (f + k1 * (1 - b + b * length / avgdl))
        scores.append(s)
    order = sorted(range(len(docs)), key=lambda i: -scores[i])
    return [docs[i].key for i in order if scores[i] > 0]


async def diagnose(
    dataset: str, data: Dataset, index: Index, rankings: dict[str, list[list[str]]]
) -> dict[str, dict[str, float]]:
    """Keyword ranking variants on the same rows: client BM25, and ts_rank_cd normalisations."""
    names = LME_METRICS if dataset == "lme" else LOCOMO_METRICS
    out: dict[str, dict[str, float]] = {}
    simple_words = re.compile(r"\w+", re.UNICODE)
    bm25 = [bm25_rank(data.scopes[q.scope], q.text, pgterms.terms) for q in data.questions]
    out["diag: bm25 over pgmemory terms (client)"] = mean_scores(
        [score(dataset, r, q) for r, q in zip(bm25, data.questions, strict=True)], names
    )

    def words(text: str) -> list[str]:
        return simple_words.findall(text.lower())

    rows = [
        score(dataset, bm25_rank(data.scopes[q.scope], q.text, words), q) for q in data.questions
    ]
    out["diag: bm25 over \\w+ tokens, no stop words (client)"] = mean_scores(rows, names)
    # what hybrid would score if its keyword ranking were BM25 (default fusion: weights 1, k 60)
    for emb in ("use", "minilm"):
        vec = rankings.get(f"vector-{emb}")
        if vec is None:
            continue
        rows = [
            score(dataset, rrf([v, b], [1.0, 1.0], 60, 50), q)
            for v, b, q in zip(vec, bm25, data.questions, strict=True)
        ]
        out[f"diag: rrf(vector-{emb}, bm25) k=60 (client)"] = mean_scores(rows, names)
    # the library's own rows and tsquery, ranked by other ts_rank functions / normalisations
    variants = {
        "diag: ts_rank_cd norm 1 (log length) (sql)": "ts_rank_cd(m.search_vector, tq.q, 1)",
        "diag: ts_rank_cd norm 2 (length) (sql)": "ts_rank_cd(m.search_vector, tq.q, 2)",
        "diag: ts_rank norm 1 (sql)": "ts_rank(m.search_vector, tq.q, 1)",
    }
    # PostgreSQL's english configuration (snowball stemming, its stop words) on the raw content
    english = "to_tsvector('english', m.content)"
    variants["diag: english stemmed, ts_rank_cd norm 0 (sql)"] = f"ts_rank_cd({english}, tq.q)"
    variants["diag: english stemmed, ts_rank_cd norm 1 (sql)"] = f"ts_rank_cd({english}, tq.q, 1)"
    for label, expr in variants.items():
        config, vector = (
            ("english", english) if "english" in label else ("simple", "m.search_vector")
        )
        sql = sa.text(
            f"""SELECT m.message_id FROM pgmemory_memories m,
                   (SELECT websearch_to_tsquery('{config}', :terms) AS q) tq
               WHERE m.collection = :collection AND m.user_id = :user_id AND {vector} @@ tq.q
               ORDER BY {expr} DESC, m.id LIMIT 50"""
        )
        rows = []
        async with index.store.engine.connect() as conn:
            for q in data.questions:
                res = await conn.execute(
                    sql,
                    {
                        "terms": pgterms.query(q.text),
                        "collection": index.collection,
                        "user_id": q.scope,
                    },
                )
                rows.append(score(dataset, [r[0] for r in res], q))
        out[label] = mean_scores(rows, names)
    return out


# --- main ---------------------------------------------------------------------------------------


async def provider_main(
    args: argparse.Namespace, data: Dataset, names: Sequence[str]
) -> dict[str, Any]:
    """--path provider: one row per message through the provider's storage and recall."""
    t0 = time.perf_counter()
    data_dir = Path(args.data_dir)
    if args.dataset == "lme":
        messages = lme_provider_messages(data_dir / f"lme_s_{args.slice}.json.gz", data)
        max_results = 100  # messages; mapped to sessions, enough for @10 in almost every question
    else:
        messages = locomo_provider_messages(data_dir / "locomo10.json.gz")
        max_results = 10
    messages = {s: m for s, m in messages.items() if s in data.scopes}
    key_of_message = {m.message_id: m.key for rows in messages.values() for m in rows}
    n_rows = sum(map(len, messages.values()))
    print(f"provider path: {n_rows} messages in {len(messages)} scopes", file=sys.stderr)
    db = ScratchDatabase()
    results: dict[str, dict[str, float]] = {}
    latency: dict[str, dict[str, float]] = {}
    try:
        index = await build_provider_index(
            db.url, data.name, messages, args.provider_embedder, args.threads, Path(args.cache_dir)
        )
        from pgmemory import ChatHistoryMemoryProviderOptions

        default = ChatHistoryMemoryProviderOptions().weights
        variants: dict[str, SearchWeights | None] = {
            f"provider-{args.provider_embedder}-default ({default})": None,
        }
        for name, w in PROVIDER_CANDIDATES.items():
            variants[f"provider-{args.provider_embedder}-{name}"] = w
        for label, weights in variants.items():
            ranked, times = await provider_rankings(
                index,
                data.questions,
                key_of_message,
                max_results=max_results,
                weights=weights,
                desc=label,
            )
            results[label] = mean_scores(
                [score(args.dataset, r, q) for r, q in zip(ranked, data.questions, strict=True)],
                names,
            )
            latency[label] = {
                "p50_ms": float(np.percentile(times, 50)),
                "p95_ms": float(np.percentile(times, 95)),
            }
        await index.store.close()
        print_table(
            f"{data.name}: provider path ({n_rows} messages, one row each; {len(data.questions)} questions)",
            results,
            names,
            {
                k: f"recall p50 {v['p50_ms']:.1f} ms, p95 {v['p95_ms']:.1f} ms"
                for k, v in latency.items()
            },
        )
        return {
            "dataset": args.dataset,
            "slice": data.name,
            "path": "provider",
            "questions": len(data.questions),
            "messages": n_rows,
            "embedder": args.provider_embedder,
            "configs": results,
            "latency": latency,
            "timings": {"total_s": round(time.perf_counter() - t0, 1)},
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "postgresql": db.server_version,
                "pgvector": db.pgvector,
            },
        }
    finally:
        db.drop()


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    data_dir = Path(args.data_dir)
    if args.dataset == "lme":
        data = load_lme(data_dir / f"lme_s_{args.slice}.json.gz")
        names = LME_METRICS
        limit = 50  # every session of the haystack (at most ~51), so mrr sees the full ranking
    else:
        data = load_locomo(data_dir / "locomo10.json.gz")
        names = LOCOMO_METRICS
        limit = 10
    if args.questions:
        data.questions = data.questions[: args.questions]
        data.scopes = {
            s: d for s, d in data.scopes.items() if any(q.scope == s for q in data.questions)
        }
    if args.path == "provider":
        return await provider_main(args, data, names)
    n_docs = sum(map(len, data.scopes.values()))
    print(
        f"{data.name}: {len(data.questions)} questions, {len(data.scopes)} scopes, {n_docs} memories"
        + (f"; skipped: {dict(data.skipped)}" if data.skipped else ""),
        file=sys.stderr,
    )
    configs = [CONFIGS[c] for c in args.configs]
    needed = {c.embedder for c in configs if c.embedder}
    if any(c.mode == "rrf3" for c in configs) or args.tune:
        needed |= {"use", "minilm"}
    if not needed:  # full-text only still needs a collection (and vectors) to live in
        needed = {"minilm"}
    db = ScratchDatabase()
    timings: dict[str, float] = {}
    try:
        indexes: dict[str, Index] = {}
        for emb in sorted(needed, key=lambda e: e != "use"):
            t = time.perf_counter()
            indexes[emb] = await build_index(db.url, data, emb, args.threads, Path(args.cache_dir))
            timings[f"index_{emb}_s"] = round(time.perf_counter() - t, 1)
        results: dict[str, dict[str, float]] = {}
        rankings: dict[str, list[list[str]]] = {}
        t = time.perf_counter()
        latency: dict[str, dict[str, float]] = {}
        chunked: set[str] = set()
        candidates: dict[str, Candidate] = {}
        for cfg in configs:
            if cfg.mode == "rrf3":
                continue
            if cfg.mode == "candidate":
                index = indexes[cfg.embedder or "use"]
                weights = SearchWeights(**dict(cfg.weights), fusion=cfg.fusion)  # type: ignore[arg-type]
                if cfg.name.startswith("default"):
                    assert weights == SearchWeights(), f"{cfg.name} must be the library default"
                if cfg.chunks and args.dataset == "lme" and cfg.embedder not in chunked:
                    parts = lme_parts(data_dir / f"lme_s_{args.slice}.json.gz")
                    keys = {d.key for docs in data.scopes.values() for d in docs}
                    n = await add_chunks(index, {k: chunk_words(parts[k], 200)[1:] for k in keys})
                    chunked.add(cfg.embedder or "use")
                    print(f"{n} chunk vectors added", file=sys.stderr)
                candidates[cfg.name] = Candidate(
                    index,
                    candidate_statement(
                        fusion=cfg.fusion,
                        neighbours=cfg.fusion == "score" and weights.neighbour > 0,
                        chunks=cfg.chunks and args.dataset == "lme",
                        dimensions=index.embedder.dimensions,
                    ),
                    weights,
                )
                continue
            index = indexes[cfg.embedder] if cfg.embedder else indexes[sorted(indexes)[0]]
            weights = weights_for(args.dataset, cfg) if cfg.mode == "hybrid" else None
            runs = await run_all(
                index, data.questions, mode=cfg.mode, limit=limit, weights=weights, desc=cfg.name
            )
            rankings[cfg.name] = [[k for k, _, _ in r] for r in runs]
            results[cfg.name] = mean_scores(
                [
                    score(args.dataset, r, q)
                    for r, q in zip(rankings[cfg.name], data.questions, strict=True)
                ],
                names,
            )
        for name, (ranked, times) in (
            await candidate_rankings(candidates, data.questions, limit=limit)
        ).items():
            rankings[name] = ranked
            latency[name] = {
                "sql_p50_ms": float(np.percentile(times, 50)),
                "sql_p95_ms": float(np.percentile(times, 95)),
            }
            results[name] = mean_scores(
                [score(args.dataset, r, q) for r, q in zip(ranked, data.questions, strict=True)],
                names,
            )
        if any(c.mode == "rrf3" for c in configs):
            parts = {}
            for name, mode, emb in (
                ("text", "text", "minilm"),
                ("vector-use", "vector", "use"),
                ("vector-minilm", "vector", "minilm"),
            ):
                if name not in rankings:
                    runs = await run_all(
                        indexes[emb],
                        data.questions,
                        mode=mode,
                        limit=limit,
                        weights=None,
                        desc=name,
                    )
                    rankings[name] = [[k for k, _, _ in r] for r in runs]
                parts[name] = rankings[name]
            fusion = [
                rrf([p[i] for p in parts.values()], [1, 1, 1], 60, limit)
                for i in range(len(data.questions))
            ]
            results["rrf3"] = mean_scores(
                [score(args.dataset, r, q) for r, q in zip(fusion, data.questions, strict=True)],
                names,
            )
        timings["search_s"] = round(time.perf_counter() - t, 1)
        notes = {c.name: c.note for c in configs}
        for name, lat in latency.items():
            notes[name] += f" [sql p50 {lat['sql_p50_ms']:.1f} ms, p95 {lat['sql_p95_ms']:.1f} ms]"
        for c in configs:
            if c.tuned:
                w = TUNED[args.dataset][c.name]
                notes[c.name] += f" (text {w['text']}, recency {w['recency']}, rrf_k {w['rrf_k']})"
        if args.diagnose:
            diag = await diagnose(args.dataset, data, indexes[sorted(indexes)[0]], rankings)
            results.update(diag)
        tuning = None
        if args.tune:
            tuning = await tune(args.dataset, data, indexes)
            print_table(
                f"Tuning on {data.name} (library fusion replayed on library rankings, pool 50)",
                {k: v["metrics"] for k, v in tuning.items()},
                names,
                {k: json.dumps(v["weights"]) for k, v in tuning.items()},
            )
        for index in indexes.values():
            await index.store.close()
        timings["total_s"] = round(time.perf_counter() - t0, 1)
        embedded = {e: i.embedder.embedded for e, i in indexes.items()}
        slice_name = data.name if args.dataset == "lme" else "locomo10"
        n_q = len(data.questions)
        title = (
            f"{slice_name}: session-level, {n_q} questions with user-side evidence"
            if args.dataset == "lme"
            else f"{slice_name}: turn-level, {n_q} questions (all categories)"
        )
        print_table(title, results, names, notes)
        print(
            f"\ntimings: {timings}; texts embedded this run (not cached): {embedded}; "
            f"PostgreSQL {db.server_version}, pgvector {db.pgvector}; {os.cpu_count()} CPUs"
        )
        return {
            "dataset": args.dataset,
            "slice": slice_name,
            "questions": n_q,
            "memories": n_docs,
            "configs": results,
            "weights": {c.name: TUNED[args.dataset][c.name] for c in configs if c.tuned}
            | {
                c.name: {
                    "chunks": c.chunks,
                    **asdict(SearchWeights(**dict(c.weights), fusion=c.fusion)),  # type: ignore[arg-type]
                }
                for c in configs
                if c.mode == "candidate"
            },
            "latency": latency,
            "stemming": pgterms.STEMMING,
            "tuning": tuning,
            "timings": timings,
            "embedded_this_run": embedded,
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "postgresql": db.server_version,
                "pgvector": db.pgvector,
            },
        }
    finally:
        db.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("lme", "locomo"), default="lme")
    parser.add_argument("--slice", choices=("dev", "test"), default="dev", help="LongMemEval slice")
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=list(CONFIGS),
        default=list(DEFAULT_CONFIGS),
        metavar="CONFIG",
        help=f"default: {' '.join(DEFAULT_CONFIGS)}; all: {', '.join(CONFIGS)}",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--data-dir", default=str(DEFAULT_DATA_DIR), help="where the bench data lives"
    )
    parser.add_argument(
        "--cache-dir", default=str(CACHE_DIR), help="embedding cache (default bench/.cache)"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="CPU threads per embedder (default 2)"
    )
    parser.add_argument(
        "--tune", action="store_true", help="grid-search the hybrid weights (dev/LoCoMo only)"
    )
    parser.add_argument(
        "--diagnose", action="store_true", help="add keyword-ranking diagnostic rows"
    )
    parser.add_argument(
        "--questions", type=int, default=0, help="only the first N questions (smoke test)"
    )
    parser.add_argument(
        "--path",
        choices=("session", "provider"),
        default="session",
        help="session: the benchmarks' own protocol (one memory per LME session / LoCoMo "
        "turn); provider: one row per message through ChatHistoryMemoryProvider",
    )
    parser.add_argument(
        "--provider-embedder",
        choices=("use", "minilm"),
        default="use",
        help="embedder of the provider path (default: the library's default, USE)",
    )
    parser.add_argument(
        "--locomo-doc",
        choices=("speaker", "plain"),
        default="speaker",
        help="LoCoMo memory text: '<speaker>: <text>' (default) or the text alone",
    )
    parser.add_argument(
        "--no-stemming", action="store_true", help="keyword terms without stemming (as before)"
    )
    args = parser.parse_args()
    if args.no_stemming:
        pgterms.STEMMING = False
    _datasets.LOCOMO_DOC = args.locomo_doc
    if args.tune and args.dataset == "lme" and args.slice == "test":
        parser.error("tune on lme_s_dev (or LoCoMo); lme_s_test is the held-out slice")
    out = asyncio.run(amain(args))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
