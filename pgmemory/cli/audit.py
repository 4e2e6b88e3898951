"""``pgmemory audit verify``: check that the audit is intact (its guard and every row's hash).

Exits 0 when every check passes, 1 when one fails (each failure printed with what is wrong and
where), so it can run from cron or CI. ``pgmemory audit --user ID`` (showing a user's audit) is
in :mod:`pgmemory.cli.listing`.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import add_json, admin_of, print_json, print_table, with_store

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore


def add_verify(actions: Any, common: argparse.ArgumentParser) -> None:
    """Add ``verify`` to the sub-commands of ``audit``.

    Args:
        actions: the ``audit`` command's sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    verify = actions.add_parser(
        "verify", parents=[common],
        help="check the audit is intact: guard triggers, functions, grants, every row's hash",
        description="Check that the audit tables are append-only and unaltered: the guard "
        "triggers are enabled, the erase/prune functions are intact, owned by the tables' "
        "owner and not executable by PUBLIC, no other role may change audit rows or read the "
        "user secrets, every row still matches its row_sha256, every pseudonym has its erasure "
        "record, and an UPDATE of an audit row is refused (probed in a transaction rolled "
        "back). Reads only; scans the audits. Exit status 1 when a check fails. A superuser "
        "or the tables' owner can still defeat it: keep the printed row counts elsewhere.",
    )  # fmt: skip
    add_json(
        verify,
        '{"ok": bool, "checks": [{"name", "ok", "detail"}], '
        '"tables": {table: {"rows", "max_id"}}, "notes": [str]}',
    )
    verify.set_defaults(handler=verify_command)


def verify_command(args: argparse.Namespace) -> int:
    """``pgmemory audit verify [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status: 0 when the audit is intact, 1 when a check failed.
    """
    return with_store(args, _verify)


async def _verify(store: MemoryStore, args: argparse.Namespace) -> int:
    report = await admin_of(store).verify_audit()
    if args.json:
        print_json(report.as_dict())
    else:
        print_table(
            ["CHECK", "RESULT", "DETAIL"],
            [[c.name, "ok" if c.ok else "FAILED", c.detail] for c in report.checks],
        )
        print()
        print_table(
            ["TABLE", "ROWS", "MAX ID"],
            [[t, s["rows"], s["max_id"] if s["max_id"] is not None else "-"]
             for t, s in report.tables.items()],
        )  # fmt: skip
        for note in report.notes:
            print(f"note: {note}")
        print(
            "audit intact" if report.ok else f"audit NOT intact: {len(report.problems)} problem(s)"
        )
    return 0 if report.ok else 1
