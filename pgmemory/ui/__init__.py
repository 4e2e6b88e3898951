"""The operators' audit web page: what pgmemory remembers about a user, and which memories
went into an answer. Needs the ``ui`` extra (``pip install 'pgmemory[ui]'``).

* :func:`create_app` builds the ASGI app on an open store (mount it in a host app);
* :func:`serve` / :func:`serve_store` run it with uvicorn;
* :mod:`pgmemory.ui.cli` holds the ``pgmemory ui`` command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgmemory.ui.app import create_app
    from pgmemory.ui.server import serve, serve_store

__all__ = ["create_app", "serve", "serve_store"]


def __getattr__(name: str) -> Any:
    # Lazy, so `pgmemory.ui.cli` (argparse only) imports without the ui extra installed.
    if name == "create_app":
        from pgmemory.ui.app import create_app

        return create_app
    if name in ("serve", "serve_store"):
        from pgmemory.ui import server

        return getattr(server, name)
    raise AttributeError(f"module 'pgmemory.ui' has no attribute {name!r}")
