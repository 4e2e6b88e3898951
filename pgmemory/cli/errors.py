"""Turn what a command raised into ONE line that says what went wrong and how to fix it.

The command line never shows a traceback for a failure it can explain: a refused connection,
a failed login, a missing database, extension or privilege, an unknown schema revision, a bad
value. Database URLs in messages have their passwords masked.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

from pgmemory.cli.common import CliError, mask, target
from pgmemory.store._engine.addresses import Where, connection_problem, where

_SETTING = "PGMEMORY_DATABASE_URL (or --url)"


@dataclass(frozen=True)
class Problem:
    """A failure explained: the line to print (without the ``pgmemory: error:`` prefix) and
    the exit status."""

    message: str
    code: int


def explain(exc: BaseException) -> Problem | None:
    """The one-line explanation of ``exc``, or None when it is not a failure pgmemory knows
    (then the caller lets it propagate: that is a bug, and its traceback is wanted).

    Args:
        exc: what a command raised.

    Returns:
        The explanation, with credentials masked.
    """
    problem = _explain(exc)
    if problem is None:
        return None
    line = " ".join(mask(problem.message).split())
    return Problem(line, problem.code)


def _explain(exc: BaseException) -> Problem | None:
    from pgmemory.errors import DatabaseUnavailableError, InvalidInputError, PgMemoryError

    if isinstance(exc, CliError):
        return Problem(str(exc), exc.code)
    advice = _command_line_advice(exc)
    if advice is not None:
        return Problem(advice, 2)
    # A failed connection is told from the driver's error, naming --url as well.
    if isinstance(exc, PgMemoryError) and not isinstance(exc, DatabaseUnavailableError):
        return Problem(str(exc), 2 if isinstance(exc, InvalidInputError) else 1)
    for cause in _chain(exc):
        found = _database_problem(cause) or _alembic_problem(cause)
        if found is not None:
            return found
    if isinstance(exc, PgMemoryError):
        return Problem(str(exc), 1)
    return None


def _command_line_advice(exc: BaseException) -> str | None:
    """What to do about a library error whose own message gives a library remedy (a keyword
    argument, a constructor argument): the same failure in the command line's words (a flag,
    a setting, a command). None for any other error."""
    from pgmemory.errors import EmbedderMismatchError, UnscopedError

    if isinstance(exc, UnscopedError):
        return (
            "no scope given, so this would reach every user's memories: pass --user (or "
            "--session, --agent, --application); the command line never covers every tenant"
        )
    if isinstance(exc, EmbedderMismatchError):
        return (
            f"collection {exc.collection!r} holds vectors of model {exc.collection_model!r}, "
            f"but PGMEMORY_EMBEDDER makes {exc.embedder_model!r}: set PGMEMORY_EMBEDDER (use, "
            "minilm or openai, with PGMEMORY_OPENAI_EMBEDDING_MODEL) to the embedder of that "
            f"model, or move the collection to this one: pgmemory db reembed {exc.collection} "
            "--embedder NAME"
        )
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the driver error it wraps (``.orig``), and their causes, each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for nxt in (getattr(current, "orig", None), current.__cause__, current.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def _where() -> Where:
    return where(target.url)


def _database_problem(exc: BaseException) -> Problem | None:
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    lowered = text.lower()
    where = _where()
    if sqlstate == "42501" and "extension" in lowered:
        return Problem(
            f"the pgvector extension is missing in database {where.database!r} and role "
            f"{where.role!r} may not create it: have a superuser run `CREATE EXTENSION vector;` "
            f"in that database (psql -d {where.database} -c 'CREATE EXTENSION vector;'), then "
            "rerun `pgmemory db upgrade`",
            1,
        )
    if sqlstate == "42501" and "schema" in lowered:
        return Problem(
            f"role {where.role!r} may not create pgmemory's tables in database "
            f"{where.database!r} ({first}): have the database owner run "
            f'`GRANT CREATE ON SCHEMA public TO "{where.role}";` (and, once, a superuser '
            "`CREATE EXTENSION vector;` there), or run `pgmemory db upgrade` as a superuser",
            1,
        )
    if sqlstate == "42501":
        return Problem(
            f"role {where.role!r} lacks a privilege in database {where.database!r}: {first}; "
            "grant it, or connect as a role that has it",
            1,
        )
    if "extension" in lowered and ("not available" in lowered or "control file" in lowered):
        return Problem(
            f"PostgreSQL at {where.address} has no pgvector to install: install pgvector on "
            "the server (e.g. the postgresql-<version>-pgvector package), then have a superuser "
            f"run `CREATE EXTENSION vector;` in database {where.database!r} (or rerun "
            "`pgmemory db upgrade` as a superuser)",
            1,
        )
    if sqlstate is None and isinstance(exc, psycopg.OperationalError):
        return _connection_problem(text, where)
    if sqlstate in ("28P01", "28000", "3D000"):
        return _connection_problem(text, where)
    return Problem(f"the database refused the command: {first}", 1)


def _connection_problem(text: str, at: Where) -> Problem:
    return Problem(connection_problem(text, at, setting=_SETTING), 1)


def _alembic_problem(exc: BaseException) -> Problem | None:
    alembic_exc = sys.modules.get("alembic.util.exc")
    if alembic_exc is None or not isinstance(exc, alembic_exc.CommandError):
        return None
    text = str(exc).strip()
    if text.startswith("Can't locate revision"):
        from pgmemory.cli.db import revisions_hint

        return Problem(
            f"the database's schema revision is unknown to this version of pgmemory ({text}); "
            f"it ships {revisions_hint()}: use the pgmemory version that migrated the database",
            1,
        )
    return Problem(f"migration failed: {text.splitlines()[0] if text else 'alembic error'}", 1)


def report(exc: Exception) -> int:
    """The exit status of a command that failed with ``exc``, its one line printed; an error
    pgmemory cannot explain is raised again (a traceback is then the honest answer)."""
    problem = explain(exc)
    if problem is None:
        raise exc
    print(f"pgmemory: error: {problem.message}", file=sys.stderr)
    return problem.code
