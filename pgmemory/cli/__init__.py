"""``pgmemory`` command line: the schema, what is stored about a user, audits and retention.

Built on the same API the library exposes. With no ``PGMEMORY_DATABASE_URL`` it works on the
embedded server under ``PGMEMORY_DATA_DIR``. Commands, one module per group:

* :mod:`pgmemory.cli.db` - ``db upgrade|downgrade|current|heads|history|roles``;
* :mod:`pgmemory.cli.listing` - ``collections``, ``users``, ``memories``, ``sessions``,
  ``recall``;
* :mod:`pgmemory.cli.audit` - ``audit --user`` (a user's audit), ``audit verify``;
* :mod:`pgmemory.cli.transfer` - ``export``, ``import``;
* :mod:`pgmemory.cli.erase` - ``forget``, ``prune-audit``;
* :mod:`pgmemory.cli.tokens` - ``token create|list|revoke`` (access tokens);
* :mod:`pgmemory.cli.two_phase` - ``two-phase`` (how large scopes are searched);
* :mod:`pgmemory.cli.mcp` - ``mcp`` (the MCP server);
* :mod:`pgmemory.cli.worker` - ``worker`` (queued fact extraction);
* :mod:`pgmemory.ui.cli` - ``ui`` (the audit web page).

Failures pgmemory can explain print ONE line (``pgmemory: error: ...``, see
:mod:`pgmemory.cli.errors`) and exit non-zero: 2 for a wrong command line or input, 1 for
anything else (connection, database, a refused confirmation), 130 when interrupted.
"""

# Only the standard library (and these stdlib-only modules) is imported at module level, so
# `pgmemory --help` and argument errors answer at once; settings, SQLAlchemy, alembic and the
# store load inside the commands.
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from pgmemory.cli import db, erase, listing, mcp, tokens, transfer, two_phase, worker
from pgmemory.extras import installed_version


def _parser() -> argparse.ArgumentParser:
    """The command line's grammar (standard library only, so ``--help`` is instant)."""
    from pgmemory.ui import cli as ui_cli

    description = (__doc__ or "pgmemory command line").splitlines()[0].replace("``", "")
    parser = argparse.ArgumentParser(prog="pgmemory", description=description)
    parser.add_argument(
        "--version",
        action="version",
        version=f"pgmemory {installed_version()}",
        help="print the installed pgmemory's version and exit",
    )
    url_help = (
        "database URL, e.g. postgresql://user:password@host:5432/db (default: "
        "PGMEMORY_DATABASE_URL, else the embedded server)"
    )
    parser.add_argument("--url", help=url_help)
    parser.add_argument(
        "--env-file",
        help="read PGMEMORY_* settings from this file too (default: the file PGMEMORY_ENV_FILE "
        "names, else none)",
    )
    # Every command also takes --url after its name; SUPPRESS keeps a global one in force.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=argparse.SUPPRESS, help=url_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    db.add_parsers(commands, common)
    listing.add_parsers(commands, common)
    transfer.add_parsers(commands, common)
    erase.add_parsers(commands, common)
    tokens.add_parsers(commands, common)
    two_phase.add_parser(commands, common)
    mcp.add_parser(commands, common)
    worker.add_parser(commands, common)
    ui_cli.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pgmemory`` console script, without the error handling of :func:`run`.

    Args:
        argv: the arguments, without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit status. ``--help`` and usage errors exit through ``SystemExit``.

    Raises:
        Exception: whatever the command raised (:func:`run` turns it into one line).
    """
    args = _parser().parse_args(argv)
    if args.command == "ui":
        # The page opens its own store (from --url, else the settings), for as long as it runs.
        from pgmemory.ui import cli as ui_cli

        return ui_cli.run(args)
    status: int = args.handler(args)
    return status


def run(argv: Sequence[str] | None = None) -> int:
    """Like :func:`main`, but a failure pgmemory can explain prints one line, not a traceback.

    Args:
        argv: the arguments, without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit status: 0; 2 for a wrong command line or input; 1 for other failures
        (connection, database, a confirmation refused); 130 when interrupted.
    """
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("pgmemory: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (e.g. `pgmemory memories ... | head`): not an error. Point
        # stdout at /dev/null so that the interpreter's final flush does not fail again.
        import os

        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        from pgmemory.cli.errors import report

        return report(exc)


if __name__ == "__main__":
    sys.exit(run())
