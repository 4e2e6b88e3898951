"""Shared fixtures of the reliability tests: the audit page's seeded user and its token (one
seed, one place), and an engine as the owner or as the least-privilege role."""

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.ui.conftest import seeded, token

__all__ = ["role_engine", "seeded", "token"]


@pytest.fixture(params=["owner", "app role"])
def role_engine(request: pytest.FixtureRequest, database_url: str) -> Iterator[sa.Engine]:
    """A synchronous engine on the session database: as its owner, then as the application
    role (each test runs once as each)."""
    url = database_url if request.param == "owner" else request.getfixturevalue("app_role_url")
    engine = sa.create_engine(url)
    yield engine
    engine.dispose()
