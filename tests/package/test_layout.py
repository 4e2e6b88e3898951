"""The package's layout rules, read from the source: arrows point one way, the two planes stay
apart, every module is on the map, and no code is packed to look shorter.

A module's length is no rule (one concept per module, however long): the line cap this test
once held shaped the code instead of the concepts (argument lists packed under ``# fmt: skip``,
concepts split to fit), so it is gone, and so is the packing.

Every import counts, wherever it is written: at module level, under ``if TYPE_CHECKING:`` and
inside functions. A dependency a reader follows is a dependency, whether or not it runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pgmemory

PACKAGE = Path(pgmemory.__file__).parent
#: What the data plane must never import: the planes and faces built on it.
ABOVE_THE_STORE = (
    "pgmemory.admin",
    "pgmemory.cli",
    "pgmemory.ui",
    "pgmemory.integrations",
    "pgmemory.sync",
)
#: What the admin plane may import of pgmemory: the store and the ground floor.
ADMIN_MAY_IMPORT = (
    "pgmemory.admin",
    "pgmemory.store",
    "pgmemory.embedders.base",  # the Embedder protocol: a re-embedding takes one
    "pgmemory.errors",
    "pgmemory.settings",
    "pgmemory.telemetry",
    "pgmemory.text",
    "pgmemory.vocabulary",
    "pgmemory.extras",
    "pgmemory._exports",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str) -> Iterator[str]:
    """The pgmemory modules ``name`` imports anywhere in its source."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import submodule` imports the submodule; `from mod import name`, mod.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        yield from (t for t in targets if t in MODULES and t != name)


GRAPH = {name: set(_imports(name)) for name in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(GRAPH[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles() == []


def test_the_store_never_imports_the_planes_and_faces_above_it() -> None:
    wrong = {
        name: sorted(t for t in targets if _within(t, ABOVE_THE_STORE))
        for name, targets in GRAPH.items()
        if _within(name, ("pgmemory.store",))
    }
    assert {name: targets for name, targets in wrong.items() if targets} == {}


def test_the_admin_plane_imports_only_the_store_and_the_ground_floor() -> None:
    wrong = {
        name: sorted(t for t in targets if not _within(t, ADMIN_MAY_IMPORT))
        for name, targets in GRAPH.items()
        if _within(name, ("pgmemory.admin",))
    }
    assert {name: targets for name, targets in wrong.items() if targets} == {}
    assert any(_within(t, ("pgmemory.store",)) for t in GRAPH["pgmemory.admin.admin"])


def test_the_ground_floor_imports_nothing_of_pgmemory_but_itself() -> None:
    for name in ("pgmemory.errors", "pgmemory.vocabulary", "pgmemory._exports"):
        assert GRAPH[name] == set(), name


def test_no_code_is_packed_under_fmt_skip() -> None:
    """The formatter lays out every statement of pgmemory/: none is exempted to keep an
    argument list on fewer lines."""
    packed = [
        f"{name}:{number}"
        for name, path in MODULES.items()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert packed == []


def test_only_the_integration_imports_agent_framework() -> None:
    """agent-framework is an extra: outside its integration package nothing imports it (the
    providers reach ``pgmemory`` as lazy exports)."""
    wrong = []
    for name, path in MODULES.items():
        if _within(name, ("pgmemory.integrations.agent_framework",)):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            wrong += [f"{name}: {m}" for m in modules if m.split(".")[0] == "agent_framework"]
    assert wrong == []


def _layout_tree() -> set[str]:
    """The paths docs/layout.md's tree names (its first code block: two spaces a level, a
    folder ``name/``, a module ``name.py``), relative to the repository."""
    text = (PACKAGE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    block = text.split("```\n", 2)[1]
    named: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines():
        stripped = line.lstrip(" ")
        name = stripped.split(" ", 1)[0]
        if not (name.endswith("/") or name.endswith(".py")):
            continue  # a description wrapped onto its own line
        folders = folders[: (len(line) - len(stripped)) // 2]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
            named.add("/".join(folders))
        else:
            named.add("/".join([*folders, name]))
    return named


def test_docs_layout_lists_every_module() -> None:
    """Every module of pgmemory/ has its line in docs/layout.md (a package's ``__init__.py``
    is its folder's line), and every module the tree names exists (issue 57: the map had drifted,
    eleven modules missing)."""
    named = _layout_tree()
    modules = {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.relative_to(PACKAGE).parts
    }
    folders = {path.rsplit("/", 1)[0] for path in modules if path.endswith("/__init__.py")}
    listed = named | {f"{folder}/__init__.py" for folder in folders if folder in named}
    missing = sorted(modules - listed)
    assert not missing, f"docs/layout.md has no line for: {missing}"
    gone = sorted(p for p in named if p.endswith(".py") and p not in modules)
    assert not gone, f"docs/layout.md names modules that do not exist: {gone}"
