"""The data sets, their scores and the cached embeddings that ``retrieval.py`` (in SQL, through
the store) and ``recall_lab.py`` (client-side, in numpy) share, so both score the same questions
the same way and neither imports the other: LongMemEval_S and LoCoMo loaded as scopes of
memories and questions, the product's own message rows of each (``ProviderMessage``), the
metrics, the embedders with their on-disk cache, LongMemEval's sessions as chunks, and the table
both print.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from bench._common.paths import CACHE, DATA
from pgmemory.embedders.base import WrappingEmbedder

#: LongMemEval and LoCoMo (``--data-dir``); never copied into the repository.
DEFAULT_DATA_DIR = DATA
#: The embeddings' SQLite cache lives here (``--cache-dir``).
CACHE_DIR = CACHE

LME_METRICS = (
    "recall_all@5",
    "recall_all@10",
    "ndcg_any@5",
    "ndcg_any@10",
    "hit@1",
    "hit@5",
    "mrr",
)
LOCOMO_METRICS = ("recall@5", "recall@10")


# --- data -------------------------------------------------------------------------------------


@dataclass
class Doc:
    key: str  # session id (LME) or dia_id (LoCoMo)
    text: str
    created_at: datetime
    #: the chat session it was said in, stored as the memory's session_id (the conversation
    #: whose neighbouring messages SearchWeights.neighbour looks at): an LME memory is a whole
    #: session of its own; a LoCoMo turn belongs to session N of its conversation
    conversation: str = ""


@dataclass
class Question:
    qid: str
    scope: str
    text: str
    targets: list[str]  # LME: target session ids; LoCoMo: evidence dia_ids
    kind: str = ""


@dataclass
class Dataset:
    name: str
    scopes: dict[str, list[Doc]] = field(default_factory=dict)
    questions: list[Question] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)


def _lme_date(text: str) -> datetime:
    return datetime.strptime(re.sub(r"\s*\(\w+\)\s*", " ", text), "%Y/%m/%d %H:%M").replace(
        tzinfo=UTC
    )


def load_lme(path: Path) -> Dataset:
    raw = json.loads(gzip.decompress(path.read_bytes()))
    sessions: dict[str, list[dict[str, Any]]] = raw["sessions"]
    data = Dataset(name=path.name.removesuffix(".json.gz"))
    for q in raw["questions"]:
        qid = q["question_id"]
        docs: list[Doc] = []
        seen: set[str] = set()
        for sid, date in zip(q["haystack_session_ids"], q["haystack_dates"], strict=True):
            if sid in seen:  # a handful of haystacks list a session twice: index it once
                data.skipped["duplicate haystack session"] += 1
                continue
            seen.add(sid)
            text = " ".join(t["content"] for t in sessions[sid] if t["role"] == "user")
            if not text.strip():
                data.skipped["session without user text"] += 1
                continue
            docs.append(Doc(sid, text, _lme_date(date), conversation=sid))
        targets = [
            sid
            for sid in q["answer_session_ids"]
            if any(t["role"] == "user" and t.get("has_answer") for t in sessions.get(sid, []))
        ]
        if qid.endswith("_abs"):
            data.skipped["_abs question"] += 1
            continue
        if not targets:
            data.skipped["question without user-side evidence"] += 1
            continue
        data.scopes[qid] = docs
        data.questions.append(Question(qid, qid, q["question"], targets, q["question_type"]))
    return data


_LOCOMO_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %B %d, %Y")


def _locomo_date(text: str) -> datetime:
    for fmt in _LOCOMO_DATE_FORMATS:
        try:
            return datetime.strptime(text.strip(), fmt).replace(tzinfo=UTC)
        except ValueError:
            pass
    raise ValueError(f"unparsed LoCoMo date {text!r}")


#: How a LoCoMo turn becomes a memory text: "speaker" = "<speaker>: <text>", "plain" = the text.
LOCOMO_DOC = "speaker"


def locomo_turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}" if LOCOMO_DOC == "speaker" else turn["text"]
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def load_locomo(path: Path) -> Dataset:
    raw = json.loads(gzip.decompress(path.read_bytes()))
    data = Dataset(name="locomo10")
    for conv in raw:
        cid = conv["sample_id"]
        c = conv["conversation"]
        docs: list[Doc] = []
        n = 1
        while f"session_{n}_date_time" in c:
            turns = c.get(f"session_{n}") or []
            start = _locomo_date(c[f"session_{n}_date_time"])
            for i, turn in enumerate(turns):
                # turns of a session share its date; seconds keep them in order for recency
                docs.append(
                    Doc(
                        turn["dia_id"],
                        locomo_turn_text(turn),
                        start + timedelta(seconds=i),
                        conversation=f"session_{n}",
                    )
                )
            n += 1
        data.scopes[cid] = docs
        for i, qa in enumerate(conv["qa"]):
            evidence = [
                e for item in qa.get("evidence", []) for e in re.split(r"[;\s]+", item) if e
            ]
            data.questions.append(
                Question(f"{cid}#{i}", cid, str(qa["question"]), evidence, str(qa["category"]))
            )
    return data


# --- metrics ----------------------------------------------------------------------------------


def _dcg(relevances: Sequence[float], k: int) -> float:
    """LongMemEval's DCG: rel[0] + sum(rel[i] / log2(i + 1)) for i >= 1."""
    rel = np.asarray(relevances, dtype=float)[:k]
    if rel.size:
        return float(rel[0] + np.sum(rel[1:] / np.log2(np.arange(2, rel.size + 1))))
    return 0.0


