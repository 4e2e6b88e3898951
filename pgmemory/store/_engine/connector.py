"""The thin connector layer: URL handling, the async engine and pool, and start-up checks."""

from __future__ import annotations

import logging
import re
import select
from contextlib import suppress
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from pgmemory.errors import DatabaseNotReadyError, InvalidInputError
from pgmemory.settings import Settings
from pgmemory.store import queries as q
from pgmemory.store._engine import binary
from pgmemory.store._engine.clauses import clause
from pgmemory.store._ranking.candidates import FirstPass
from pgmemory.store.jsonb import JsonbLoader

logger = logging.getLogger(__name__)

#: Alembic's version table for pgmemory's own migrations (the host app keeps its own).
VERSION_TABLE = "pgmemory_alembic_version"


def normalise_url(url: str) -> str:
    """Accept libpq-style or SQLAlchemy URLs; always use the psycopg 3 driver."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with the URL in it
        raise InvalidInputError(
            "database URL could not be parsed; expected postgresql://user:password@host:port/db"
        ) from exc
    if parsed.get_backend_name() not in {"postgresql", "postgres"}:
        raise InvalidInputError(
            f"database URL uses backend {parsed.get_backend_name()!r}; pgmemory needs PostgreSQL "
            "(postgresql://...)"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


#: The connection option that has a prepared statement run its generic plan from the first
#: run: left to itself PostgreSQL compares the generic plan's estimated cost with the custom
#: plans' and, wherever a user's row count differs from the table's average, replans the
#: statement on every run (measured: the vector search 0.89 -> 0.59 ms p50 at 100 rows, the
#: hybrid one 3.31 -> 2.07 ms). The statements are written to be right under generic plans
#: (no time bound to misprice, candidates that no plan can turn into an approximate scan; see
#: pgmemory.store.queries), and tests/store/test_plans.py runs them so. Not on a distributed
#: (Citus) database: Citus cannot make a distributed plan of a generic plan's parameters
#: ("could not create distributed plan"), so there the choice stays PostgreSQL's.
GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"


def make_engine(url: str, settings: Settings, *, generic_plans: bool = True) -> AsyncEngine:
    """Create the pooled async engine; every connection knows pgvector's types and, where
    statements are prepared, runs them on their generic plans (:data:`GENERIC_PLANS`).

    Errors never carry a statement's parameters (they may hold user text): SQLAlchemy's
    ``[parameters: ...]`` part is hidden.

    Args:
        url: A libpq or SQLAlchemy URL.
        settings: Pool sizes and timeouts.
        generic_plans: Run prepared statements on their generic plans (off for a
            distributed database).

    Returns:
        The engine.
    """
    options = f"-c statement_timeout={settings.statement_timeout_ms}"
    if settings.prepared_statements and generic_plans:
        options += f" {GENERIC_PLANS}"
    engine = create_async_engine(
        normalise_url(url),
        pool_size=settings.pool_size,
        max_overflow=settings.max_overflow,
        pool_timeout=settings.pool_timeout_s,
        # No pre-ping: its probe leaves a transaction that the pool rolls back, and psycopg
        # drops its prepared statements after every ROLLBACK, so each checkout would re-parse
        # every statement. A checkout looks at the socket instead (_replace_if_gone), at no
        # round trip; for the same reason the store runs plain reads in autocommit (no
        # transaction, so nothing to roll back) and everything else in transactions that
        # COMMIT.
        pool_pre_ping=False,
        pool_recycle=1800,
        hide_parameters=True,
        connect_args={
            "connect_timeout": settings.connect_timeout_s,
            "options": options,
            "application_name": "pgmemory",
        },
    )
    event.listen(engine.sync_engine, "connect", _register_types)
    event.listen(engine.sync_engine, "checkout", _replace_if_gone)
    _prepare_as_configured(engine, settings)
    return engine


def adopt_engine(engine: AsyncEngine, settings: Settings) -> AsyncEngine:
    """Prepare an application's own engine for pgmemory, as :func:`make_engine` prepares its own.

    Every new connection learns pgvector's types, checkouts replace connections whose server
    went away, and errors stop carrying statement parameters. The pool, timeouts and
    connection options stay the application's.

    Args:
        engine: an async engine on the ``postgresql+psycopg`` dialect, not connected yet.
        settings: whether statements are prepared (``prepared_statements``).

    Returns:
        The same engine.

    Raises:
        InvalidInputError: the engine uses another driver than psycopg 3.
    """
    if engine.dialect.driver != "psycopg":
        raise InvalidInputError(
            f"the engine uses the {engine.dialect.name}+{engine.dialect.driver} driver; pgmemory "
            "needs psycopg 3: create it with a 'postgresql+psycopg://' URL"
        )
    engine.sync_engine.hide_parameters = True
    for name, hook in (("connect", _register_types), ("checkout", _replace_if_gone)):
        if not event.contains(engine.sync_engine, name, hook):
            event.listen(engine.sync_engine, name, hook)
    _prepare_as_configured(engine, settings)
    return engine


#: What a lost prepared statement means, and the fix.
POOLER_HINT = (
    "a prepared statement was missing on the server connection (or there twice): a pooler in "
    "transaction mode (e.g. PgBouncer) sits between pgmemory and PostgreSQL and moves "
    "statements between server connections. Set PGMEMORY_PREPARED_STATEMENTS=false "
    "(Settings(prepared_statements=False)), or let the pooler keep prepared statements "
    "(PgBouncer >= 1.21: max_prepared_statements)"
)


#: What a pooler refusing the statement timeout's startup option means, and the fix.
POOLER_OPTIONS_HINT = (
    "the server refused the startup parameter 'options', which carries pgmemory's statement "
    "timeout: a pooler (e.g. PgBouncer) sits between pgmemory and PostgreSQL. Let it pass "
    "(PgBouncer: ignore_startup_parameters = options) and set the timeout on the server "
    "(ALTER ROLE ... SET statement_timeout) or in the pooler (query_timeout)"
)


#: The tables an application role reads and writes in full (``pgmemory db roles`` grants
#: them; the audits and the secrets it may touch less, by design).
APP_DATA_TABLES = (
    "pgmemory_collections",
    "pgmemory_memories",
    "pgmemory_chat_messages",
    "pgmemory_facts",
    "pgmemory_jobs",
)

#: A role refused one of those tables (or, on Citus, one of its shards): a table a migration
#: added after the role was set up.
_DATA_TABLE_REFUSED = re.compile(
    r"permission denied for table (" + "|".join(APP_DATA_TABLES) + r")(?:_\d+)?\b"
)

#: What that means, and the fix.
ROLE_GRANT_HINT = (
    "role {role} has no privilege on {table}, a table added by a pgmemory migration after "
    "the role was set up: as the schema's owner, run `pgmemory db roles {role}` again (it "
    "grants every table the role needs, and sets its password again)"
)


def setup_error(exc: BaseException, *, connection: Any = None) -> DatabaseNotReadyError | None:
    """The error to raise instead of ``exc`` when the deployment causes it, naming the fix;
    else None: what only a pooler between pgmemory and PostgreSQL causes (a prepared statement
    missing, or there twice, in transaction mode; the statement timeout's startup option
    refused), or an application role (``connection``'s, the psycopg connection it failed on)
    without a privilege on one of pgmemory's data tables."""
    refused = (
        _DATA_TABLE_REFUSED.search(str(exc))
        if isinstance(exc, psycopg.errors.InsufficientPrivilege)
        else None
    )
    if refused is not None:
        try:
            role = str(connection.info.user)
        except (AttributeError, psycopg.Error):
            role = "ROLE"
        return DatabaseNotReadyError(ROLE_GRANT_HINT.format(role=role, table=refused.group(1)))
    if isinstance(exc, psycopg.OperationalError) and "unsupported startup parameter: options" in (
        str(exc)
    ):
        return DatabaseNotReadyError(POOLER_OPTIONS_HINT)
    if isinstance(
        exc, (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)
    ) or (  # another client's statement of the same name, bound with this one's parameters
        isinstance(exc, psycopg.errors.ProtocolViolation) and "prepared statement" in str(exc)
    ):
        return DatabaseNotReadyError(POOLER_HINT)
    return None


def driver_error(exc: psycopg.Error, connection: psycopg.AsyncConnection[Any]) -> Exception:
    """What a psycopg error raised on ``connection`` (used without SQLAlchemy) comes out as:
    :func:`setup_error`'s error when the deployment explains it, else SQLAlchemy's
    ``DBAPIError`` as from any other statement (parameters hidden; ``connection_invalidated``
    when the connection was lost)."""
    return setup_error(exc, connection=connection) or DBAPIError.instance(
        None,
        None,
        exc,
        psycopg.Error,
        hide_parameters=True,
        connection_invalidated=connection.broken or connection.closed,
    )


def _prepare_as_configured(engine: AsyncEngine, settings: Settings) -> None:
    """Without ``prepared_statements``, no connection ever prepares (psycopg would after five
    runs of a statement); with or without, what a pooler (or a role's missing grant) causes is
    explained (:func:`setup_error`)."""
    hooks: list[tuple[str, Any]] = [("handle_error", _explain_setup_error)]
    if not settings.prepared_statements:
        hooks.append(("connect", _never_prepare))
    for name, hook in hooks:
        if not event.contains(engine.sync_engine, name, hook):
            event.listen(engine.sync_engine, name, hook)


def _never_prepare(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.driver_connection.prepare_threshold = None


def _explain_setup_error(context: Any) -> None:
    """``handle_error`` hook: what the deployment causes raises :func:`setup_error`'s error."""
    explained = setup_error(context.original_exception, connection=_driver(context))
    if explained is not None:
        raise explained from context.sqlalchemy_exception


def _driver(context: Any) -> Any:
    """The psycopg connection a ``handle_error`` context failed on, if there was one."""
    return getattr(getattr(context.connection, "connection", None), "driver_connection", None)


def _replace_if_gone(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """Pool checkout hook: have the pool replace a connection whose server went away.

    A server that restarts, crashes or ends a session closes the connection, and the socket
    turns readable (end of file, or the server's last message). An idle pooled connection has
    nothing to read otherwise, so a socket with nothing to read passes at the cost of one
    system call; a readable one gets a real ping, in autocommit (no BEGIN, so no ROLLBACK that
    would drop the prepared statements). Raising ``DisconnectionError`` makes the pool
    discard the connection and hand out a new one.
    """
    driver = dbapi_connection.driver_connection
    if driver.closed or driver.broken:
        raise DisconnectionError("the pooled connection was closed")
    try:
        socket = driver.pgconn.socket
    except psycopg.OperationalError as exc:
        raise DisconnectionError("the pooled connection has no socket") from exc
    if not socket_readable(socket):
        return
    try:
        dbapi_connection.run_async(_ping)
    except psycopg.Error as exc:
        raise DisconnectionError("the server closed the pooled connection") from exc


def socket_readable(socket: int) -> bool:
    """Whether the socket has something to read (or was closed), without waiting."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(socket, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([socket], [], [], 0)[0])


async def _ping(connection: psycopg.AsyncConnection[Any]) -> None:
    """One round trip outside any transaction; raises when the connection is gone."""
    autocommit = connection.autocommit
    await connection.set_autocommit(True)
    try:
        await connection.execute("SELECT 1", prepare=False)
    finally:
        await connection.set_autocommit(autocommit)


def _register_types(dbapi_connection: Any, _record: Any) -> None:
    """A new connection's adapters: pgvector's, then pgmemory's (:func:`register_adapters`)."""
    connection = dbapi_connection.driver_connection
    # Without the extension check_database() fails with instructions.
    with suppress(psycopg.ProgrammingError):
        dbapi_connection.run_async(register_vector_async)
    register_adapters(connection)


def register_adapters(connection: psycopg.AsyncConnection[Any]) -> None:
    """What pgmemory's statements send and read, on ``connection`` (after pgvector's types):
    array parameters in binary (:mod:`pgmemory.store._engine.binary`), jsonb results
    (:class:`~pgmemory.store.jsonb.JsonbLoader`)."""
    binary.register(connection)
    connection.adapters.register_loader("jsonb", JsonbLoader)


async def check_database(engine: AsyncEngine, *, expected_revision: str | None) -> None:
    """Fail with instructions when pgvector or pgmemory's schema is missing or out of date."""
    async with engine.connect() as conn:
        has_vector = (
            await conn.execute(clause("SELECT 1 FROM pg_extension WHERE extname = 'vector'"))
        ).scalar()
        database = (await conn.execute(clause("SELECT current_database()"))).scalar()
        if not has_vector:
            raise DatabaseNotReadyError(
                f"the pgvector extension is not installed in database {database!r}. "
                f"Run `pgmemory db upgrade` as a superuser (its first migration runs "
                f"CREATE EXTENSION vector), or have a superuser run: "
                f'psql -d {database} -c "CREATE EXTENSION IF NOT EXISTS vector;"'
            )
        if expected_revision is None:
            return
        version_table = (
            await conn.execute(clause("SELECT to_regclass(:name)"), {"name": VERSION_TABLE})
        ).scalar()
        current = None
        if version_table is not None:
            current = (
                await conn.execute(clause(f"SELECT version_num FROM {VERSION_TABLE}"))
            ).scalar()
        if current != expected_revision:
            raise DatabaseNotReadyError(
                f"pgmemory's schema in database {database!r} is at revision {current!r}, this "
                f"version of pgmemory needs {expected_revision!r}. Run `pgmemory db upgrade` "
                f"(or `await store.migrate()`, or open the store with migrate=True)."
            )


async def first_passes(engine: AsyncEngine) -> tuple[FirstPass, ...]:
    """The two-phase path's first passes the memories keep: binary codes (migration 0013) and,
    where an operator added them, half vectors (:mod:`pgmemory.admin.half_vectors`); says
    once, at WARNING, when there are no codes (pgvector before 0.7 when 0013 ran)."""
    async with engine.connect() as conn:
        row = (await conn.execute(clause(q.FIRST_PASSES))).one()
    if not row.codes:
        logger.warning(
            "pgvector %s keeps no binary codes of the memories (binary_quantize needs pgvector "
            ">= 0.7, or they were not added after an upgrade: docs/scaling.md): %s",
            row.pgvector,
            "large scopes take the half vectors' first pass where its probe holds"
            if row.halves
            else "every search of a large scope is exact, none takes the two-phase path",
        )
    present: dict[FirstPass, bool] = {"codes": row.codes, "halves": row.halves}
    return tuple(name for name, there in present.items() if there)


async def is_distributed(engine: AsyncEngine) -> bool:
    """Whether pgmemory's memories table is distributed by Citus in this database."""
    async with engine.connect() as conn:
        if not (await conn.execute(clause(q.CITUS_INSTALLED))).scalar():
            return False
        return bool((await conn.execute(clause(q.MEMORIES_DISTRIBUTED))).scalar())
