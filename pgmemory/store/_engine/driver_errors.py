"""What a driver error comes out of the store as: a pgmemory error that names the step, the
setting at fault and, for a write, what became of it (:func:`translated`).

The execution layer passes everything SQLAlchemy, psycopg or the pool raise through here, once,
where it hands a result back: a connection that cannot be made (``Connections._checkout``, and
opening), and the end of each verb (``read``, ``write``, ``ddl``, ``fetch``, a unit of work's
statements and its commit), each saying which step failed and, for a write, whether its commit
was sent. Nothing here runs unless something failed.

What a write's outcome is, from the client's side:

* ``connect``: nothing was sent: not stored;
* a server's error reply (a refused statement, a statement timeout, a failed COMMIT): the
  transaction rolled back: not stored;
* the connection lost before the commit was sent (a statement of a transaction that commits
  later): not stored;
* the connection lost once the commit was sent (a COMMIT, a unit of work's queued writes with
  their commit, a statement that is its own commit) and before its reply: unknown.

Either way a retry with the same message ids is safe: chat history and memories skip a message
id the session or scope already holds (``ON CONFLICT ... DO NOTHING``, :mod:`pgmemory.store.
queries`), so a write that did commit is not stored twice.
"""

from __future__ import annotations

from typing import Literal, NoReturn

import psycopg
from sqlalchemy import exc as sa_exc

from pgmemory.errors import (
    ConnectionLostError,
    DatabaseError,
    DatabaseUnavailableError,
    PgMemoryError,
    StatementTimeoutError,
    with_driver_class,
)
from pgmemory.store._engine.addresses import URL_SETTING, connection_problem, mask, where
from pgmemory.store._engine.connector import setup_error

Step = Literal["connect", "statement", "commit"]
Outcome = Literal["stored", "not stored", "unknown"]

#: What the verbs hand to :func:`translated`: SQLAlchemy's wrapped driver errors, psycopg's
#: own (the fast path, raw connections in a block), and the pool's wait running out.
DRIVER_ERRORS = (sa_exc.DBAPIError, psycopg.Error, sa_exc.TimeoutError)

#: Why retrying a write is safe, whatever became of it.
RETRY_IS_SAFE = (
    "retrying it with the same message ids is safe (a message id already stored is skipped)"
)

#: The pool had no free connection in time.
POOL_EXHAUSTED = (
    "no pooled connection was free within PGMEMORY_POOL_TIMEOUT_S: all PGMEMORY_POOL_SIZE + "
    "PGMEMORY_MAX_OVERFLOW connections were in use; allow more (within the server's "
    "max_connections) or make fewer calls at once"
)

#: SQLSTATEs of a session the server ended (administrator, crash, shutdown).
_ENDED = {"57P01", "57P02", "57P03"}


