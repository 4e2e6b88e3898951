"""The admin plane's tests read the same seeded user as the audit page's (one seed, one place)."""

from tests.ui.conftest import seeded

__all__ = ["seeded"]
