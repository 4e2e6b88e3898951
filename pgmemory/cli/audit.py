"""``pgmemory audit``: a user's audit (``--user ID``), and ``audit verify``, the check that the
audit is intact (its guard and every row's hash).

``audit --user`` prints the user's recalls with the memories each returned, then the writes and
deletes of their memories, then fact changes, newest first (or ONE JSON document with
``--json``). ``audit verify`` exits 0 when every check passes, 1 when one fails (each failure
printed with what is wrong and where), so it can run from cron or CI.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import (
    MAX_LIMIT,
    CliError,
    add_json,
    admin_of,
    clip,
    dumps,
    limit_type,
    note,
    print_json,
    print_table,
    quoted_id,
    shown_id,
    with_store,
)
from pgmemory.store.modes import score_kind, scores_help

if TYPE_CHECKING:
    from pgmemory.admin.facts import FactChange
    from pgmemory.admin.memories import MemoryAuditEntry
    from pgmemory.admin.recalls import Recall
    from pgmemory.store.store import MemoryStore

#: Pages of a user's audit read at most when ``audit --session`` filters them.
_SCAN_PAGES = 25


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``audit`` (a user's audit) and its sub-command ``verify``.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    audit = commands.add_parser(
        "audit",
        parents=[common],
        help="a user's (or one session's) recalls with the memories each returned, and the "
        "writes and deletes of their memories and facts",
        description="Show the audit of a user, newest first: each recall (which memories went "
        "into an answer, with their scores), then the writes, deletes and expiries of memories, "
        "then fact changes. " + scores_help() + ".",
    )
    audit.add_argument("--user", help="the user id (required unless a sub-command is given)")
    audit.add_argument(
        "--session",
        help="only this session: recalls of it or requested from it, writes and facts in it",
    )
    audit.add_argument(
        "--limit",
        type=limit_type,
        default=20,
        help=f"entries per section (1-{MAX_LIMIT}, default 20)",
    )
    add_json(
        audit,
        '{"user_id", "session_id": id|null, "recalls": [{"id", "at", "collection", '
        '"scope": {"application_id", "agent_id", "session_id"}, "requesting_session_id", '
        '"provider", "mode", "score_kind": "cosine similarity"|"BM25"|"fused score"|"score", '
        '"query_sha256", "query_text" (null unless kept), "returned", "memories": [{"rank", '
        '"memory_id", "score", "reason": "match"|"recent"|"neighbour"|null, "signals": '
        '{"similarity", "keywords", "recency", "neighbour"}|null, "content" (null once deleted), '
        '"role", "collection", "session_id", "created_at", "deleted", "deleted_at", '
        '"deleted_by"}]}], "writes": [{"id", "at", '
        '"operation", "memory_id", "collection", "application_id", "agent_id", "session_id", '
        '"content_sha256", "actor"}], "fact_changes": [{"id", "at", "namespace", "key", '
        '"old_value", "new_value", "application_id", "agent_id", "session_id", "actor"}], '
        '"more": {"recalls", "writes", "fact_changes"} (true: older entries exist)}',
    )
    audit.set_defaults(handler=_audit_command)
    # `pgmemory audit verify`; without a sub-command, the user's audit above.
    actions = audit.add_subparsers(dest="audit_command", metavar="verify")
    add_verify(actions, common)


def add_verify(actions: Any, common: argparse.ArgumentParser) -> None:
    """Add ``verify`` to the sub-commands of ``audit``.

    Args:
        actions: the ``audit`` command's sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    verify = actions.add_parser(
        "verify",
        parents=[common],
        help="check the audit is intact: guard triggers, functions, grants, every row's hash",
        description="Check that the audit tables are append-only and unaltered: the guard "
        "triggers are enabled, the erase/prune functions are intact, owned by the tables' "
        "owner and not executable by PUBLIC, no other role may change audit rows or read the "
        "user secrets, every row still matches its row_sha256, every pseudonym has its erasure "
        "record, and an UPDATE of an audit row is refused (probed in a transaction rolled "
        "back). Reads only; scans the audits. Exit status 1 when a check fails. A superuser "
        "or the tables' owner can still defeat it: keep the printed row counts elsewhere.",
    )
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
            [
                [t, s["rows"], s["max_id"] if s["max_id"] is not None else "-"]
                for t, s in report.tables.items()
            ],
        )
        for note in report.notes:
            print(f"note: {note}")
        print(
            "audit intact" if report.ok else f"audit NOT intact: {len(report.problems)} problem(s)"
        )
    return 0 if report.ok else 1


