"""What every command shares: the database to work on, tables and JSON, confirmation, errors.

Ids (users, sessions, agents, applications, collections, actors) are shown to people through
:func:`shown_id`, the audit page's rendering too (:func:`pgmemory.text.visible.visible_id`):
invisible code points escaped, whole in a table. ``--json`` carries them exactly.

Standard library only at module level (``pgmemory --help`` imports this module); settings,
SQLAlchemy and the store load inside the functions that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from pgmemory.store._engine import addresses
from pgmemory.text.visible import visible_id

if TYPE_CHECKING:
    from pgmemory.admin import Admin
    from pgmemory.settings import Settings
    from pgmemory.store.store import MemoryStore

T = TypeVar("T")

#: Most rows a listing shows at once (the store's page size limit).
MAX_LIMIT = 200
#: Longest content shown in a table cell (``--json`` gives the whole text).
CELL_CHARS = 100

# --- errors ---------------------------------------------------------------------------------


class CliError(Exception):
    """A failure the command line reports as one line (``pgmemory: error: ...``).

    Args:
        message: what went wrong and the fix.
        code: the exit status (2: the command line or its input is wrong; 1: anything else).
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


#: Database URLs in messages have their passwords masked (one definition, the library's).
mask = addresses.mask


class _Target:
    """The database the running command works on (for error messages)."""

    url: str | None = None
    #: The data directory of the embedded server the command started (None: a URL was given).
    embedded: Path | None = None


#: Set once the command knows its database; :mod:`pgmemory.cli.errors` names it in messages.
target = _Target()


