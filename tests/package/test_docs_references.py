"""What the docstrings name exists: every cross-reference role in pgmemory's docstrings and
``#:`` comments (``:class:``, ``:func:``, ``:meth:``, ``:attr:``, ``:mod:``, ``:data:``,
``:exc:``, ``:obj:``) resolves to a module, class, function, method, attribute or constant that
is there today (issue 57: docstrings named things long gone, such as ``Database.reading`` or
``pgmemory.store.partitioning``).

A target resolves as Sphinx would read it, leniently: a dotted path from an importable module
(``pgmemory.store._ranking.search.search_memories``, ``asyncio.Task``); or a name relative to the
class the docstring is in, to the module, to any class the module defines, or to what the
module imports (``TYPE_CHECKING`` imports included). An attribute counts when its class
declares it (a dataclass field, a slot, an annotation) or assigns it to ``self`` in its code.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pgmemory

#: A cross-reference role and its target (a target may be wrapped over lines).
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`([^`]+)`")
#: A ``#:`` comment (Sphinx's attribute documentation).
_DOC_COMMENT = re.compile(r"^\s*#:(.*)$", re.MULTILINE)


def _modules() -> list[ModuleType]:
    found = []
    for info in pkgutil.walk_packages(pgmemory.__path__, "pgmemory."):
        if ".migrations" in info.name or info.name.endswith("__main__"):
            continue  # migrations are frozen scripts; a __main__ runs when imported
        try:
            found.append(importlib.import_module(info.name))
        except ImportError:  # an optional extra this environment lacks
            continue
    return found


def _imports(tree: ast.Module) -> dict[str, str]:
    """Each name a module imports (anywhere in it), with the dotted path it stands for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
    return names


@functools.cache
def _assigned_to_self(cls: type) -> frozenset[str]:
    """The attributes ``cls`` or a base of it (a framework's, too) assigns to ``self``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__ == "builtins":
            continue
        try:
            tree = ast.parse(inspect.getsource(klass).lstrip())
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return frozenset(names)


def _walk(root: Any, parts: list[str]) -> bool:
    """Whether ``root.parts[0].parts[1]...`` exists (an attribute a class declares counts)."""
    obj = root
    for part in parts:
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if isinstance(obj, type) and (
            part in getattr(obj, "__annotations__", {})
            or part in getattr(obj, "__slots__", ())
            or part in _assigned_to_self(obj)
        ):
            return part == parts[-1]
        return False
    return True


def _from_module_path(parts: list[str]) -> bool:
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return _walk(module, parts[cut:])
    return False


def _resolves(target: str, module: ModuleType, scopes: list[Any], imported: dict[str, str]) -> bool:
    text = re.sub(r"\s+", "", target)
    if "<" in text and text.endswith(">"):  # an explicit title: `title <target>`
        text = text[text.index("<") + 1 : -1]
    text = text.lstrip("~!").lstrip(".").removesuffix("()")
    parts = text.split(".")
    if _from_module_path(parts):
        return True
    if any(_walk(scope, parts) for scope in scopes):
        return True
    if hasattr(builtins, parts[0]):
        return _walk(builtins, parts)
    if parts[0] in imported and imported[parts[0]] != text:
        return _from_module_path([*imported[parts[0]].split("."), *parts[1:]])
    return False


def _unresolved(module: ModuleType) -> list[str]:
    assert module.__file__ is not None
    source = Path(module.__file__).read_text(encoding="utf-8")
    tree = ast.parse(source)
    imported = _imports(tree)
    classes = [value for value in vars(module).values() if isinstance(value, type)]
    own_classes = [cls for cls in classes if cls.__module__ == module.__name__]
    bad: list[str] = []

    def check(text: str, where: str, scopes: list[Any]) -> None:
        for target in _ROLE.findall(text):
            if not _resolves(target, module, scopes, imported):
                bad.append(f"{module.__name__} ({where}): {' '.join(target.split())}")

    def visit(node: ast.AST, cls: Any) -> None:
        docstring = ast.get_docstring(node, clean=False)  # type: ignore[arg-type]
        if docstring:
            scopes = [cls, module, *own_classes] if cls is not None else [module, *own_classes]
            check(docstring, getattr(node, "name", "module docstring"), scopes)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                inner = getattr(cls if cls is not None else module, child.name, None)
                visit(child, inner)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, cls)

    visit(tree, None)
    for comment in _DOC_COMMENT.finditer(source):
        check(comment.group(1), "#: comment", [module, *own_classes])
    return bad


def test_every_docstring_reference_names_something_that_exists() -> None:
    bad = [line for module in _modules() for line in _unresolved(module)]
    assert not bad, "docstrings name what does not exist:\n" + "\n".join(bad)


def test_a_reference_to_something_gone_is_caught() -> None:
    """The check itself: a reference to a name that is not there is reported, one that is
    there is not."""
    module = ModuleType("pgmemory_probe")
    module.__file__ = __file__
    imported = {"MemoryStore": "pgmemory.store.store.MemoryStore"}
    assert _resolves("pgmemory.store._ranking.search.search_memories", module, [module], imported)
    assert _resolves("~MemoryStore.search", module, [module], imported)
    assert _resolves("str.isprintable", module, [module], imported)
    assert not _resolves("pgmemory.store.partitioning", module, [module], imported)
    assert not _resolves("MemoryStore.reading", module, [module], imported)
    assert not _resolves("pgmemory.store.records.MemoryScope.stored", module, [module], imported)
