"""Old sources run against today's tree: the modules that moved, and where to.

The A/B scripts load a module as it was at a git ref (``git show ref:path``) beside today's
package. A source from before a move imports the moved modules by their old names; each move
is listed here, so that such a source still loads (``--before`` on any side of the move).
"""

from __future__ import annotations

import re

#: Modules of ``pgmemory.store`` that moved into ``pgmemory.store._engine`` (issue 56).
MOVED_TO_ENGINE = (
    "addresses",
    "binary",
    "clauses",
    "connector",
    "database",
    "deployment",
    "driver_errors",
    "fastpath",
    "held",
    "lifecycle",
    "replicas",
    "retry",
    "unit_of_work",
)

_DOTTED = re.compile(r"\bpgmemory\.store\.(" + "|".join(MOVED_TO_ENGINE) + r")\b")
_FROM_PACKAGE = re.compile(r"^(\s*)from pgmemory\.store import ([^\n(]+)$", re.MULTILINE)


def _split_from(match: re.Match[str]) -> str:
    """``from pgmemory.store import a, b as c`` with the moved names imported from the engine."""
    indent, names = match.group(1), [n.strip() for n in match.group(2).split(",")]
    moved = [n for n in names if n.split(" as ")[0].strip() in MOVED_TO_ENGINE]
    kept = [n for n in names if n not in moved]
    lines = [f"{indent}from pgmemory.store import {', '.join(kept)}"] if kept else []
    if moved:
        lines.append(f"{indent}from pgmemory.store._engine import {', '.join(moved)}")
    return "\n".join(lines)


def today(source: str) -> str:
    """``source`` (a module of ``pgmemory.store`` at some ref) importing what it imports from
    where it lives today."""
    return _DOTTED.sub(r"pgmemory.store._engine.\1", _FROM_PACKAGE.sub(_split_from, source))
