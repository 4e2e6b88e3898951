"""``pgmemory`` command line: schema management and a look at stored memories.

Built on the same API the library exposes. With no ``PGMEMORY_DATABASE_URL`` it works on the
embedded server under ``PGMEMORY_DATA_DIR``.
"""

# Only the standard library is imported at module level, so `pgmemory --help` and argument
# errors answer at once; settings, SQLAlchemy, alembic and the store load inside the commands.
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgmemory.settings import Settings


@contextlib.contextmanager
def _database_url(settings: Settings, url: str | None) -> Iterator[str]:
    """The database to work on, starting the embedded server for the block if needed.

    Args:
        settings: where ``PGMEMORY_DATABASE_URL`` and ``PGMEMORY_DATA_DIR`` come from.
        url: the ``--url`` option, which wins over the settings.

    Yields:
        A SQLAlchemy URL.
    """
    if url:
        yield url
    elif settings.database_url is not None:
        yield settings.database_url.get_secret_value()
    else:
        from pgmemory.store.embedded import EmbeddedServer

        server = EmbeddedServer(settings.data_dir)
        try:
            yield server.start()
        finally:
            server.stop()


def _with_store(url: str, settings: Settings, args: argparse.Namespace) -> None:
    """Run one store command (collections, recall, forget) through the public API.

    Args:
        url: the database.
        settings: the store's settings.
        args: the parsed command line.
    """
    import asyncio

    from pgmemory.store.records import MemoryScope, RecallTrace
    from pgmemory.store.store import MemoryStore

    async def run() -> None:
        async with MemoryStore(url, settings=settings) as store:
            if args.command == "collections":
                for info in await store.list_collections():
                    print(f"{info.name}\t{info.dimensions}\t{info.embedding_model}")
            elif args.command == "recall":
                scope = MemoryScope(
                    user_id=args.user,
                    session_id=args.session,
                    agent_id=args.agent,
                    application_id=args.application,
                )
                hits = await store.search(
                    args.collection, scope, query=args.query, limit=args.limit, mode=args.mode,
                    trace=RecallTrace(provider="cli", mode=args.mode),
                )
                for hit in hits:
                    when = hit.memory.created_at.isoformat(timespec="seconds")
                    print(f"{hit.score:.4f}\t{when}\t{hit.memory.role}\t{hit.memory.content}")
            else:
                counts = await store.erase_user(args.user_id, actor=args.actor)
                for kind, count in counts.items():
                    print(f"{kind}\t{count}")

    asyncio.run(run())


def _parser() -> argparse.ArgumentParser:
    """The command line's grammar (standard library only, so ``--help`` is instant)."""
    description = (__doc__ or "pgmemory command line").splitlines()[0].replace("``", "")
    parser = argparse.ArgumentParser(prog="pgmemory", description=description)
    parser.add_argument("--url", help="database URL (default: PGMEMORY_DATABASE_URL, else embedded)")
    parser.add_argument(
        "--env-file",
        help="read PGMEMORY_* settings from this file too (default: the file PGMEMORY_ENV_FILE "
        "names, else none)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    db = commands.add_parser("db", help="schema management (alembic, version table pgmemory_alembic_version)")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="upgrade the schema (default: to head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    downgrade = db_commands.add_parser("downgrade", help="downgrade the schema ('base' removes it)")
    downgrade.add_argument("revision")
    db_commands.add_parser("current", help="print the schema revision")
    db_commands.add_parser("heads", help="print the newest revision this version ships")
    commands.add_parser("collections", help="list collections (name, dimensions, model)")
    recall = commands.add_parser("recall", help="search a scope's memories (audited as provider 'cli')")
    recall.add_argument("collection")
    recall.add_argument("query")
    recall.add_argument("--user")
    recall.add_argument("--session")
    recall.add_argument("--agent")
    recall.add_argument("--application")
    recall.add_argument("--limit", type=int, default=5)
    recall.add_argument("--mode", choices=("vector", "text", "hybrid"), default="hybrid")
    forget = commands.add_parser(
        "forget", help="erase everything stored about a user (memories, facts, history)"
    )
    forget.add_argument("user_id")
    forget.add_argument("--actor", default="cli", help="who asked, recorded in the audit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pgmemory`` console script.

    Args:
        argv: the arguments, without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit status (0). ``--help`` and usage errors exit through ``SystemExit``.

    Raises:
        PgMemoryError: a command failed for a reason pgmemory can name (see :func:`run`).
    """
    args = _parser().parse_args(argv)

    from pgmemory.settings import Settings
    from pgmemory.store import migrate

    if args.command == "db" and args.db_command == "heads":
        print(migrate.head_revision())
        return 0
    settings = Settings.from_env_file(args.env_file) if args.env_file else Settings()
    with _database_url(settings, args.url) as url:
        if args.command == "db":
            if args.db_command == "upgrade":
                migrate.upgrade(url, args.revision)
                print(f"pgmemory schema at {migrate.current(url)}")
            elif args.db_command == "downgrade":
                migrate.downgrade(url, args.revision)
                print(f"pgmemory schema at {migrate.current(url)}")
            else:
                print(migrate.current(url) or "none")
        else:
            _with_store(url, settings, args)
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """Like :func:`main`, but pgmemory's own errors print one line instead of a traceback.

    Args:
        argv: the arguments, without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The exit status: 0, or 2 after a pgmemory error.
    """
    from pgmemory.errors import PgMemoryError

    try:
        return main(argv)
    except PgMemoryError as exc:
        print(f"pgmemory: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(run())
