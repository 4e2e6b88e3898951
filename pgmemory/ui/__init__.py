"""The operators' audit web page: what pgmemory remembers about a user, and which memories
went into an answer. Needs the ``ui`` extra (``pip install 'pgmemory-agents[ui]'``).

* :func:`create_app` builds the ASGI app on an open store (mount it in a host app);
* :func:`serve` / :func:`serve_store` run it with uvicorn;
* :mod:`pgmemory.ui.cli` holds the ``pgmemory ui`` command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgmemory._exports import lazy_exports

if TYPE_CHECKING:
    from pgmemory.ui.app import (
        create_app as create_app,
    )
    from pgmemory.ui.server import (
        serve as serve,
        serve_store as serve_store,
    )

# Lazy, so `pgmemory.ui.cli` (argparse only) imports without the ui extra installed.
__all__, __getattr__, __dir__ = lazy_exports(__name__)
