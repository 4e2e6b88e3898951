"""The admin plane: what operators, the CLI and the audit page do.

:class:`~pgmemory.admin.admin.Admin` is the front (``Admin(store)``); each concern has its own
module: ``users`` (the user directory, scopes, sessions), ``memories`` (a user's memories and
their write/delete audit), ``recalls`` (the recall audit), ``facts``, ``history`` (chat
sessions), ``retention`` (audit pruning), ``integrity`` (audit verify), ``roles`` (the
least-privilege application role), ``partitioning``; ``pages`` holds the page and cursor types
every list uses, and ``statements`` every SQL statement of this plane.

Arrows point one way: this package imports :mod:`pgmemory.store` (its database verbs, records
and data statements), and the store never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgmemory._exports import lazy_exports

if TYPE_CHECKING:
    from pgmemory.admin.admin import (
        Admin as Admin,
    )

# Lazy, so the command line's parser (which reads constants of admin modules) loads no driver.
__all__, __getattr__, __dir__ = lazy_exports(__name__)
