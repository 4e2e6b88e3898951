"""Small value types the store takes and returns."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal

import numpy as np

from pgmemory.errors import InvalidInputError, ScopeError, UnscopedError
from pgmemory.store.validation import check_name, check_text, describe

#: Longest scope value accepted (application, agent, user or session id).
MAX_SCOPE_VALUE_CHARS = 256


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryScope:
    """Who a memory belongs to: up to four dimensions, each optional.

    As a *storage* scope, every dimension that is set is written on the new rows. As a *search*
    scope, every dimension that is set must match exactly and a dimension left ``None`` is not
    filtered. Values are matched literally (quotes, ``%``, ``_`` and backslashes have no special
    meaning).

    A value must be a non-blank string of at most 256 characters, without NUL or lone
    surrogates (ids are keys: they are refused, never rewritten). Where a scope is stored, its
    values must also fit the index entries that hold them together, counted in UTF-8 bytes (a
    CJK character takes 3, an emoji 4): PostgreSQL holds at most 2,704 bytes per B-tree entry.
    The unique message index holds the collection name, the four ids and the message id; in a
    collection of up to 512 dimensions the covering index holds the collection name and the four
    ids beside the vector, which leaves them about ``2,650 - 4 * dimensions`` bytes together
    (about 600 at 512 dimensions, 1,100 at 384). A write that would not fit is refused before any SQL,
    with an :class:`~pgmemory.errors.InvalidInputError` naming the fields, their byte lengths
    and the index (see :func:`pgmemory.store.validation.check_index_entries`).
    """

    DIMENSIONS: ClassVar[tuple[str, ...]] = ("application_id", "agent_id", "user_id", "session_id")

    application_id: str | None = None
    agent_id: str | None = None
    user_id: str | None = None
    session_id: str | None = None

    def __post_init__(self) -> None:
        for name in self.DIMENSIONS:
            _check_scope_value(name, getattr(self, name))

    @property
    def is_empty(self) -> bool:
        """True when no dimension is set (such a search would cover every tenant)."""
        return not self.as_dict()

    def as_dict(self) -> dict[str, str]:
        """The dimensions that are set, by column name."""
        return {
            name: value for name in self.DIMENSIONS if (value := getattr(self, name)) is not None
        }

    def column_values(self) -> dict[str, str]:
        """All four dimensions as stored: an unset dimension is ``''``."""
        return {name: getattr(self, name) or "" for name in self.DIMENSIONS}

    def to_dict(self) -> dict[str, str | None]:
        """JSON-native form (for session state)."""
        return {name: getattr(self, name) for name in self.DIMENSIONS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryScope:
        """Inverse of :meth:`to_dict`.

        Raises:
            ScopeError: ``data`` is not a mapping (e.g. None), has unknown keys, or a value is
                not a usable id.
        """
        if not isinstance(data, Mapping):
            raise ScopeError(
                f"a scope must be a mapping of {list(cls.DIMENSIONS)} to ids or None, got "
                f"{describe(data)}"
            )
        unknown = [key for key in data if key not in cls.DIMENSIONS]
        if unknown:
            raise ScopeError(
                f"{len(unknown)} unknown scope keys; expected some of {list(cls.DIMENSIONS)}"
            )
        return cls(**dict(data))


def _check_scope_value(name: str, value: object) -> None:
    if value is not None:
        check_text(
            value,
            what=name,
            max_chars=MAX_SCOPE_VALUE_CHARS,
            error=ScopeError,
            expected="a string or None",
            if_blank="pass None to leave the dimension unset, or a non-blank id",
            if_long="use a shorter id or a hash of it",
        )


def check_search_scope(scope: object, *, allow_unscoped: bool) -> MemoryScope:
    """Check the scope of a read or an erasure: a :class:`MemoryScope`, not empty unless allowed.

    Args:
        scope: What the caller passed as the scope.
        allow_unscoped: Whether an empty scope (every tenant's memories) is really meant.

    Returns:
        The scope, unchanged.

    Raises:
        ScopeError: The scope is not a MemoryScope, or is empty without ``allow_unscoped``.
    """
    if not isinstance(scope, MemoryScope):
        raise ScopeError(f"scope must be a MemoryScope, got {describe(scope)}")
    if scope.is_empty and not allow_unscoped:
        raise UnscopedError(
            "the search scope sets no dimension, so it would cover every user's memories; "
            "set user_id (or session_id, agent_id, application_id), or pass "
            "allow_unscoped=True if that is really meant"
        )
    return scope


@dataclass(kw_only=True, slots=True)
class MemoryRecord:
    """A memory to store. Leave ``embedding`` unset to have the store's embedder make it.

    Leave ``id`` unset for a new memory (the store gives it a time-ordered UUID); set it only to
    restore a memory under the id it had (e.g. importing an export), which fails if the user
    already has a memory of that id.
    """

    content: str
    scope: MemoryScope
    role: str = "user"
    author_name: str | None = None
    message_id: str | None = None
    source_type: str = "external"
    source_id: str | None = None
    embedding: Sequence[float] | np.ndarray | None = None
    created_at: datetime | None = None
    expires_at: datetime | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    id: uuid.UUID | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Memory:
    """A stored memory, as read back."""

    id: uuid.UUID
    collection: str
    scope: MemoryScope
    role: str
    content: str
    author_name: str | None
    message_id: str | None
    source_type: str
    source_id: str | None
    embedding_model: str
    created_at: datetime
    expires_at: datetime | None
    metadata: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Signals:
    """What each signal contributed to a ranked memory's score (None: not part of the mode).

    In ``hybrid`` mode with score fusion each value is the weighted, scaled signal (they sum
    to the score): ``similarity`` (vector weight times the scaled cosine similarity),
    ``keywords`` (text weight times the scaled BM25), ``recency`` (recency weight times the
    scaled creation time) and ``neighbour`` (the share lent by the better of the two adjacent
    messages of its conversation). With rank fusion each is the ranking's reciprocal-rank
    share (``neighbour`` 0). In ``vector`` mode ``similarity`` is the cosine similarity, in
    ``text`` mode ``keywords`` is the BM25 value; the other signals are None.
    """

    similarity: float | None = None
    keywords: float | None = None
    recency: float | None = None
    neighbour: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        """JSON-native form (as the recall audit keeps it)."""
        return {
            "similarity": self.similarity,
            "keywords": self.keywords,
            "recency": self.recency,
            "neighbour": self.neighbour,
        }

    def summary(self) -> str:
        """One line for people: each signal the mode has, e.g. ``similarity 0.81 · keywords
        0.40 · neighbour 0.10`` (``""`` when none)."""
        return " · ".join(f"{k} {v:.2f}" for k, v in self.as_dict().items() if v is not None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Signals | None:
        """Inverse of :meth:`as_dict` (None for None)."""
        if data is None:
            return None

        def number(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        return cls(
            similarity=number("similarity"),
            keywords=number("keywords"),
            recency=number("recency"),
            neighbour=number("neighbour"),
        )


@dataclass(frozen=True, slots=True)
class MemoryHit:
    """A recalled memory and its score; higher is better, and what it measures is the mode's.

    * ``mode="vector"``: the cosine similarity to the query, from -1 to 1 (1 = same direction).
    * ``mode="text"``: the keyword match's BM25 relevance within the scope, above 0 and
      unbounded (it grows with rare terms and repeated matches).
    * ``mode="hybrid"``: the fused value (see :class:`SearchWeights`). With score fusion (the
      default), the weighted sum of the scaled signals, from 0 to the sum of the weights; with
      ``fusion="rank"``, the sum over rankings of ``weight / (rrf_k + rank)``, small positive
      numbers. Either is comparable only within one search.
    """

    memory: Memory
    score: float
    #: What each signal contributed (``search(..., explain=True)`` only; else None).
    signals: Signals | None = None


#: Why a recall shows a memory: it matched the query, it is one of the recent turns, or most
#: of its score was lent by an adjacent message of its conversation that matched.
RecallReason = Literal["match", "recent", "neighbour"]


@dataclass(frozen=True, slots=True)
class RecallItem:
    """One memory a recall shows, and why.

    Attributes:
        memory: The memory.
        reason: ``"match"``, ``"recent"`` or ``"neighbour"`` (see :data:`RecallReason`).
        score: Its ranking score (0 for a recent turn).
        signals: What each signal contributed to ``score`` (None for a recent turn).
        line: The line the model sees for it (shortened to fit the budget when needed).
    """

    memory: Memory
    reason: RecallReason
    score: float
    signals: Signals | None
    line: str


@dataclass(frozen=True, slots=True)
class Recall:
    """What a recall shows the model, exactly as its audit row records it.

    Attributes:
        text: The rendered text (within the budget), ``""`` when nothing is shown.
        items: The shown memories: the related ones (most relevant first), then the recent
            turns (oldest first), the order of ``text``.
        mode: The retrieval mode actually used (``"hybrid"``, ``"vector"``, ``"text"``, or
            ``"recent"`` when there was no query).
    """

    text: str
    items: list[RecallItem]
    mode: str

    @property
    def memory_ids(self) -> list[uuid.UUID]:
        """The shown memories' ids, in shown order."""
        return [item.memory.id for item in self.items]

    @property
    def memories(self) -> list[Memory]:
        """The shown memories, in shown order."""
        return [item.memory for item in self.items]


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectionInfo:
    """A collection's catalogue entry: its vectors' size and the model that makes them."""

    name: str
    dimensions: int
    embedding_model: str
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class HistoryRow:
    """One message of a session's chat history, in order (``seq`` grows, with possible gaps)."""

    seq: int
    message: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class RecallTrace:
    """Who is recalling, for the recall audit row (all optional)."""

    provider: str = ""
    mode: str = ""
    session_id: str = ""
    #: Store the query text itself in the audit row (off: only its sha256 is kept).
    include_query_text: bool = False

    def __post_init__(self) -> None:
        for name in ("provider", "mode", "session_id"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidInputError(
                    f"RecallTrace.{name} must be a string ('' when unknown), got {describe(value)}"
                )
            if value:
                check_name(value, what=f"RecallTrace.{name}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchWeights:
    """How ``mode="hybrid"`` fuses its rankings: similarity, keyword match, newest first.

    Each ranking with a positive weight contributes its best ``pool`` rows. With
    ``fusion="score"`` (the default) a pooled memory scores ``vector * similarity' + text *
    keywords' + recency * time'``, each signal scaled to 0–1 within the searched scope
    (similarity' = 1 for the scope's most similar memory and 0 for its least, keywords' =
    BM25 / the scope's best BM25, 0 without a matching term, time' = 1 for the newest): a
    memory far ahead on one signal stays ahead, and the score has a fixed range (0 to the sum
    of the weights, times ``1 + neighbour``). ``fusion="rank"`` is reciprocal-rank fusion (the earlier default): each
    ranking gives its rows ``weight / (rrf_k + rank)``; ``rrf_k`` is used by it only.
    Recency is off by default.

    ``neighbour`` (score fusion only) adds to a memory's score that weight times the better
    score of the two memories stored just before and just after it in the same conversation
    (same user, application, agent and session, by ``created_at``), and lets those
    neighbours of pooled memories compete too: in a chat the answer often sits in the
    message next to the one that matches the question ("what did she recommend?" matches
    the question turn, the recommendation is the reply). Memories of other conversations
    never lend their score, however close in time. 0 turns it off. See
    docs/retrieval.md for the measurements behind these defaults.
    """

    vector: float = 1.0
    text: float = 1.0
    recency: float = 0.0
    rrf_k: int = 60
    pool: int = 50
    fusion: Literal["score", "rank"] = "score"
    neighbour: float = 0.5

    def __post_init__(self) -> None:
        for name in ("vector", "text", "recency", "neighbour"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or value != value:
                raise InvalidInputError(
                    f"SearchWeights.{name} is {describe(value)}; expected a number >= 0"
                )
        if self.fusion not in ("score", "rank"):
            raise InvalidInputError(
                f"SearchWeights.fusion is {describe(self.fusion)}; expected 'score' or 'rank'"
            )
        if not isinstance(self.rrf_k, int) or self.rrf_k < 1:
            raise InvalidInputError(
                f"SearchWeights.rrf_k is {describe(self.rrf_k)}; expected an integer >= 1"
            )
        if not isinstance(self.pool, int) or not 1 <= self.pool <= 10_000:
            raise InvalidInputError(
                f"SearchWeights.pool is {describe(self.pool)}; expected 1 to 10000"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class AnnStatus:
    """The approximate path of a collection, as its last recall probe left it.

    ``enabled`` is True only when the probe measured ``recall`` >= ``recall_floor`` on the
    collection's large scopes; ``probed_scopes`` says how many user scopes the probe used
    (0: no scope is large enough yet, so every search stays exact). ``method`` is the index's
    kind, ``hnsw`` (searched with ``ef_search``) or ``ivfflat`` (reading ``probes`` lists
    first).
    """

    collection: str
    enabled: bool
    recall: float | None
    recall_floor: float
    min_scope_rows: int
    ef_search: int
    probed_scopes: int
    method: str = "hnsw"
    probes: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TwoPhaseStatus:
    """The two-phase path of a collection's large user scopes, as a probe just measured it
    (:meth:`~pgmemory.store.store.MemoryStore.probe_two_phase`).

    Searches of a user scope of more than ``min_scope_rows`` memories take ``first_pass``
    (then an exact re-rank of the rows it keeps), or stay exact when it is None: no first pass
    reached ``recall_floor``, or no scope is that large (``large_scopes`` 0).
    """

    collection: str
    #: The first passes the memories keep: ``codes`` (binary codes, pgvector >= 0.7) and
    #: ``halves`` (half vectors, added by ``pgmemory db half-vectors``).
    first_passes: tuple[str, ...]
    #: The pass searches of large scopes take from now on (None: exact).
    first_pass: str | None
    #: Each kept pass's recall@10 against the exact search, on the probed scopes' own rows.
    recalls: Mapping[str, float]
    recall_floor: float
    min_scope_rows: int
    #: User scopes of more than ``min_scope_rows`` memories, and how many the probe searched.
    large_scopes: int
    probed_scopes: int

    def as_dict(self) -> dict[str, Any]:
        """The status as JSON-ready values."""
        return {**asdict(self), "first_passes": list(self.first_passes)}