# --- the database ---------------------------------------------------------------------------


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings a command runs with (``--env-file`` read when given).

    Args:
        args: the parsed command line.

    Returns:
        The settings.
    """
    from pgmemory.settings import Settings

    env_file = getattr(args, "env_file", None)
    return Settings.from_env_file(env_file) if env_file else Settings()


@contextlib.contextmanager
def database_url(settings: Settings, url: str | None) -> Iterator[str]:
    """The database to work on, starting the embedded server for the block if needed.

    Args:
        settings: where ``PGMEMORY_DATABASE_URL`` and ``PGMEMORY_DATA_DIR`` come from.
        url: the ``--url`` option, which wins over the settings.

    Yields:
        A SQLAlchemy URL (also recorded in :data:`target` for error messages).
    """
    if url:
        target.url = url
        yield url
    elif settings.database_url is not None:
        target.url = settings.database_url.get_secret_value()
        yield target.url
    elif not settings.embedded:  # a misspelt URL variable must not mean "the local server"
        from pgmemory.errors import DatabaseNotReadyError
        from pgmemory.store._engine.connections import NO_URL_NO_EMBEDDED

        raise DatabaseNotReadyError(NO_URL_NO_EMBEDDED)
    else:
        from pgmemory.store.embedded import EmbeddedServer

        server = EmbeddedServer(settings.data_dir)
        try:
            target.url = server.start()
            target.embedded = Path(settings.data_dir)
            yield target.url
        finally:
            target.embedded = None
            server.stop()


def with_store(
    args: argparse.Namespace, command: Callable[[MemoryStore, argparse.Namespace], Awaitable[T]]
) -> T:
    """Open the store the command line names, run one async command on it, and close it.

    Args:
        args: the parsed command line (``--url``, ``--env-file``).
        command: the coroutine function to run with the open store and ``args``.

    Returns:
        What the command returned.
    """
    import asyncio

    from pgmemory.store.store import MemoryStore

    settings = settings_of(args)

    async def run(url: str) -> T:
        async with MemoryStore(url, settings=settings) as store:
            return await command(store, args)

    with database_url(settings, args.url) as url:
        return asyncio.run(run(url))


def admin_of(store: MemoryStore) -> Admin:
    """The admin plane over ``store`` (imported here, so that ``pgmemory --help`` loads no
    driver)."""
    from pgmemory.admin import Admin

    return Admin(store)


async def known_collection(store: MemoryStore, name: str, *, hint: str = "") -> None:
    """Fail with the list of existing collections unless ``name`` is one of them.

    Args:
        store: the open store.
        name: the collection asked for.
        hint: another way out, added to the message (e.g. an option that creates it).

    Raises:
        CliError: no such collection (exit status 2).
    """
    names = [info.name for info in await store.list_collections()]
    if name not in names:
        existing = ", ".join(map(visible_id, names)) if names else "none yet"
        raise CliError(
            f"unknown collection {quoted_id(name)}; existing collections: {existing} "
            f"(see `pgmemory collections`){hint}",
            code=2,
        )


# --- confirmation ---------------------------------------------------------------------------


def require_consent(args: argparse.Namespace, action: str) -> None:
    """Refuse a destructive command up front when it can neither ask nor was told ``--yes``.

    Args:
        args: the parsed command line (``yes``).
        action: what the command destroys, e.g. ``"forget erases a user's data"``.

    Raises:
        CliError: stdin is not a terminal and ``--yes`` was not given (exit status 2).
    """
    if not args.yes and not sys.stdin.isatty():
        raise CliError(
            f"{action}; pass --yes to confirm (stdin is not a terminal, so it cannot ask)", code=2
        )


def confirm(args: argparse.Namespace, question: str) -> None:
    """Ask ``question`` on the terminal unless ``--yes`` was given; stop unless answered yes.

    Args:
        args: the parsed command line (``yes``).
        question: the question, naming what will be destroyed.

    Raises:
        CliError: the answer was not yes (nothing was done).
    """
    if args.yes:
        return
    if not sys.stdin.isatty():  # checked up front too; kept here for direct callers
        raise CliError(f"{question} needs --yes (stdin is not a terminal)", code=2)
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("not confirmed; nothing was changed", code=1)


def add_yes(parser: argparse.ArgumentParser) -> None:
    """Add ``--yes`` (skip the confirmation; required when stdin is not a terminal).

    Args:
        parser: a destructive command's parser.
    """
    parser.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="do it without asking (required when stdin is not a terminal, e.g. in scripts)",
    )


# --- arguments ------------------------------------------------------------------------------


def limit_type(text: str) -> int:
    """argparse type of ``--limit``: an integer from 1 to :data:`MAX_LIMIT`.

    Args:
        text: the option's value.

    Returns:
        The limit.

    Raises:
        argparse.ArgumentTypeError: not such an integer.
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected a number from 1 to {MAX_LIMIT}, got {text!r} (`pgmemory export` writes a "
            "whole scope)"
        )
    return value


_DURATION = re.compile(r"(\d+)\s*([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_type(text: str) -> timedelta:
    """argparse type of an age: ``90d``, ``12h``, ``30m``, ``45s``, ``2w`` or sums (``1d12h``).

    Args:
        text: the option's value.

    Returns:
        The age.

    Raises:
        argparse.ArgumentTypeError: not such a duration.
    """
    compact = text.strip().lower()
    if not compact or _DURATION.sub("", compact).strip():
        raise argparse.ArgumentTypeError(
            f"expected an age such as 90d, 12h, 30m, 45s, 2w or 1d12h, got {text!r}"
        )
    seconds = sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION.findall(compact))
    return timedelta(seconds=seconds)


def describe_age(age: timedelta) -> str:
    """An age in words, e.g. ``90 days`` or ``1 day 12 hours``.

    Args:
        age: the age.

    Returns:
        The words.
    """
    seconds = int(age.total_seconds())
    parts = []
    for name, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {name}{'s' if count != 1 else ''}")
    return " ".join(parts) or "0 seconds"


def add_json(parser: argparse.ArgumentParser, keys: str) -> None:
    """Add ``--json`` with the documented keys of the document it prints.

    Args:
        parser: the command's parser.
        keys: the document's shape, e.g. ``{"collections": [{"name", ...}]}``.
    """
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"print ONE JSON document instead of a table; its keys (stable): {keys}",
    )


# --- output ---------------------------------------------------------------------------------


