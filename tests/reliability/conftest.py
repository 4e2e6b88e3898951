"""The reliability tests of the audit page read the page's seeded user and sign in with a
token issued for the page (one seed, one place)."""

from tests.ui.conftest import seeded, token

__all__ = ["seeded", "token"]
