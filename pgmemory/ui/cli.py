"""``pgmemory ui``: the command line of the audit page (argparse only; imports stay light).

Hook it into the main command line with::

    ui_cli.add_parser(commands)            # where the sub-commands are defined
    if args.command == "ui": return ui_cli.run(args)
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pgmemory.ui.server import DEFAULT_HOST, DEFAULT_PORT, TOKEN_ENV


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ui`` sub-command to an argparse sub-parsers object.

    Args:
        subparsers: what ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The new ``ui`` parser.
    """
    parser = subparsers.add_parser(
        "ui",
        help="serve the audit web page (what is remembered about a user, and which recalls used it)",
        description=(
            "Serve the audit web page. Read-only unless --allow-writes. Beyond loopback, or "
            f"with --allow-writes, it needs a token in {TOKEN_ENV}."
        ),
    )
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--allow-writes",
        action="store_true",
        help="offer erasure of a user or scope (needs the token)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve the page as parsed by :func:`add_parser` (uses ``args.url`` when present).

    Args:
        args: the parsed arguments.

    Returns:
        The exit status (2 when a token is needed but missing).
    """
    from pgmemory.ui.server import serve

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        serve(args.host, args.port, allow_writes=args.allow_writes, url=getattr(args, "url", None))
    except ValueError as exc:
        print(f"pgmemory ui: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m pgmemory.ui [--url URL] [--host H] [--port P] [--allow-writes]``.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    parser = argparse.ArgumentParser(prog="pgmemory")
    commands = parser.add_subparsers(dest="command", required=True)
    ui = add_parser(commands)
    ui.add_argument("--url", help="database URL (default: PGMEMORY_DATABASE_URL, else embedded)")
    return run(parser.parse_args(["ui", *(argv if argv is not None else sys.argv[1:])]))