def lme_scores(ranked: Sequence[str], targets: Sequence[str]) -> dict[str, float]:
    wanted = set(targets)
    out: dict[str, float] = {}
    for k in (5, 10):
        top = ranked[:k]
        out[f"recall_all@{k}"] = float(all(t in top for t in wanted))
        ideal = _dcg([1.0] * len(wanted), k)
        out[f"ndcg_any@{k}"] = _dcg([1.0 if d in wanted else 0.0 for d in top], k) / ideal
    out["hit@1"] = float(any(t in ranked[:1] for t in wanted))
    out["hit@5"] = float(any(t in ranked[:5] for t in wanted))
    first = next((i for i, d in enumerate(ranked) if d in wanted), None)
    out["mrr"] = 0.0 if first is None else 1.0 / (first + 1)
    return out


def locomo_scores(ranked: Sequence[str], evidence: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in (5, 10):
        if not evidence:
            out[f"recall@{k}"] = 1.0
        else:
            top = set(ranked[:k])
            out[f"recall@{k}"] = sum(e in top for e in evidence) / len(evidence)
    return out


def score(dataset: str, ranked: Sequence[str], q: Question) -> dict[str, float]:
    return lme_scores(ranked, q.targets) if dataset == "lme" else locomo_scores(ranked, q.targets)


def mean_scores(rows: list[dict[str, float]], names: Sequence[str]) -> dict[str, float]:
    return {m: float(np.mean([r[m] for r in rows])) if rows else float("nan") for m in names}


# --- embeddings, cached on disk -----------------------------------------------------------------


class DiskCachedEmbedder(WrappingEmbedder):
    """Wraps a pgmemory embedder; vectors persist in SQLite keyed by (model id, sha256(text))."""

    def __init__(self, inner: Any, path: Path) -> None:
        super().__init__(inner)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS emb (model TEXT, sha BLOB, vec BLOB, PRIMARY KEY (model, sha))"
        )
        self._mem: dict[bytes, np.ndarray] = {
            sha: np.frombuffer(vec, dtype=np.float32)
            for sha, vec in self._db.execute(
                "SELECT sha, vec FROM emb WHERE model = ?", (self.model_id,)
            )
        }
        self.embedded = 0  # texts actually run through the model in this process

    @staticmethod
    def _key(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8")).digest()

    async def warm(self, texts: Sequence[str], *, desc: str, chunk: int = 128) -> None:
        """Embed every text not cached yet, in chunks, with a progress bar (longest first)."""
        missing = {self._key(t): t for t in texts}
        missing = {k: t for k, t in missing.items() if k not in self._mem}
        if not missing:
            return
        items = sorted(missing.items(), key=lambda kv: -len(kv[1]))
        bar = tqdm(total=len(items), desc=desc, unit="text")
        for start in range(0, len(items), chunk):
            part = items[start : start + chunk]
            vectors = await self.inner.embed([t for _, t in part])
            self._store([k for k, _ in part], vectors)
            bar.update(len(part))
        bar.close()

    def _store(self, keys: list[bytes], vectors: np.ndarray) -> None:
        rows = []
        for key, vec in zip(keys, vectors, strict=True):
            vec = np.ascontiguousarray(vec, dtype=np.float32)
            self._mem[key] = vec
            rows.append((self.model_id, key, vec.tobytes()))
        self._db.executemany("INSERT OR REPLACE INTO emb VALUES (?, ?, ?)", rows)
        self._db.commit()
        self.embedded += len(keys)

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self._mem}
        if missing:
            vectors = await self.inner.embed(list(missing.values()))
            self._store(list(missing), vectors)
        return (
            np.stack([self._mem[k] for k in keys])
            if keys
            else np.zeros((0, self.dimensions), np.float32)
        )


