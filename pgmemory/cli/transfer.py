"""``export`` and ``import``: a user's memories in a collection as JSON Lines, exactly.

One line per memory, oldest first, with the keys of :data:`EXPORT_KEYS`: every stored field
(id, scope, role, content, provenance, times to the microsecond, metadata) and the embedding
(float32 values written exactly). ``import`` loads such a file with the store's bulk path
(``MemoryStore.import_records``: one transaction, every row audited), keeping the ids unless
``--new-ids``; the vectors are used as they are, so nothing is embedded again and the
collection must hold vectors of the same model and size.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from pgmemory.cli.common import (
    CliError,
    add_json,
    admin_of,
    dumps,
    known_collection,
    note,
    print_json,
    quoted_id,
    with_store,
)
from pgmemory.cli.listing import MEMORY_KEYS, memory_json
from pgmemory.errors import DuplicateIdError

if TYPE_CHECKING:
    import uuid

    from pgmemory.store.records import MemoryRecord
    from pgmemory.store.store import MemoryStore

#: Keys of one exported line.
EXPORT_KEYS = MEMORY_KEYS[:-1] + ', "embedding": [float, ...]}'
#: Memories read per page while exporting.
_PAGE = 200
#: Before any stored memory (the start of an oldest-first walk).
#: The embeddings of a page of a user's memories (read-only; parameterised).
_EMBEDDINGS = """
SELECT m.id, m.embedding
FROM pgmemory_memories AS m
WHERE m.user_id = :user_id AND m.collection = :collection AND m.id = ANY(:ids)
"""


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``export`` and ``import``.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    export = commands.add_parser(
        "export",
        parents=[common],
        help="write a user's memories in a collection as JSON Lines (exact, embeddings included)",
        description="Write a user's memories in a collection, oldest first, one JSON object "
        f"per line with the keys {EXPORT_KEYS}. `pgmemory import` loads it back exactly.",
    )
    export.add_argument("--user", required=True, help="the user whose memories to export")
    export.add_argument("--collection", required=True, help="the collection to export from")
    export.add_argument("--session", help="only this session's memories")
    export.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE (default: standard output)"
    )
    export.set_defaults(handler=lambda args: with_store(args, _export))

    load = commands.add_parser(
        "import",
        parents=[common],
        help="load a JSON Lines export into a collection (bulk path, one transaction, audited)",
        description="Load a file written by `pgmemory export` into a collection with the "
        "store's bulk path: one transaction (all rows or none), every row audited, a progress "
        "bar on a terminal. Ids, scopes, times, metadata and embeddings are kept as exported; a "
        "user's memory whose id is already stored is refused (use --new-ids to copy). A message "
        "already stored in the same scope is skipped.",
    )
    load.add_argument("file", metavar="FILE", help="the JSON Lines file ('-': standard input)")
    load.add_argument("--collection", required=True, help="the collection to load into")
    load.add_argument(
        "--create",
        action="store_true",
        help="create the collection if it does not exist (with the file's model and vector size)",
    )
    load.add_argument(
        "--new-ids",
        action="store_true",
        help="give every memory a new id (a copy) instead of keeping the exported ones",
    )
    load.add_argument(
        "--actor", default="cli", help="who writes, recorded in the audit (default: cli)"
    )
    add_json(load, '{"collection", "file", "read", "imported" (read minus skipped messages)}')
    load.set_defaults(handler=lambda args: with_store(args, _import))


# --- export ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _output(path: str | None) -> Iterator[IO[str]]:
    """Standard output, or a file that appears under ``path`` only once complete."""
    import os

    if path is None or path == "-":
        yield sys.stdout
        return
    partial = f"{path}.partial"
    try:
        with open(partial, "w", encoding="utf-8", newline="\n") as out:
            yield out
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)


async def _embeddings(
    store: MemoryStore, user_id: str, collection: str, ids: list[uuid.UUID]
) -> dict[uuid.UUID, list[float]]:
    from pgmemory.store._engine.clauses import clause

    async with store.database.read(user_id) as conn:
        rows = await conn.execute(
            clause(_EMBEDDINGS), {"user_id": user_id, "collection": collection, "ids": ids}
        )
        return {row.id: _floats(row.embedding) for row in rows}


def _floats(vector: Any) -> list[float]:
    """A stored vector's float32 values as Python floats (exact: float32 fits a double)."""
    for method in ("to_list", "tolist"):  # pgvector's Vector, a numpy array
        if hasattr(vector, method):
            return list(getattr(vector, method)())
    return [float(x) for x in vector]


async def _export(store: MemoryStore, args: argparse.Namespace) -> int:
    import uuid

    from pgmemory.admin.pages import Cursor
    from pgmemory.store.reads import DISTANT_PAST

    await known_collection(store, args.collection)
    cursor = Cursor(DISTANT_PAST, uuid.UUID(int=0))
    count = 0
    with _output(args.output) as out:
        while True:
            page = await admin_of(store).user_memories(
                args.user, args.collection, session_id=args.session, after=cursor, limit=_PAGE
            )
            oldest_first = page.items[::-1]
            if oldest_first:
                vectors = await _embeddings(
                    store, args.user, args.collection, [m.id for m in oldest_first]
                )
                for memory in oldest_first:
                    line = memory_json(memory)
                    line["embedding"] = vectors[memory.id]
                    out.write(dumps(line) + "\n")
                count += len(oldest_first)
            if page.newer is None:
                break
            cursor = page.newer
    where = args.output if args.output not in (None, "-") else "standard output"
    note(
        f"exported {count} memories of user {quoted_id(args.user)} from "
        f"{quoted_id(args.collection)} to {where}"
    )
    return 0


