"""Alembic environment for pgmemory's own tables (version table ``pgmemory_alembic_version``)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from pgmemory.store._engine.connector import VERSION_TABLE, normalise_url
from pgmemory.store.migrate import include_object, migration_lock
from pgmemory.store.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        from pgmemory.settings import Settings

        settings = Settings()
        if settings.database_url is None:
            raise RuntimeError(
                "no database URL: set PGMEMORY_DATABASE_URL, or use `pgmemory db upgrade`, "
                "which starts the embedded server when no URL is set"
            )
        url = settings.database_url.get_secret_value()
    return normalise_url(url)


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        include_object=include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # Whoever migrates holds the migration lock on its connection: concurrent migrations of
    # one database wait for each other instead of racing to create the same objects.
    connection = config.attributes.get("connection")
    if connection is not None:
        with migration_lock(connection):
            _run(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool, hide_parameters=True)
    try:
        with engine.connect() as conn, migration_lock(conn):
            _run(conn)
    finally:
        engine.dispose()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