def make_embedder(name: str, threads: int, cache_dir: Path) -> DiskCachedEmbedder:
    if name == "use":
        from pgmemory.embedders.use import USEEmbedder

        inner: Any = USEEmbedder(threads=threads)
    else:
        from pgmemory.embedders.minilm import MiniLMEmbedder

        inner = MiniLMEmbedder(threads=threads)
    return DiskCachedEmbedder(inner, cache_dir / "embeddings.sqlite")


# --- the product's own path: one row per message ----------------------------------------


@dataclass
class ProviderMessage:
    key: str  # what a recalled row counts as: its session id (LME) or its dia_id (LoCoMo)
    message_id: str
    session_id: str
    role: str  # "user" or "assistant"
    text: str
    created_at: datetime


def lme_provider_messages(path: Path, data: Dataset) -> dict[str, list[ProviderMessage]]:
    """Every turn (user and assistant) of each haystack session, as the provider stores it."""
    sessions = json.loads(gzip.decompress(path.read_bytes()))["sessions"]
    out: dict[str, list[ProviderMessage]] = {}
    for scope, docs in data.scopes.items():
        rows = out.setdefault(scope, [])
        for d in docs:
            for i, turn in enumerate(sessions[d.key]):
                if turn["content"].strip():
                    rows.append(
                        ProviderMessage(
                            d.key,
                            f"{d.key}:{i}",
                            d.key,
                            turn["role"],
                            turn["content"],
                            d.created_at + timedelta(seconds=i),
                        )
                    )
    return out


def locomo_provider_messages(path: Path) -> dict[str, list[ProviderMessage]]:
    """Every LoCoMo turn as one message: the first speaker is the user, the second the assistant;
    the text is the turn's text (no speaker prefix: the provider stores what was said), plus the
    shared photo's caption as retrieval.py's session path has it."""
    raw = json.loads(gzip.decompress(path.read_bytes()))
    out: dict[str, list[ProviderMessage]] = {}
    for conv in raw:
        c = conv["conversation"]
        rows = out.setdefault(conv["sample_id"], [])
        n = 1
        while f"session_{n}_date_time" in c:
            start = _locomo_date(c[f"session_{n}_date_time"])
            for i, turn in enumerate(c.get(f"session_{n}") or []):
                text = turn["text"]
                if turn.get("blip_caption"):
                    text += f" [shares a photo: {turn['blip_caption']}]"
                role = "user" if turn["speaker"] == c["speaker_a"] else "assistant"
                rows.append(
                    ProviderMessage(
                        turn["dia_id"],
                        turn["dia_id"],
                        f"session_{n}",
                        role,
                        text,
                        start + timedelta(seconds=i),
                    )
                )
            n += 1
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


# --- output -----------------------------------------------------------------------------------


def print_table(
    title: str, results: dict[str, dict[str, float]], names: Sequence[str], notes: dict[str, str]
) -> None:
    width = max(len(n) for n in results) + 2
    print(f"\n{title}")
    header = f"{'config':<{width}}" + "".join(f"{m:>14}" for m in names) + "  note"
    print(header)
    print("-" * len(header))
    for name, metrics in results.items():
        print(
            f"{name:<{width}}"
            + "".join(f"{metrics[m]:>14.4f}" for m in names)
            + f"  {notes.get(name, '')}"
        )
