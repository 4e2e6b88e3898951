"""Lazy public names (PEP 562), written once per package.

A package lists its public names as the imports of its ``if TYPE_CHECKING:`` block, which is
what type checkers and IDEs read; :func:`lazy_exports` reads the same lines from the package's
source and returns its ``__all__``, ``__getattr__`` and ``__dir__``, so that each name's
module is imported on first use and ``import pgmemory`` stays cheap. The imports are the one
table: ``__all__`` and the lazy imports come from it.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


def export_table(source: str) -> dict[str, str]:
    """Public name -> module, from the ``from X import Y`` lines under ``if TYPE_CHECKING:``.

    Args:
        source: A package's ``__init__`` source.

    Returns:
        Each imported name (its ``as`` name if any) with the module it comes from, in order.
    """
    table: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    for alias in statement.names:
                        table[alias.asname or alias.name] = statement.module
    return table


def lazy_exports(
    package: str, *, computed: Mapping[str, Callable[[], Any]] | None = None
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package`` (call it from the
    package's ``__init__`` with ``__name__``).

    Args:
        package: The package's name; its module must be in ``sys.modules`` (it is, while its
            ``__init__`` runs).
        computed: Extra attributes made on first use by calling a function (``__version__``),
            not part of ``__all__``.

    Returns:
        The sorted public names, and the two module functions.
    """
    module = sys.modules[package]
    assert module.__file__ is not None
    table = export_table(Path(module.__file__).read_text(encoding="utf-8"))
    extra = dict(computed or {})

    def __getattr__(name: str) -> Any:
        if name in extra:
            value = extra[name]()
        elif name in table:
            value = getattr(importlib.import_module(table[name]), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(module, name, value)  # later lookups are plain attribute reads
        return value

    names = sorted(table)

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(names))

    return names, __getattr__, __dir__
