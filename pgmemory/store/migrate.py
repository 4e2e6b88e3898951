"""Run pgmemory's alembic migrations programmatically (the CLI and ``MemoryStore.migrate`` use this).

The scripts ship inside the package as ``pgmemory.migrations``, so this works from an installed
wheel as well as from a checkout. pgmemory keeps its own version table, so its migrations can
share a database with the host application's. Alembic is imported when a function here runs,
not when the store is imported.

Migrations of one database run one at a time: whoever migrates (``upgrade``, ``downgrade``,
the ``alembic`` command on this package's scripts) first takes the session-level advisory lock
:data:`MIGRATION_LOCK_KEY` on the connection that runs them, and holds it until they are done.
Processes that open stores with ``migrate=True`` at the same time therefore wait for each other;
the later ones find the schema at head and have nothing to do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.connector import VERSION_TABLE, normalise_url
from pgmemory.store.queries import MIGRATION_XACT_LOCK

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection


#: Every table pgmemory creates starts with this prefix; host applications must not use it.
TABLE_PREFIX = "pgmemory_"

#: The advisory lock key serialising pgmemory's migrations of a database: the ASCII bytes of
#: ``pgmemory`` read as one big-endian 64-bit integer. Host applications must not use it.
MIGRATION_LOCK_KEY = int.from_bytes(b"pgmemory", "big")  # = 8099562737244271225


@contextlib.contextmanager
def migration_lock(connection: Connection) -> Iterator[None]:
    """Hold the migration lock on ``connection`` for the block (waits while another holds it).

    On a connection outside a transaction (pgmemory's own), the lock belongs to the session:
    it outlives the commits of the migrations run in the block, is released when the block
    ends, and goes with the session if the process dies. On a connection already in a
    transaction (a host application's, which the migrations then join), the lock belongs to
    that transaction and goes when the host commits or rolls it back.

    Args:
        connection: The connection the migrations run on.

    Yields:
        Nothing; the migrations run in the block.
    """
    key = {"key": MIGRATION_LOCK_KEY}
    if connection.in_transaction():
        connection.execute(clause(MIGRATION_XACT_LOCK), key)
        yield
        return
    connection.execute(clause("SELECT pg_advisory_lock(:key)"), key)
    connection.commit()
    try:
        yield
    finally:
        if connection.in_transaction():
            connection.rollback()
        if not connection.closed and not connection.invalidated:
            # A lost connection took the lock with it.
            connection.execute(clause("SELECT pg_advisory_unlock(:key)"), key)
            connection.commit()


def is_pgmemory_table(name: str | None) -> bool:
    """Whether a table name belongs to pgmemory (its data tables and its alembic version table)."""
    return name is not None and name.startswith(TABLE_PREFIX)


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Alembic filter: only pgmemory's tables, so a shared database's other tables are left alone."""
    if type_ == "table":
        return is_pgmemory_table(name) and name != VERSION_TABLE
    return True


def _scripts() -> str:
    """Where the alembic scripts are: the package ``pgmemory.migrations`` (a wheel, an
    editable install); or, when ``pgmemory`` was imported from a source checkout's own folder
    without that mapping (``uvicorn examples.fastapi_app:app`` run in the checkout, beside an
    installed wheel), the checkout's ``migrations/`` beside it."""
    try:
        return str(resources.files("pgmemory.migrations"))
    except ModuleNotFoundError:
        checkout = Path(__file__).resolve().parents[2] / "migrations"
        if (checkout / "env.py").is_file() and (checkout / "versions").is_dir():
            return str(checkout)
        raise


def alembic_config(url: str | None = None) -> Config:
    """An alembic Config pointing at the packaged scripts (and at ``url`` if given)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", _scripts())
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

    engine = create_engine(normalise_url(url), hide_parameters=True)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    finally:
        engine.dispose()
