"""Deleting on purpose: ``forget`` (a user's right to erasure) and ``prune-audit`` (retention).

Both ask for confirmation on a terminal and need ``--yes`` otherwise; both are audited.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import (
    CliError,
    add_json,
    add_yes,
    admin_of,
    confirm,
    describe_age,
    duration_type,
    mask,
    print_json,
    print_table,
    quoted_id,
    require_consent,
    target,
    when,
    with_store,
)

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``forget`` and ``prune-audit``.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    forget = commands.add_parser(
        "forget",
        parents=[common],
        help="erase everything stored about a user (memories, facts, chat history); asks first",
        description="Erase everything stored about a user in ONE transaction: memories in "
        "every collection (each deletion audited by content hash), facts, chat history and "
        "pending derivation jobs; "
        "in the audits the user id becomes a pseudonym, kept values are blanked and the key of "
        "the audit hashes is destroyed. Asks for confirmation on a terminal; "
        "needs --yes otherwise.",
    )
    forget.add_argument("user_id", help="the user to erase")
    forget.add_argument(
        "--actor", default="cli", help="who asked, recorded in the audit (default: cli)"
    )
    add_yes(forget)
    add_json(
        forget,
        '{"user_id", "erased": {"memories", "facts", "history_messages", "derivation_jobs", '
        '"memory_audit_rows_pseudonymised", "recall_audit_rows_pseudonymised", '
        '"fact_audit_rows_pseudonymised"}}',
    )
    forget.set_defaults(handler=forget_command)

    prune = commands.add_parser(
        "prune-audit",
        parents=[common],
        help="delete audit rows older than an age (retention; by default pgmemory keeps all)",
        description="Delete the recall audit, memory write/delete audit and fact audit rows "
        "older than an age, in ONE transaction. Memories, facts and chat history are untouched. "
        "The prune records itself (cutoff, counts, actor) in the fact audit. pgmemory keeps every "
        "audit row unless this runs (e.g. daily from cron). Asks for confirmation on a terminal; "
        "needs --yes otherwise.",
    )
    prune.add_argument(
        "--older-than",
        required=True,
        type=duration_type,
        metavar="AGE",
        help="delete rows older than this: e.g. 90d, 12h, 30m, 45s, 2w, 1d12h",
    )
    prune.add_argument(
        "--actor", default="cli", help="who asked, recorded with the prune (default: cli)"
    )
    add_yes(prune)
    add_json(
        prune, '{"cutoff": ISO time, "deleted": {"recall_audit", "memory_audit", "fact_audit"}}'
    )
    prune.set_defaults(handler=prune_command)


def forget_command(args: argparse.Namespace) -> int:
    """``pgmemory forget USER_ID [--actor A] [--yes] [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    require_consent(args, "forget erases a user's memories, facts and chat history")
    return with_store(args, _forget)


async def _forget(store: MemoryStore, args: argparse.Namespace) -> int:
    if not await admin_of(store).user_known(args.user_id):
        raise CliError(
            f"no user {quoted_id(args.user_id)} in the database at {mask(target.url or '?')}: nothing "
            "erased. Check the database (--url, PGMEMORY_DATABASE_URL) and the user id",
            code=1,
        )
    confirm(
        args,
        f"Erase everything stored about user {quoted_id(args.user_id)} (memories in every collection, "
        "facts, chat history)? This cannot be undone.",
    )
    counts = await store.erase_user(args.user_id, actor=args.actor)
    if args.json:
        print_json({"user_id": args.user_id, "erased": counts})
    else:
        print_table(["ERASED", "COUNT"], list(counts.items()))
    return 0


def prune_command(args: argparse.Namespace) -> int:
    """``pgmemory prune-audit --older-than AGE [--actor A] [--yes] [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    require_consent(args, "prune-audit deletes audit rows")
    return with_store(args, _prune)


async def _prune(store: MemoryStore, args: argparse.Namespace) -> int:
    cutoff = datetime.now(UTC) - args.older_than
    confirm(
        args,
        f"Delete the audit rows (recalls, memory writes and deletes, fact changes) older than "
        f"{describe_age(args.older_than)}, i.e. written before {when(cutoff)}?",
    )
    counts = await admin_of(store).prune_audit(cutoff, actor=args.actor)
    if args.json:
        print_json({"cutoff": cutoff, "deleted": counts})
    else:
        print(f"audit rows written before {when(cutoff)} deleted:")
        print_table(["AUDIT", "DELETED"], list(counts.items()))
    return 0
