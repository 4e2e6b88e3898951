"""The reliability tests of the audit page read the page's seeded user (one seed, one place)."""

from tests.ui.conftest import seeded

__all__ = ["seeded"]