def when(value: datetime | None) -> str:
    """A time for a table cell: UTC to the second, e.g. ``2026-01-31T09:15:02Z`` (``-``: none).

    Args:
        value: an aware datetime or None.

    Returns:
        The cell text.
    """
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso(value: datetime | None) -> str | None:
    """A time for JSON: full precision, in UTC (``None`` stays ``null``).

    Args:
        value: an aware datetime or None.

    Returns:
        ISO 8601 text, e.g. ``2026-01-31T09:15:02.123456+00:00``.
    """
    return None if value is None else value.astimezone(UTC).isoformat()


def clip(text: str | None, chars: int = CELL_CHARS) -> str:
    """Text for a table cell: one line (whitespace runs become one space), at most ``chars``.

    Args:
        text: the text (None: ``-``).
        chars: the longest cell.

    Returns:
        The cell text, ending in ``…`` when cut.
    """
    if text is None:
        return "-"
    line = " ".join(text.split())
    return line if len(line) <= chars else line[: chars - 1] + "…"


class Verbatim(str):
    """Table-cell text printed as it is: never clipped, its spaces kept (see :func:`cell`)."""

    __slots__ = ()


def shown_id(value: str | None) -> Verbatim | None:
    """An id as a table cell or a printed line shows it: its invisible code points, spaces at
    either end and backslashes escaped (:func:`~pgmemory.text.visible.visible_id`, the audit
    page's rendering too), and kept whole in a table (an id cut or with its spaces squeezed
    would be another id).

    Args:
        value: the id (None: none; a table shows ``-``).

    Returns:
        The text, or None.
    """
    return None if value is None else Verbatim(visible_id(value))


def quoted_id(value: str) -> str:
    """An id in a sentence: :func:`shown_id`'s text between single quotes, e.g. ``'alice'``.

    Args:
        value: the id.

    Returns:
        The quoted text.
    """
    return f"'{visible_id(value)}'"


def _width(text: str) -> int:
    """Terminal columns ``text`` takes (East Asian wide characters take two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def cell(value: object) -> str:
    """A value as table-cell text (None: ``-``; times in UTC; scores to 4 decimals; a
    :class:`Verbatim` text, e.g. an id from :func:`shown_id`, as it is; other text clipped).

    Args:
        value: the value.

    Returns:
        The text.
    """
    if value is None or value == "":
        return "-"
    if isinstance(value, Verbatim):
        return value
    if isinstance(value, datetime):
        return when(value)
    if isinstance(value, float):
        return f"{value:.4f}"
    return clip(str(value))


def print_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, out: IO[str] | None = None
) -> None:
    """Print a header row and aligned rows (two spaces between columns; the last is not padded).

    Args:
        headers: the column titles.
        rows: the rows, each a value per column (see :func:`cell`).
        out: where to print (default: standard output).
    """
    out = out or sys.stdout
    lines = [list(headers), *([cell(v) for v in row] for row in rows)]
    widths = [max(_width(line[i]) for line in lines) for i in range(len(headers) - 1)]
    for line in lines:
        padded = [text + " " * (widths[i] - _width(text)) for i, text in enumerate(line[:-1])]
        out.write("  ".join([*padded, line[-1]]).rstrip() + "\n")


def note(text: str) -> None:
    """A remark for the reader on standard error (so standard output stays a clean table).

    Args:
        text: the remark.
    """
    print(text, file=sys.stderr)


def _default(value: object) -> Any:
    import uuid

    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


def dumps(document: object, *, indent: int | None = None) -> str:
    """``document`` as JSON text (times in ISO 8601 UTC, UUIDs as strings, non-ASCII as is).

    Args:
        document: a JSON-native value, possibly holding datetimes, UUIDs or numpy arrays.
        indent: pretty-print with this indent (None: one line).

    Returns:
        The JSON text.
    """
    return json.dumps(document, default=_default, ensure_ascii=False, indent=indent)


def print_json(document: object) -> None:
    """Print ``document`` as ONE JSON document (indented).

    Args:
        document: the document.
    """
    print(dumps(document, indent=2))