def translated(
    exc: BaseException,
    *,
    step: Step,
    outcome: Outcome | None,
    url: str | None = None,
    setting: str = URL_SETTING,
) -> BaseException:
    """The error to raise (``from exc``) instead of the driver's ``exc``: ``exc`` itself when
    it is pgmemory's already or no driver error; :func:`~pgmemory.store._engine.connector.setup_error`'s
    when the deployment explains it; else a :class:`~pgmemory.errors.DatabaseError` that is
    also of ``exc``'s SQLAlchemy class.

    Args:
        exc: What the driver, SQLAlchemy or the pool raised.
        step: Where: ``connect`` (no statement sent yet), ``statement`` or ``commit``.
        outcome: For a write, what a lost connection leaves of it (``not stored`` before the
            commit was sent, ``unknown`` once it was); None for a read.
        url: The database's URL (named, password masked, when connecting failed).
        setting: What names that URL, for the fix.
    """
    if isinstance(exc, PgMemoryError) or not isinstance(exc, DRIVER_ERRORS):
        return exc
    wrapped: BaseException = exc
    if isinstance(exc, psycopg.Error):  # as SQLAlchemy would have raised it
        wrapped = sa_exc.DBAPIError.instance(
            None, None, exc, psycopg.Error, hide_parameters=True, connection_invalidated=_lost(exc)
        )
    orig = getattr(wrapped, "orig", None)
    explained = setup_error(orig) if orig is not None else None
    if explained is not None:
        return explained
    error: DatabaseError
    written = "" if outcome is None else "; the write was not stored"
    if isinstance(exc, sa_exc.TimeoutError):
        error = DatabaseUnavailableError(POOL_EXHAUSTED, step="connect", outcome="not stored")
    elif step == "connect":
        problem = connection_problem(str(orig or exc), where(url), setting=setting)
        error = DatabaseUnavailableError(mask(problem), step="connect", outcome="not stored")
    elif _lost(wrapped):
        error = ConnectionLostError(
            _lost_message(step, outcome, _why(orig)), step=step, outcome=outcome
        )
    elif getattr(orig, "sqlstate", None) == "57014" and "statement timeout" in _why(orig):
        error = StatementTimeoutError(
            "the server cancelled a statement at its statement timeout (pgmemory sets it from "
            f"PGMEMORY_STATEMENT_TIMEOUT_MS){written}",
            step=step,
            outcome=None if outcome is None else "not stored",
        )
    else:
        error = DatabaseError(
            f"the database refused a {step} of pgmemory ({type(orig).__name__}, SQLSTATE "
            f"{getattr(orig, 'sqlstate', None) or '?'}): {_why(orig)}{written}",
            step=step,
            outcome=None if outcome is None else "not stored",
        )
    if isinstance(wrapped, sa_exc.DBAPIError):
        wrapped.params = None  # statement parameters (user data) stay out of the error
    return with_driver_class(error, wrapped)


def reraise(
    exc: BaseException,
    *,
    step: Step,
    outcome: Outcome | None,
    url: str | None = None,
    setting: str = URL_SETTING,
) -> NoReturn:
    """Raise :func:`translated`'s error ``from exc``, or ``exc`` itself when it is already
    pgmemory's (translated by a verb inside this one: its cause stays the driver's)."""
    error = translated(exc, step=step, outcome=outcome, url=url, setting=setting)
    if error is exc:
        raise exc
    raise error from exc


def reraise_opening(exc: BaseException, *, url: str | None, setting: str) -> NoReturn:
    """:func:`reraise` for what opening a store raised (connecting, migrating, the checks): a
    connection that could not be made is step ``connect``, anything else ``statement``."""
    orig = getattr(exc, "orig", exc)
    never = isinstance(orig, psycopg.OperationalError) and (
        orig.sqlstate is None or orig.sqlstate[:2] in {"08", "28", "3D", "53"}
    )
    step: Step = "connect" if never else "statement"
    reraise(exc, step=step, outcome=None, url=url, setting=setting)


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone: SQLAlchemy invalidated it, or the
    driver's error is a connection's (no SQLSTATE, class 08) or a session the server ended."""
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig  # type: ignore[assignment]
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _ENDED


def _why(orig: BaseException | None) -> str:
    """The driver's or server's one-line reason (the primary message: no DETAIL or CONTEXT,
    which may quote row values)."""
    if orig is None:
        return "no reason given"
    # psycopg may raise its own error ("cannot exit pipeline mode while busy") during the
    # server's (the session ended): the server's says why
    for error in (orig, orig.__context__):
        primary = getattr(getattr(error, "diag", None), "message_primary", None)
        if primary and isinstance(error, psycopg.Error):
            return str(primary)
    text = str(orig).strip()
    return text.splitlines()[0] if text else type(orig).__name__


def _lost_message(step: Step, outcome: Outcome | None, why: str) -> str:
    """What a lost connection means for the call, in words."""
    head = f"the connection to PostgreSQL was lost ({why})"
    if outcome is None:
        return f"{head} during a read; it may be run again"
    if outcome == "stored":
        return f"{head} after the write's commit returned: the write is stored"
    if outcome == "not stored":
        return (
            f"{head} during a statement of a write, before its commit was sent: the "
            f"transaction rolled back, the write was not stored; {RETRY_IS_SAFE}"
        )
    during = "the commit of a write" if step == "commit" else "a write that commits on its own"
    return (
        f"{head} during {during}: the commit was sent and no reply came, so whether the write "
        f"was stored is unknown; {RETRY_IS_SAFE}"
    )
