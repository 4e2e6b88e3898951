"""Search modes: how a search ranks a scope's memories, and what its score means, defined once.

The statements (:func:`pgmemory.store._ranking.search.search_memories`), the store's checks, the
providers' options, the command line and the audit page all take their list of modes, labels
and score descriptions from :data:`MODES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: A search mode's name.
SearchMode = Literal["vector", "text", "hybrid"]
#: How ``hybrid`` fuses its rankings: normalised scores summed, or reciprocal ranks.
Fusion = Literal["score", "rank"]


@dataclass(frozen=True, slots=True)
class Mode:
    """One search mode: how it ranks, and what its score measures."""

    name: SearchMode
    #: What the score is, in a few words ("cosine similarity").
    score: str
    #: The score's column title in command-line tables.
    title: str
    #: One line on how it ranks, for the audit page.
    ranking: str
    #: The score's range and meaning, for help texts.
    scale: str


#: Every mode, in the order they are offered.
MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode(
            name="hybrid",
            score="fused score",
            title="SCORE(fused)",
            ranking=(
                "fused score (cosine and BM25, each scaled to 0–1 within the scope, summed, "
                "plus half a conversation neighbour's)"
            ),
            scale=(
                "cosine similarity and BM25, each scaled to 0..1 within the scope and summed, "
                "plus half the better score of the memory's neighbours in its conversation "
                "(0..3 with the default weights; comparable within one search only)"
            ),
        ),
        Mode(
            name="vector",
            score="cosine similarity",
            title="SCORE(cosine)",
            ranking="cosine similarity",
            scale="cosine similarity (-1..1, 1 = same direction)",
        ),
        Mode(
            name="text",
            score="BM25",
            title="SCORE(BM25)",
            ranking="BM25",
            scale="BM25 keyword relevance (> 0, unbounded)",
        ),
    )
}
#: The modes' names.
SEARCH_MODES: tuple[SearchMode, ...] = tuple(mode.name for mode in MODES.values())
#: The hybrid fusions.
FUSIONS: tuple[Fusion, ...] = ("score", "rank")
#: The mode the store (for a text query), the providers, the command line and the audit page
#: search with unless told.
DEFAULT_MODE: SearchMode = "hybrid"


def score_kind(mode: str) -> str:
    """What a score of a recall in ``mode`` measures ('score' for a label pgmemory did not set).

    Args:
        mode: A search mode, or a provider's own label recorded in the recall audit.

    Returns:
        A short name, e.g. ``"cosine similarity"``.
    """
    found = MODES.get(mode)
    return found.score if found is not None else "score"


def scores_help() -> str:
    """One sentence on every mode's score, for help texts."""
    parts = "; ".join(f"{m.name} mode = {m.scale}" for m in MODES.values())
    return f"scores: {parts}; higher is better in every mode"
