"""A host application with its own models and alembic environment, in pgmemory's database.

The host runs the real ``alembic revision --autogenerate`` (through alembic's command API) in a
database where pgmemory's schema is installed. With pgmemory's ``include_object`` in its
``env.py`` it proposes its own table and nothing about pgmemory; without it (the control) alembic
proposes to drop pgmemory's tables, which is what the hook exists to prevent.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from pgmemory.store import migrate

HOST_MODELS = """
import sqlalchemy as sa

metadata = sa.MetaData()
orders = sa.Table(
    "host_orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("dish", sa.Text, nullable=False),
    sa.Index("ix_host_orders_dish", "dish"),
)
"""

HOST_ENV = """
from alembic import context
from sqlalchemy import create_engine, pool

from host_models import metadata
{import_hook}

engine = create_engine(context.config.get_main_option("sqlalchemy.url"), poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata{hook_arg})
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

SCRIPT_MAKO = '''"""${message}"""
from alembic import op
import sqlalchemy as sa
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade():
    ${upgrades if upgrades else "pass"}


def downgrade():
    ${downgrades if downgrades else "pass"}
'''


def _host_project(root: Path, url: str, *, with_hook: bool) -> Config:
    (root / "versions").mkdir(parents=True)
    (root / "host_models.py").write_text(textwrap.dedent(HOST_MODELS))
    (root / "script.py.mako").write_text(SCRIPT_MAKO)
    (root / "env.py").write_text(
        HOST_ENV.format(
            import_hook="from pgmemory.integrations.alembic import include_object"
            if with_hook
            else "",
            hook_arg=", include_object=include_object" if with_hook else "",
        )
    )
    config = Config()
    config.set_main_option("script_location", str(root))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _autogenerate(config: Config, message: str) -> str:
    script = command.revision(config, message=message, autogenerate=True)
    assert script is not None and not isinstance(script, list)
    return Path(script.path).read_text()


@pytest.fixture
def shared_database(fresh_database: str) -> str:
    """A database holding pgmemory's schema, as a host application would share it."""
    migrate.upgrade(fresh_database)
    return fresh_database


def test_autogenerate_proposes_nothing_about_pgmemory(
    shared_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "host"))
    monkeypatch.delitem(sys.modules, "host_models", raising=False)
    config = _host_project(tmp_path / "host", shared_database, with_hook=True)

    first = _autogenerate(config, "host orders")
    print(first)
    assert "op.create_table('host_orders'" in first
    assert "ix_host_orders_dish" in first
    assert "pgmemory" not in first

    # Applied, the host's schema and pgmemory's live side by side, and a second autogenerate
    # finds nothing to do on either side.
    command.upgrade(config, "head")
    engine = sa.create_engine(shared_database)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    engine.dispose()
    assert {
        "host_orders",
        "alembic_version",
        "pgmemory_memories",
        "pgmemory_alembic_version",
    } <= tables
    second = _autogenerate(config, "nothing")
    assert "op." not in second.split("def upgrade")[1].split("def downgrade")[0]
    assert migrate.current(shared_database) == migrate.head_revision()


def test_control_without_the_hook_would_drop_pgmemory(
    shared_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "host"))
    monkeypatch.delitem(sys.modules, "host_models", raising=False)
    config = _host_project(tmp_path / "host", shared_database, with_hook=False)
    proposed = _autogenerate(config, "unfiltered")
    assert "op.drop_table('pgmemory_memories')" in proposed
    assert "op.drop_table('pgmemory_alembic_version')" in proposed