def _in_session(session: str | None, *values: str) -> bool:
    return session is None or session in values


async def _scan(
    read: Callable[..., Awaitable[Any]],
    keep: Callable[[Any], bool],
    *,
    pages: int,
    size: int,
    limit: int,
) -> tuple[list[Any], bool]:
    """Up to ``limit`` items that ``keep`` accepts, newest first, reading at most ``pages``
    pages of ``size``; and whether more may exist."""
    items: list[Any] = []
    before = None
    for _ in range(pages):
        page = await read(before=before, limit=size)
        items += [item for item in page.items if keep(item)]
        before = page.older
        if before is None or len(items) > limit:
            break
    return items[:limit], before is not None or len(items) > limit


def _audit_command(args: argparse.Namespace) -> int:
    if not args.user:
        raise CliError(
            "audit needs --user USER (a user's audit), or the sub-command verify "
            "(`pgmemory audit verify`: check the audit is intact)",
            code=2,
        )
    return with_store(args, _audit)


async def _audit(store: MemoryStore, args: argparse.Namespace) -> int:
    session = args.session
    # Without --session each section is one page; with it, pages are filtered (a bounded scan).
    scan = {
        "pages": 1 if session is None else _SCAN_PAGES,
        "size": args.limit if session is None else MAX_LIMIT,
        "limit": args.limit,
    }
    recalls, more_recalls = await _scan(
        lambda **page: admin_of(store).user_recalls(args.user, **page),
        lambda r: _in_session(session, r.session_id, r.requesting_session_id),
        **scan,
    )
    writes, more_writes = await _scan(
        lambda **page: admin_of(store).user_memory_audit(args.user, **page),
        lambda w: _in_session(session, w.session_id),
        **scan,
    )
    facts, more_facts = await _scan(
        lambda **page: admin_of(store).user_fact_history(args.user, **page),
        lambda f: _in_session(session, f.session_id),
        **scan,
    )
    more = {"recalls": more_recalls, "writes": more_writes, "fact_changes": more_facts}

    if args.json:
        print_json(
            {
                "user_id": args.user,
                "session_id": session,
                "recalls": [_recall_json(r) for r in recalls],
                "writes": [_write_json(w) for w in writes],
                "fact_changes": [_fact_json(f) for f in facts],
                "more": more,
            }
        )
        return 0
    _print_audit(args.user, session, recalls, writes, facts, more)
    return 0


def _recall_json(recall: Recall) -> dict[str, Any]:
    return {
        "id": recall.id,
        "at": recall.at,
        "collection": recall.collection,
        "scope": {
            "application_id": recall.application_id or None,
            "agent_id": recall.agent_id or None,
            "session_id": recall.session_id or None,
        },
        "requesting_session_id": recall.requesting_session_id or None,
        "provider": recall.provider,
        "mode": recall.mode,
        "score_kind": score_kind(recall.mode),
        "query_sha256": recall.query_sha256,
        "query_text": recall.query_text,
        "returned": recall.returned,
        "memories": [
            {
                "rank": m.rank,
                "memory_id": m.memory_id,
                "score": m.score,
                "reason": m.reason,
                "signals": None if m.signals is None else m.signals.as_dict(),
                "content": m.content,
                "role": m.role,
                "collection": m.collection,
                "session_id": m.session_id or None,
                "created_at": m.created_at,
                "deleted": m.deleted,
                "deleted_at": m.deleted_at,
                "deleted_by": m.deleted_by,
            }
            for m in recall.memories
        ],
    }


