"""Where a database is, in words: its URL with the password masked, and why connecting to it
failed, with the fix (one wording, for the library's errors and the command line's).

Standard library only at module level: the command line's start-up imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The setting that names the database, as the library's errors name it.
URL_SETTING = "PGMEMORY_DATABASE_URL (or the URL or engine given to MemoryStore)"

_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)
_KEYWORD_PASSWORD = re.compile(r"(?P<head>password\s*=\s*)(?:'[^']*'|\S+)", re.IGNORECASE)


def mask(text: str) -> str:
    """``text`` with the passwords of any database URL (or libpq ``password=``) replaced by ***.

    Args:
        text: a URL, or a message that may contain one.

    Returns:
        The same text without credentials.
    """
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}***@", text)
    return _KEYWORD_PASSWORD.sub(lambda m: f"{m['head']}***", text)


@dataclass(frozen=True)
class Where:
    """Where a connection went: ``host:port`` (or the socket), database, role, masked URL."""

    address: str
    database: str
    role: str
    url: str


def where(url: str | None) -> Where:
    """What ``url`` (a libpq or SQLAlchemy URL, or None when unknown) names."""
    if not url:
        return Where("the database server", "?", "?", "(none)")
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:
        return Where("the database server", "?", "?", mask(url))
    host = parsed.host or str(parsed.query.get("host") or "localhost")
    address = f"{host}:{parsed.port or 5432}" if not host.startswith("/") else f"socket {host}"
    return Where(address, parsed.database or "?", parsed.username or "?", mask(url))


def connection_problem(driver_message: str, at: Where, *, setting: str = URL_SETTING) -> str:
    """Why a connection to ``at`` failed and what to fix, from the driver's message (libpq's
    own words: it names no password), naming ``setting`` and the masked URL."""
    text = driver_message.strip()
    first = text.splitlines()[0] if text else "the connection failed"
    lowered = text.lower()
    check = f"check {setting}, now {at.url}"
    if "connection refused" in lowered:
        return (
            f"cannot connect to PostgreSQL at {at.address}: connection refused; {check}, "
            "and start the server (or unset it to use the embedded one)"
        )
    if "timeout" in lowered or "timed out" in lowered:
        return (
            f"cannot connect to PostgreSQL at {at.address}: no answer in time; {check}, and "
            "that the server is running and reachable (firewall, network)"
        )
    unresolved = ("resolve host", "translate host name", "name or service")
    if any(phrase in lowered for phrase in unresolved):
        return (
            f"cannot find the host of PostgreSQL at {at.address}: the name does not "
            f"resolve; {check}"
        )
    if "password" in lowered or "authentication" in lowered:
        return (
            f"PostgreSQL at {at.address} refused the login of role {at.role!r} "
            f"(authentication failed); check the user and password in {setting}"
        )
    if "database" in lowered and "does not exist" in lowered:
        return (
            f"database {at.database!r} does not exist on PostgreSQL at {at.address}: "
            f"create it (createdb {at.database}) or fix the database name in {setting}"
        )
    if "role" in lowered and "does not exist" in lowered:
        return (
            f"role {at.role!r} does not exist on PostgreSQL at {at.address}: create it, "
            f"or fix the user name in {setting}"
        )
    reason = first.split("failed:", 1)[-1].strip() or first
    return f"cannot connect to PostgreSQL at {at.address}: {reason}; {check}"
