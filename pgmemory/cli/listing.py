"""Looking at what is stored: ``collections``, ``users``, ``memories``, ``sessions`` and
``recall`` (and ``audit``, whose parser and output are :mod:`pgmemory.cli.audit`'s).

Each prints a table with a header row, or with ``--json`` ONE JSON document whose keys are
listed in the command's help and do not change. Times are UTC; in JSON they are ISO 8601 with
microseconds. Lists are bounded (``--limit``, at most 200 rows); ``pgmemory export`` writes a
whole scope.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgmemory.cli import audit as audit_cli
from pgmemory.cli.common import (
    MAX_LIMIT,
    Verbatim,
    add_json,
    admin_of,
    known_collection,
    limit_type,
    note,
    print_json,
    print_table,
    shown_id,
    with_store,
)
from pgmemory.store.modes import DEFAULT_MODE, MODES, SEARCH_MODES, score_kind, scores_help

if TYPE_CHECKING:
    from pgmemory.store.records import Memory, MemoryScope
    from pgmemory.store.store import MemoryStore

#: Keys of a memory in JSON output (``pgmemory export`` adds ``embedding``).
MEMORY_KEYS = (
    '{"id", "collection", "scope": {"application_id", "agent_id", "user_id", "session_id"}, '
    '"role", "content", "author_name", "message_id", "source_type", "source_id", '
    '"embedding_model", "created_at", "expires_at", "metadata"}'
)


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
        "users",
        parents=[common],
        help="list users found in any table, in id order, with memory and recall counts",
    )
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
        "memories",
        parents=[common],
        help="list a user's memories, newest first (one collection, or all)",
        description="List a user's stored memories, newest first. Expired memories that "
        "`expire` has not reclaimed yet are listed too (searches skip them).",
    )
    memories.add_argument("--user", required=True, help="the user id")
    memories.add_argument("--collection", help="only this collection (default: every collection)")
    memories.add_argument("--session", help="only this session's memories")
    memories.add_argument(
        "--limit",
        type=limit_type,
        default=20,
        help=f"memories to list (1-{MAX_LIMIT}, default 20); `pgmemory export` writes them all",
    )
    add_json(
        memories,
        '{"user_id", "collection": name|null, "session_id": id|null, "memories": ['
        + MEMORY_KEYS
        + '], "more": true when more memories exist than listed}',
    )
    memories.set_defaults(handler=lambda args: with_store(args, _memories))

    sessions = commands.add_parser(
        "sessions",
        parents=[common],
        help="list a user's sessions (chat history messages and memories per session)",
    )
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

    audit_cli.add_parser(commands, common)

    recall = commands.add_parser(
        "recall",
        parents=[common],
        help="search a scope's memories, best first (audited as provider 'cli')",
        description="MemoryStore.search, tool calls too; audited. " + scores_help() + ".",
    )
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
        "--mode",
        choices=SEARCH_MODES,
        default=DEFAULT_MODE,
        help="vector: cosine similarity of embeddings; text: BM25 keyword match; hybrid "
        "(default): both fused, each scaled to 0..1 within the scope and summed",
    )
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
            [[shown_id(i.name), i.dimensions, i.embedding_model, i.created_at] for i in infos],
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
                shown_id(u.user_id),
                u.total_memories,
                u.recalls,
                u.last_activity,
                Verbatim(
                    ", ".join(
                        f"{shown_id(name)}:{count}" for name, count in sorted(u.memories.items())
                    )
                ),
            ]
            for u in page.users
        ],
    )
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
        [
            [
                m.created_at,
                shown_id(m.collection),
                shown_id(m.scope.session_id),
                m.role,
                m.id,
                m.content,
            ]
            for m in found
        ],
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
                [
                    shown_id(r["session_id"]),
                    r["messages"],
                    r["memories"],
                    r["first_at"],
                    r["last_at"],
                ]
                for r in listed
            ],
        )
    return 0


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
        args.collection,
        scope,
        query=args.query,
        limit=args.limit,
        mode=args.mode,
        trace=RecallTrace(provider="cli", mode=args.mode),
    )
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
