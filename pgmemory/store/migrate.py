"""Run pgmemory's alembic migrations programmatically (the CLI and ``MemoryStore.migrate`` use this).

The scripts ship inside the package as ``pgmemory.migrations``, so this works from an installed
wheel as well as from a checkout. pgmemory keeps its own version table, so its migrations can
share a database with the host application's. Alembic is imported when a function here runs,
not when the store is imported.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from pgmemory.store.connector import VERSION_TABLE, normalise_url

if TYPE_CHECKING:
    from alembic.config import Config


#: Every table pgmemory creates starts with this prefix; host applications must not use it.
TABLE_PREFIX = "pgmemory_"


def is_pgmemory_table(name: str | None) -> bool:
    """Whether a table name belongs to pgmemory (its data tables and its alembic version table)."""
    return name is not None and name.startswith(TABLE_PREFIX)


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Alembic filter: only pgmemory's tables, so a shared database's other tables are left alone."""
    if type_ == "table":
        return is_pgmemory_table(name) and name != VERSION_TABLE
    return True


def alembic_config(url: str | None = None) -> Config:
    """An alembic Config pointing at the packaged scripts (and at ``url`` if given)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("pgmemory.migrations")))
    if url is not None:
        # ConfigParser treats % as interpolation; escape it (passwords may contain it).
        config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return config


def head_revision() -> str:
    """The newest revision this version of pgmemory ships."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "pgmemory ships at least one migration"
    return head


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the schema at ``url`` to ``revision`` (blocking)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Downgrade the schema at ``url`` to ``revision`` (``base`` removes every table)."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The revision the database at ``url`` is at (None when pgmemory was never installed)."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    finally:
        engine.dispose()
