"""Access tokens: ``token create|list|revoke`` (see :mod:`pgmemory.admin.tokens`).

A token is printed once, when created, and kept only as its hash; ``list`` shows names,
purposes and dates, never a token.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import (
    CliError,
    add_json,
    admin_of,
    duration_type,
    print_json,
    print_table,
    quoted_id,
    shown_id,
    when,
    with_store,
)

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``token`` and its sub-commands.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    token = commands.add_parser(
        "token",
        parents=[common],
        help="issue, list and revoke access tokens (the audit page's; kept hashed)",
        description="Access tokens open the audit page (and, later, the MCP server). A token "
        "is shown once, when created; the database keeps only its sha256, its name, purpose, "
        "expiry and revocation time.",
    )
    verbs = token.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = verbs.add_parser(
        "create",
        parents=[common],
        help="issue a token and print it once",
        description="Issue a token under NAME (whose or what it is) and print it, once.",
    )
    create.add_argument("name", help="the token's label, unique among live tokens")
    create.add_argument(
        "--purpose", default="ui", help="what it opens: ui (the default, the audit page) or mcp"
    )
    create.add_argument(
        "--expires-in",
        type=duration_type,
        default=timedelta(days=30),
        metavar="AGE",
        help="how long it works: e.g. 30d (the default), 12h, 2w; at most 366d",
    )
    add_json(create, '{"token", "id", "name", "purpose", "created_at", "expires_at"}')
    create.set_defaults(handler=lambda args: with_store(args, _create))

    listing = verbs.add_parser(
        "list", parents=[common], help="the live tokens (names and dates, never a token)"
    )
    listing.add_argument("--all", action="store_true", help="also the revoked and the expired ones")
    add_json(listing, '[{"id", "name", "purpose", "created_at", "expires_at", "revoked_at"}]')
    listing.set_defaults(handler=lambda args: with_store(args, _list))

    revoke = verbs.add_parser(
        "revoke", parents=[common], help="revoke a token at once (signed-in pages included)"
    )
    revoke.add_argument("name", help="the live token's name (or its number from `token list`)")
    add_json(revoke, '{"id", "name", "purpose", "created_at", "expires_at", "revoked_at"}')
    revoke.set_defaults(handler=lambda args: with_store(args, _revoke))


async def _create(store: MemoryStore, args: argparse.Namespace) -> int:
    issued = await admin_of(store).issue_token(
        args.name, purpose=args.purpose, lifetime=args.expires_in
    )
    if args.json:
        print_json({"token": issued.token, **issued.info.as_dict()})
    else:
        print(issued.token)
        print(
            f"(token {quoted_id(issued.info.name)} for {issued.info.purpose}, expires "
            f"{when(issued.info.expires_at)}; shown only now)",
        )
    return 0


async def _list(store: MemoryStore, args: argparse.Namespace) -> int:
    tokens = await admin_of(store).list_tokens(include_inactive=args.all)
    if args.json:
        print_json([t.as_dict() for t in tokens])
    else:
        print_table(
            ["ID", "NAME", "PURPOSE", "CREATED", "EXPIRES", "REVOKED"],
            [
                (
                    t.id,
                    shown_id(t.name),
                    t.purpose,
                    when(t.created_at),
                    when(t.expires_at),
                    when(t.revoked_at),
                )
                for t in tokens
            ],
        )
    return 0


async def _revoke(store: MemoryStore, args: argparse.Namespace) -> int:
    admin = admin_of(store)
    revoked = await admin.revoke_token(args.name)
    if revoked is None and args.name.isdigit():
        revoked = await admin.revoke_token(int(args.name))
    if revoked is None:
        raise CliError(
            f"no live token named {quoted_id(args.name)}: nothing revoked (see `pgmemory token list`)",
            code=1,
        )
    if args.json:
        print_json(revoked.as_dict())
    else:
        print(f"revoked token {quoted_id(revoked.name)} (number {revoked.id})")
    return 0
