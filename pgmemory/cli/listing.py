"""Looking at what is stored: ``collections``, ``users``, ``memories``, ``sessions``, ``audit``
and ``recall``.

Each prints a table with a header row, or with ``--json`` ONE JSON document whose keys are
listed in the command's help and do not change. Times are UTC; in JSON they are ISO 8601 with
microseconds. Lists are bounded (``--limit``, at most 200 rows); ``pgmemory export`` writes a
whole scope.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgmemory.cli import audit as audit_cli
from pgmemory.cli.common import (
    MAX_LIMIT,
    CliError,
    add_json,
    admin_of,
    clip,
    known_collection,
    limit_type,
    note,
    print_json,
    print_table,
    with_store,
)
from pgmemory.store.modes import DEFAULT_MODE, MODES, SEARCH_MODES, score_kind, scores_help

if TYPE_CHECKING:
    from pgmemory.admin.facts import FactChange
    from pgmemory.admin.memories import MemoryAuditEntry
    from pgmemory.admin.recalls import Recall
    from pgmemory.store.records import Memory, MemoryScope
    from pgmemory.store.store import MemoryStore

#: Keys of a memory in JSON output (``pgmemory export`` adds ``embedding``).
MEMORY_KEYS = (
    '{"id", "collection", "scope": {"application_id", "agent_id", "user_id", "session_id"}, '
    '"role", "content", "author_name", "message_id", "source_type", "source_id", '
    '"embedding_model", "created_at", "expires_at", "metadata"}'
)
#: Pages of a user's audit read at most when ``audit --session`` filters them.
_SCAN_PAGES = 25


def memory_json(memory: Memory) -> dict[str, Any]:
    """A memory as JSON-native values, with the keys of :data:`MEMORY_KEYS`.

    Args:
        memory: the memory.

    Returns:
        The document (times and ids still as objects; :func:`pgmemory.cli.common.dumps` writes
        them).
    """
    return {
        "id": memory.id,
        "collection": memory.collection,
        "scope": memory.scope.to_dict(),
        "role": memory.role,
        "content": memory.content,
        "author_name": memory.author_name,
        "message_id": memory.message_id,
        "source_type": memory.source_type,
        "source_id": memory.source_id,
        "embedding_model": memory.embedding_model,
        "created_at": memory.created_at,
        "expires_at": memory.expires_at,
        "metadata": memory.metadata,
    }


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add the listing commands.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    collections = commands.add_parser(
        "collections", parents=[common], help="list collections (name, vector size, model)"
    )
    add_json(
        collections,
        '{"collections": [{"name", "dimensions", "embedding_model", "created_at"}]}',
    )
    collections.set_defaults(handler=lambda args: with_store(args, _collections))

    users = commands.add_parser(
        "users", parents=[common],
        help="list users found in any table, in id order, with memory and recall counts",
    )  # fmt: skip
    users.add_argument("--after", default="", help="start after this user id (to page on)")
    users.add_argument(
        "--limit", type=limit_type, default=50, help=f"users to list (1-{MAX_LIMIT}, default 50)"
    )
    add_json(
        users,
        '{"users": [{"user_id", "memories": {collection: count}, "total_memories", "recalls", '
        '"last_activity"}], "next_after": user_id|null (pass as --after for the next page)}',
    )
    users.set_defaults(handler=lambda args: with_store(args, _users))

    memories = commands.add_parser(
        "memories", parents=[common],
        help="list a user's memories, newest first (one collection, or all)",
        description="List a user's stored memories, newest first. Expired memories that "
        "`expire` has not reclaimed yet are listed too (searches skip them).",
    )  # fmt: skip
    memories.add_argument("--user", required=True, help="the user id")
    memories.add_argument("--collection", help="only this collection (default: every collection)")
    memories.add_argument("--session", help="only this session's memories")
    memories.add_argument(
        "--limit", type=limit_type, default=20,
        help=f"memories to list (1-{MAX_LIMIT}, default 20); `pgmemory export` writes them all",
    )  # fmt: skip
    add_json(
        memories,
        '{"user_id", "collection": name|null, "session_id": id|null, "memories": ['
        + MEMORY_KEYS
        + '], "more": true when more memories exist than listed}',
    )
    memories.set_defaults(handler=lambda args: with_store(args, _memories))

    sessions = commands.add_parser(
        "sessions", parents=[common],
        help="list a user's sessions (chat history messages and memories per session)",
    )  # fmt: skip
    sessions.add_argument("--user", required=True, help="the user id")
    sessions.add_argument(
        "--limit", type=limit_type, default=50, help=f"sessions to list (1-{MAX_LIMIT}, default 50)"
    )
    add_json(
        sessions,
        '{"user_id", "sessions": [{"session_id", "messages" (chat history), "memories", '
        '"first_at", "last_at"}]} (most recently active first)',
    )
    sessions.set_defaults(handler=lambda args: with_store(args, _sessions))

    audit = commands.add_parser(
        "audit", parents=[common],
        help="a user's (or one session's) recalls with the memories each returned, and the "
        "writes and deletes of their memories and facts",
        description="Show the audit of a user, newest first: each recall (which memories went "
        "into an answer, with their scores), then the writes, deletes and expiries of memories, "
        "then fact changes. " + scores_help() + ".",
    )  # fmt: skip
    audit.add_argument("--user", help="the user id (required unless a sub-command is given)")
    audit.add_argument(
        "--session",
        help="only this session: recalls of it or requested from it, writes and facts in it",
    )
    audit.add_argument(
        "--limit", type=limit_type, default=20,
        help=f"entries per section (1-{MAX_LIMIT}, default 20)",
    )  # fmt: skip
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
    # `pgmemory audit verify` (cli/audit.py); without a sub-command, the user's audit above.
    actions = audit.add_subparsers(dest="audit_command", metavar="verify")
    audit_cli.add_verify(actions, common)

    recall = commands.add_parser(
        "recall", parents=[common],
        help="search a scope's memories, best first (audited as provider 'cli')",
        description="MemoryStore.search, tool calls too; audited. " + scores_help() + ".",
    )  # fmt: skip
    recall.add_argument("collection", help="the collection to search")
    recall.add_argument("query", help="the text to search for")
    recall.add_argument("--user", help="scope: only this user's memories")
    recall.add_argument("--session", help="scope: only this session's memories")
    recall.add_argument("--agent", help="scope: only this agent's memories")
    recall.add_argument("--application", help="scope: only this application's memories")
    recall.add_argument(
        "--limit", type=limit_type, default=5, help=f"most hits (1-{MAX_LIMIT}, default 5)"
    )
    recall.add_argument(
        "--mode", choices=SEARCH_MODES, default=DEFAULT_MODE,
        help="vector: cosine similarity of embeddings; text: BM25 keyword match; hybrid "
        "(default): both fused, each scaled to 0..1 within the scope and summed",
    )  # fmt: skip
    add_json(
        recall,
        '{"collection", "query", "mode", "score_kind": "cosine similarity"|"BM25"|'
        '"fused score", "hits": [{"rank", "score", "memory": ' + MEMORY_KEYS + "}]}",
    )
    recall.set_defaults(handler=lambda args: with_store(args, _recall))


async def _collections(store: MemoryStore, args: argparse.Namespace) -> int:
    infos = await store.list_collections()
    if args.json:
        print_json(
            {
                "collections": [
                    {
                        "name": i.name,
                        "dimensions": i.dimensions,
                        "embedding_model": i.embedding_model,
                        "created_at": i.created_at,
                    }
                    for i in infos
                ]
            }
        )
    else:
        print_table(
            ["NAME", "DIMENSIONS", "MODEL", "CREATED"],
            [[i.name, i.dimensions, i.embedding_model, i.created_at] for i in infos],
        )
    return 0


async def _users(store: MemoryStore, args: argparse.Namespace) -> int:
    page = await admin_of(store).list_users(after=args.after, limit=args.limit)
    if args.json:
        print_json(
            {
                "users": [
                    {
                        "user_id": u.user_id,
                        "memories": u.memories,
                        "total_memories": u.total_memories,
                        "recalls": u.recalls,
                        "last_activity": u.last_activity,
                    }
                    for u in page.users
                ],
                "next_after": page.next_after,
            }
        )
        return 0
    print_table(
        ["USER", "MEMORIES", "RECALLS", "LAST_ACTIVITY", "PER_COLLECTION"],
        [
            [
                u.user_id, u.total_memories, u.recalls, u.last_activity,
                ", ".join(f"{name}:{count}" for name, count in sorted(u.memories.items())),
            ]
            for u in page.users
        ],
    )  # fmt: skip
    if page.next_after is not None:
        note(f"(more users: pgmemory users --after {page.next_after!r})")
    return 0


async def _memories(store: MemoryStore, args: argparse.Namespace) -> int:
    if args.collection is not None:
        await known_collection(store, args.collection)
        names = [args.collection]
    else:
        names = [info.name for info in await store.list_collections()]
    found: list[Memory] = []
    more = False
    for name in names:
        page = await admin_of(store).user_memories(
            args.user, name, session_id=args.session, limit=args.limit
        )
        found.extend(page.items)
        more = more or page.older is not None
    found.sort(key=lambda m: (m.created_at, m.id), reverse=True)
    more = more or len(found) > args.limit
    found = found[: args.limit]
    if args.json:
        print_json(
            {
                "user_id": args.user,
                "collection": args.collection,
                "session_id": args.session,
                "memories": [memory_json(m) for m in found],
                "more": more,
            }
        )
        return 0
    if not found:  # not a bare header: where to look next (the id typed is not echoed)
        note("no memories of that user here; `pgmemory users` lists the users found")
        return 0
    print_table(
        ["CREATED", "COLLECTION", "SESSION", "ROLE", "ID", "CONTENT"],
        [[m.created_at, m.collection, m.scope.session_id, m.role, m.id, m.content] for m in found],
    )
    if more:
        note(f"(more memories: raise --limit (up to {MAX_LIMIT}), or `pgmemory export` them all)")
    return 0


async def _sessions(store: MemoryStore, args: argparse.Namespace) -> int:
    rows: dict[str, dict[str, Any]] = {}

    def entry(session_id: str) -> dict[str, Any]:
        return rows.setdefault(
            session_id,
            {
                "session_id": session_id,
                "messages": 0,
                "memories": 0,
                "first_at": None,
                "last_at": None,
            },
        )

    def span(row: dict[str, Any], first: datetime, last: datetime) -> None:
        row["first_at"] = first if row["first_at"] is None else min(row["first_at"], first)
        row["last_at"] = last if row["last_at"] is None else max(row["last_at"], last)

    for chat in await admin_of(store).user_sessions(args.user, limit=args.limit):
        row = entry(chat.session_id)
        row["messages"] += chat.messages
        span(row, chat.first_at, chat.last_at)
    for scope in await admin_of(store).user_scopes(args.user, limit=MAX_LIMIT):
        if scope.session_id:
            row = entry(scope.session_id)
            row["memories"] += scope.memories
            span(row, scope.first_at, scope.last_at)
    listed = sorted(rows.values(), key=lambda r: (r["last_at"], r["session_id"]), reverse=True)
    listed = listed[: args.limit]
    if args.json:
        print_json({"user_id": args.user, "sessions": listed})
    else:
        print_table(
            ["SESSION", "MESSAGES", "MEMORIES", "FIRST", "LAST"],
            [
                [r["session_id"], r["messages"], r["memories"], r["first_at"], r["last_at"]]
                for r in listed
            ],
        )
    return 0


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
    whose = f"user {user!r}" + (f", session {session!r}" if session else "")
    print(f"RECALLS of {whose}, newest first")
    print_table(
        ["RECALL", "TIME", "COLLECTION", "SESSION", "REQUESTED_BY", "PROVIDER", "MODE",
         "RETURNED", "QUERY"],
        [
            [
                r.id, r.at, r.collection, r.session_id, r.requesting_session_id, r.provider,
                r.mode, r.returned,
                clip(r.query_text, 60) if r.query_text else f"sha256:{r.query_sha256[:12]}",
            ]
            for r in recalls
        ],
    )  # fmt: skip
    print()
    print("MEMORIES EACH RECALL RETURNED (score: cosine similarity, BM25 or fused rank, per mode)")
    print_table(
        ["RECALL", "RANK", "SCORE", "SCORE_KIND", "REASON", "SIGNALS", "MEMORY", "CONTENT"],
        [
            [
                r.id, m.rank, m.score, score_kind(r.mode), m.reason or "",
                m.signals.summary() if m.signals else "", m.memory_id,
                m.content if not m.deleted else f"(deleted {m.deleted_by or ''})".strip(),
            ]
            for r in recalls
            for m in r.memories
        ],
    )  # fmt: skip
    print()
    print(f"MEMORY WRITES AND DELETES of {whose}, newest first")
    print_table(
        ["AUDIT", "TIME", "OPERATION", "COLLECTION", "SESSION", "MEMORY", "ACTOR"],
        [
            [w.id, w.at, w.operation, w.collection, w.session_id, w.memory_id, w.actor]
            for w in writes
        ],
    )
    print()
    print(f"FACT CHANGES of {whose}, newest first")
    print_table(
        ["AUDIT", "TIME", "NAMESPACE", "KEY", "OLD", "NEW", "SESSION", "ACTOR"],
        [
            [f.id, f.at, f.namespace, f.key, _value(f.old_value), _value(f.new_value),
             f.session_id, f.actor]
            for f in facts
        ],
    )  # fmt: skip
    cut = [name.replace("_", " ") for name, flag in more.items() if flag]
    if cut:
        note(f"(older {', '.join(cut)} not shown: raise --limit, up to {MAX_LIMIT})")


def _value(value: object) -> str:
    from pgmemory.cli.common import dumps

    return "-" if value is None else clip(dumps(value), 40)


async def _recall(store: MemoryStore, args: argparse.Namespace) -> int:
    from pgmemory.store.records import MemoryScope, RecallTrace

    await known_collection(store, args.collection)
    scope: MemoryScope = MemoryScope(
        user_id=args.user,
        session_id=args.session,
        agent_id=args.agent,
        application_id=args.application,
    )
    hits = await store.search(
        args.collection, scope, query=args.query, limit=args.limit, mode=args.mode,
        trace=RecallTrace(provider="cli", mode=args.mode),
    )  # fmt: skip
    if args.json:
        print_json(
            {
                "collection": args.collection,
                "query": args.query,
                "mode": args.mode,
                "score_kind": score_kind(args.mode),
                "hits": [
                    {"rank": rank, "score": hit.score, "memory": memory_json(hit.memory)}
                    for rank, hit in enumerate(hits, 1)
                ],
            }
        )
        return 0
    print_table(
        ["RANK", MODES[args.mode].title, "CREATED", "ROLE", "ID", "CONTENT"],
        [
            [rank, hit.score, m.created_at, m.role, m.id, m.content]
            for rank, hit in enumerate(hits, 1)
            for m in (hit.memory,)
        ],
    )
    return 0


__all__ = ["MEMORY_KEYS", "add_parsers", "memory_json"]