def _write_json(entry: MemoryAuditEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "at": entry.at,
        "operation": entry.operation,
        "memory_id": entry.memory_id,
        "collection": entry.collection,
        "application_id": entry.application_id or None,
        "agent_id": entry.agent_id or None,
        "session_id": entry.session_id or None,
        "content_sha256": entry.content_sha256,
        "actor": entry.actor or None,
    }


def _fact_json(change: FactChange) -> dict[str, Any]:
    return {
        "id": change.id,
        "at": change.at,
        "namespace": change.namespace,
        "key": change.key,
        "old_value": change.old_value,
        "new_value": change.new_value,
        "application_id": change.application_id or None,
        "agent_id": change.agent_id or None,
        "session_id": change.session_id or None,
        "actor": change.actor or None,
    }


def _print_audit(
    user: str,
    session: str | None,
    recalls: list[Recall],
    writes: list[MemoryAuditEntry],
    facts: list[FactChange],
    more: dict[str, bool],
) -> None:
    whose = f"user {quoted_id(user)}" + (f", session {quoted_id(session)}" if session else "")
    print(f"RECALLS of {whose}, newest first")
    print_table(
        [
            "RECALL",
            "TIME",
            "COLLECTION",
            "SESSION",
            "REQUESTED_BY",
            "PROVIDER",
            "MODE",
            "RETURNED",
            "QUERY",
        ],
        [
            [
                r.id,
                r.at,
                shown_id(r.collection),
                shown_id(r.session_id),
                shown_id(r.requesting_session_id),
                shown_id(r.provider),
                r.mode,
                r.returned,
                clip(r.query_text, 60) if r.query_text else f"sha256:{r.query_sha256[:12]}",
            ]
            for r in recalls
        ],
    )
    print()
    print("MEMORIES EACH RECALL RETURNED (score: cosine similarity, BM25 or fused rank, per mode)")
    print_table(
        ["RECALL", "RANK", "SCORE", "SCORE_KIND", "REASON", "SIGNALS", "MEMORY", "CONTENT"],
        [
            [
                r.id,
                m.rank,
                m.score,
                score_kind(r.mode),
                m.reason or "",
                m.signals.summary() if m.signals else "",
                m.memory_id,
                m.content if not m.deleted else f"(deleted {shown_id(m.deleted_by) or ''})".strip(),
            ]
            for r in recalls
            for m in r.memories
        ],
    )
    print()
    print(f"MEMORY WRITES AND DELETES of {whose}, newest first")
    print_table(
        ["AUDIT", "TIME", "OPERATION", "COLLECTION", "SESSION", "MEMORY", "ACTOR"],
        [
            [
                w.id,
                w.at,
                w.operation,
                shown_id(w.collection),
                shown_id(w.session_id),
                w.memory_id,
                shown_id(w.actor),
            ]
            for w in writes
        ],
    )
    print()
    print(f"FACT CHANGES of {whose}, newest first")
    print_table(
        ["AUDIT", "TIME", "NAMESPACE", "KEY", "OLD", "NEW", "SESSION", "ACTOR"],
        [
            [
                f.id,
                f.at,
                f.namespace,
                f.key,
                _value(f.old_value),
                _value(f.new_value),
                shown_id(f.session_id),
                shown_id(f.actor),
            ]
            for f in facts
        ],
    )
    cut = [name.replace("_", " ") for name, flag in more.items() if flag]
    if cut:
        note(f"(older {', '.join(cut)} not shown: raise --limit, up to {MAX_LIMIT})")


def _value(value: object) -> str:
    return "-" if value is None else clip(dumps(value), 40)
