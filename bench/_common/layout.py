"""Old sources run against today's tree: the modules that moved, and where to.

The A/B scripts load a module as it was at a git ref (``git show ref:path``) beside today's
package (:func:`modules_at`). A source from before a move imports the moved modules by their
old names; each move is listed here, so that such a source still loads (``--before`` on any
side of the move), and :func:`ranking_at` finds the ranking's builders wherever they were.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from types import ModuleType, SimpleNamespace

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


#: The ranking wing (issue 57): before it, the search and recall statements' builders were in
#: ``pgmemory/store/queries.py``.
RANKING = "pgmemory/store/_ranking"


def _git(*command: str) -> str:
    from bench._common.paths import ROOT

    return subprocess.run(
        ["git", *command], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def _imports_of(source: str, names: set[str]) -> set[str]:
    """Which of ``names`` (dotted module names) ``source`` imports."""
    found = set()
    for line in source.splitlines():
        line = line.strip()
        if line.startswith("from ") and " import " in line:
            package, imported = line[5:].split(" import ", 1)
            candidates = {package} | {
                f"{package}.{n.split(' as ')[0].strip(' ()')}" for n in imported.split(",")
            }
            found |= candidates & names
    return found


def modules_at(ref: str, paths: list[str]) -> dict[str, ModuleType]:
    """The modules at ``paths`` (files under ``pgmemory/``) as they were at git ``ref``, each
    a module of its own beside today's, by dotted name: while one runs its imports, the others
    it imports stand in for today's (under their real names, and as attributes of their
    package), and everything else is today's. Each source is read with :func:`today`."""
    sources = {
        path.removesuffix(".py").replace("/", "."): today(_git("show", f"{ref}:{path}"))
        for path in paths
    }
    names = set(sources)
    needs = {name: _imports_of(source, names) - {name} for name, source in sources.items()}
    loaded: dict[str, ModuleType] = {}
    while len(loaded) < len(sources):
        ready = [n for n in sources if n not in loaded and needs[n] <= set(loaded)]
        if not ready:
            raise RuntimeError(f"an import cycle among {sorted(set(sources) - set(loaded))}")
        for name in ready:
            loaded[name] = _exec_beside(ref, name, sources[name], loaded)
    return loaded


def _exec_beside(ref: str, name: str, source: str, loaded: dict[str, ModuleType]) -> ModuleType:
    spec = importlib.util.spec_from_loader(f"{name}_at_{ref}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    saved = {k: sys.modules.get(k) for k in loaded}
    parents = {k: importlib.import_module(k.rsplit(".", 1)[0]) for k in loaded}
    saved_attrs = {k: getattr(parents[k], k.rsplit(".", 1)[1], None) for k in loaded}
    sys.modules.update(loaded)
    for k, m in loaded.items():
        setattr(parents[k], k.rsplit(".", 1)[1], m)
    try:
        path = name.replace(".", "/") + ".py"
        exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    finally:
        for k, was in saved.items():
            if was is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = was
        for k, was in saved_attrs.items():
            if was is None:
                delattr(parents[k], k.rsplit(".", 1)[1])
            else:
                setattr(parents[k], k.rsplit(".", 1)[1], was)
    return module


def ranking_paths(ref: str) -> list[str]:
    """The files of the ranking's builders at ``ref``: the wing's modules, or (before the wing)
    ``pgmemory/store/queries.py``."""
    listed = _git("ls-tree", "--name-only", f"{ref}:{RANKING}/").split() if _has(ref) else []
    modules = [f"{RANKING}/{n}" for n in listed if n.endswith(".py") and n != "__init__.py"]
    return modules or ["pgmemory/store/queries.py"]


def _has(ref: str) -> bool:
    from bench._common.paths import ROOT

    return (
        subprocess.run(
            ["git", "cat-file", "-e", f"{ref}:{RANKING}/search.py"], cwd=ROOT, capture_output=True
        ).returncode
        == 0
    )


def ranking_at(ref: str) -> SimpleNamespace:
    """The search and recall statements' builders as they were at ``ref``
    (``search_memories``, ``recall_memories``), wherever they lived then."""
    loaded = modules_at(ref, ranking_paths(ref))
    found = {
        builder: getattr(module, builder)
        for module in loaded.values()
        for builder in ("search_memories", "recall_memories")
        if hasattr(module, builder)
    }
    return SimpleNamespace(**found)


def ranking_now() -> SimpleNamespace:
    """Today's :func:`ranking_at`."""
    from pgmemory.store._ranking.recall import recall_memories
    from pgmemory.store._ranking.search import search_memories

    return SimpleNamespace(search_memories=search_memories, recall_memories=recall_memories)