# --- import ---------------------------------------------------------------------------------


def _time(value: object, where: str, key: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise CliError(f"{where}: {key} is not an ISO 8601 time with a UTC offset", code=2)
    return parsed


def _record(line: str, where: str, *, new_ids: bool) -> tuple[MemoryRecord, str | None]:
    """One exported line as a record, and the embedding model it names."""
    import uuid

    from pgmemory.errors import InvalidInputError
    from pgmemory.store.records import MemoryRecord, MemoryScope

    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CliError(
            f"{where}: not JSON ({exc.msg}); expected a `pgmemory export` line", code=2
        ) from None
    if not isinstance(data, dict) or "content" not in data or "scope" not in data:
        raise CliError(f"{where}: expected a JSON object with the keys {EXPORT_KEYS}", code=2)
    try:
        record = MemoryRecord(
            id=None if new_ids or data.get("id") is None else uuid.UUID(str(data["id"])),
            content=data["content"],
            scope=MemoryScope.from_dict(data["scope"] or {}),
            role=data.get("role", "user"),
            author_name=data.get("author_name"),
            message_id=data.get("message_id"),
            source_type=data.get("source_type", "external"),
            source_id=data.get("source_id"),
            embedding=data.get("embedding"),
            created_at=_time(data.get("created_at"), where, "created_at"),
            expires_at=_time(data.get("expires_at"), where, "expires_at"),
            metadata=data.get("metadata") or {},
        )
    except (InvalidInputError, ValueError, TypeError) as exc:
        raise CliError(f"{where}: {exc}", code=2) from None
    model = data.get("embedding_model")
    return record, model if isinstance(model, str) else None


def _lines(source: IO[str], name: str) -> Iterator[tuple[str, str]]:
    for number, line in enumerate(source, 1):
        if line.strip():
            yield f"{name}:{number}", line


async def _import(store: MemoryStore, args: argparse.Namespace) -> int:
    from pathlib import Path

    from pgmemory.errors import CollectionError

    name = "<stdin>" if args.file == "-" else args.file
    if args.file != "-" and not Path(args.file).is_file():
        raise CliError(f"no such file: {args.file}", code=2)
    source: IO[str] = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
    try:
        lines = _lines(source, name)
        first = next(lines, None)
        if first is None:
            raise CliError(f"{name} holds no memories", code=2)
        record, model = _record(first[1], first[0], new_ids=args.new_ids)
        created = False
        try:
            info = await store.get_collection(args.collection)
        except CollectionError:
            if not args.create:
                await known_collection(  # lists the existing ones
                    store, args.collection, hint="; or pass --create to create it"
                )
                raise
            if record.embedding is None or model is None:
                raise CliError(
                    f"{first[0]}: no embedding to size a new collection by", code=2
                ) from None
            info = await store.create_collection(
                args.collection, dimensions=len(record.embedding), embedding_model=model
            )
            created = True
        read = 0

        def records() -> Iterator[MemoryRecord]:
            nonlocal read
            current: tuple[MemoryRecord, str | None] | None = (record, model)
            where = first[0]
            while current is not None:
                rec, rec_model = current
                if rec_model is not None and rec_model != info.embedding_model:
                    raise CliError(
                        f"{where}: the memory was embedded with {rec_model!r}, but collection "
                        f"{quoted_id(info.name)} holds {info.embedding_model!r} vectors, which are not "
                        "comparable: import into a collection of that model (--create makes one)",
                        code=2,
                    )
                read += 1
                yield rec
                nxt = next(lines, None)
                if nxt is None:
                    current = None
                else:
                    where = nxt[0]
                    current = _record(nxt[1], where, new_ids=args.new_ids)

        try:
            imported = await store.import_records(
                info.name, records(), actor=args.actor, progress=sys.stderr.isatty()
            )
        except BaseException as failed:
            # The import is one transaction, undone: a collection --create made for it goes too,
            # so that "nothing was stored" holds and a corrected rerun starts from the same place.
            if created:
                with contextlib.suppress(Exception):
                    await store.drop_collection(info.name, actor=args.actor)
            if isinstance(failed, DuplicateIdError):
                raise CliError(
                    f"memory {failed.memory_id} of this file is already stored under its id for "
                    "the same user, or given twice (the import was undone, nothing was stored"
                    f"{', nor the collection --create made' if created else ''}): pass "
                    "--new-ids to import copies, or delete the originals first",
                    code=1,
                ) from None
            raise
    finally:
        if source is not sys.stdin:
            source.close()
    if args.json:
        print_json({"collection": info.name, "file": name, "read": read, "imported": imported})
    else:
        skipped = read - imported
        extra = f" ({skipped} skipped: their messages were already stored)" if skipped else ""
        print(f"imported {imported} of {read} memories into {quoted_id(info.name)}{extra}")
    return 0
