"""The recall's token budget, in one place: the SQL stages that choose which rows fit and the
caps of their lines, and the parameters that size them (from
:mod:`pgmemory.store.recall_text`, which renders the lines and estimates their tokens).
"""

from __future__ import annotations

from pgmemory.store import recall_text

#: A row's line cost (see pgmemory.store.recall_text): stored at write time; for a row written
#: by an older version, an upper bound (a character costs at most 4 once JSON-escaped, and the
#: time and role cost less than 32), capped at :item_cap.
NEED = "LEAST(COALESCE({p}recall_tokens, 32 + 4 * length({p}content)), CAST(:item_cap AS bigint))"


def _stage(name: str, source: str, order: str, limit: str, *, where: str = "") -> str:
    """One budget stage: the rows of ``source`` in ``order``, each shown (``cap``, its line's
    token cap) while the running cost stays within ``limit``; the first row that does not fit
    whole is shown shortened to the room left if that is at least ``:min_cap``, and the stage
    stops there. A row costs ``need + 1`` (its line and newline); ``limit`` is what the rows
    may take together, their section heading already counted."""
    where = f"\n        WHERE {where}" if where else ""
    return f"""{name} AS MATERIALIZED (
    SELECT y.*, CASE WHEN y.room >= y.need THEN y.need
                     WHEN y.room >= CAST(:min_cap AS bigint) THEN y.room END AS cap
    FROM (
        SELECT x.*, CAST(({limit}) - sum(x.need + 1) OVER (ORDER BY {order}) + x.need AS bigint)
               AS room
        FROM {source} AS x{where}
    ) AS y
)"""


def _used(name: str, stage: str, section_cost: str) -> str:
    """How many rows a stage showed, how many it had, and what they cost with their heading."""
    return f"""{name} AS MATERIALIZED (
    SELECT count(cap) AS n, count(*) AS total,
           COALESCE(sum(cap + 1), 0)
               + CASE WHEN count(cap) > 0 THEN {section_cost} ELSE 0 END AS used
    FROM {stage}
)"""


def budget_stages() -> list[str]:
    """The recall statement's budget CTEs, after its ``matches`` (in rank order, ``ord``) and
    ``recent`` (newest first, ``pos``; ``seen`` rows never shown): the matches while they fit
    ``:half``, then the recent rows newest first while they fit ``:max_tokens``, then (when
    every recent row is shown) the further matches; each section heading costs
    ``:related_cost`` / ``:recent_cost`` once, and ``:fixed`` is the heading's and note's."""
    fixed = "CAST(:fixed AS bigint)"
    related_cost = "CAST(:related_cost AS bigint)"
    recent_cost = "CAST(:recent_cost AS bigint)"
    return [
        _stage("stage_a", "matches", "x.ord", f"CAST(:half AS bigint) - {fixed} - {related_cost}"),
        _used("used_a", "stage_a", related_cost),
        _stage(
            "stage_b",
            "recent",
            "x.pos",
            f"CAST(:max_tokens AS bigint) - {fixed} - (SELECT used FROM used_a) - {recent_cost}",
            where="NOT x.seen",
        ),
        _used("used_b", "stage_b", recent_cost),
        _stage(
            "stage_c",
            "matches",
            "x.ord",
            f"CAST(:max_tokens AS bigint) - {fixed} - (SELECT used FROM used_a)"
            " - (SELECT used FROM used_b)"
            f" - CASE WHEN (SELECT n FROM used_a) = 0 THEN {related_cost} ELSE 0 END",
            where="x.ord > (SELECT n FROM used_a) AND (SELECT n = total FROM used_b)",
        ),
    ]


#: The budget standing for "no budget" (every row whole).
_UNBOUNDED = 1 << 40


def budget_parameters(max_tokens: int | None, heading: str | None) -> dict[str, int]:
    """The recall statement's budget parameters (:func:`budget_stages`), for ``max_tokens``
    (None: no budget, every row whole) and the recall's ``heading``."""
    related = recall_text.section_tokens(recall_text.RELATED_HEADING)
    recent = recall_text.section_tokens(recall_text.RECENT_HEADING)
    if max_tokens is None:
        return {
            "fixed": 0,
            "half": _UNBOUNDED,
            "max_tokens": _UNBOUNDED,
            "item_cap": _UNBOUNDED,
            "min_cap": 1,
            "related_cost": related,
            "recent_cost": recent,
        }
    fixed = recall_text.fixed_tokens(heading)
    return {
        "fixed": fixed,
        "half": fixed + (max_tokens - fixed) // 2,
        "max_tokens": max_tokens,
        "item_cap": recall_text.item_cap(max_tokens, heading),
        "min_cap": recall_text.MIN_LINE_TOKENS,
        "related_cost": related,
        "recent_cost": recent,
    }
