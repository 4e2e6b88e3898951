"""``pgmemory mcp``: the memory tools over the Model Context Protocol (see
:mod:`pgmemory.integrations.mcp`), over stdio for one user or streamable HTTP with a token per
user."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import CliError, quoted_id, with_store
from pgmemory.vocabulary import FACTS_NAMESPACE

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore

#: The HTTP face's default port.
DEFAULT_PORT = 8766


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``mcp``.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    mcp = commands.add_parser(
        "mcp",
        parents=[common],
        help="serve memory tools over MCP (stdio for one user, or HTTP with a token per user)",
        description="Serve search_memories, add_memory, list_recent, forget_memory and "
        "get_facts over the Model Context Protocol. Over stdio every call acts for --user; "
        "over --http for the user each request's token names (`pgmemory token create USER "
        "--purpose mcp`). Tool arguments never choose the user.",
    )
    mcp.add_argument("--collection", required=True, help="the collection the tools use")
    mcp.add_argument("--user", help="stdio: the user every call acts for")
    mcp.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="HTTP: the address to bind (loopback)")
    mcp.add_argument("--port", type=int, default=DEFAULT_PORT, help="HTTP: the port")
    mcp.add_argument(
        "--facts-namespace",
        default=FACTS_NAMESPACE,
        help=f"the facts namespace get_facts reads (default {FACTS_NAMESPACE!r}: fact memory's)",
    )
    mcp.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (stdio: until the client closes the stream)."""
    if args.http and args.user:
        raise CliError(
            "--user is for stdio: over --http each request's token names its user; drop --user"
        )
    if not args.http and not args.user:
        raise CliError("name the user every call acts for: --user USER (or serve --http)")
    with_store(args, _serve)
    return 0


async def _serve(store: MemoryStore, args: argparse.Namespace) -> None:
    from pgmemory.integrations.mcp import create_server, http_app

    server = create_server(
        store, args.collection, user_id=args.user, facts_namespace=args.facts_namespace
    )
    if not args.http:
        await server.run_stdio_async()
        return
    import uvicorn

    config = uvicorn.Config(
        http_app(store, server, host=args.host),
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="on",
    )
    print(
        f"pgmemory mcp: collection {quoted_id(args.collection)} on http://{args.host}:{args.port}/mcp",
        file=sys.stderr,
        flush=True,
    )
    await uvicorn.Server(config).serve()
