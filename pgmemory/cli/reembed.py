"""``pgmemory db reembed``: re-embed a collection with another model (see
:mod:`pgmemory.admin.reembedding`), with progress on stderr."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import (
    add_json,
    admin_of,
    print_json,
    quoted_id,
    settings_of,
    with_store,
)

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore

#: The embedders ``--embedder`` can name (``PGMEMORY_EMBEDDER``'s choices).
EMBEDDERS = ("use", "minilm", "openai")


def add_reembed_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``db reembed``.

    Args:
        sub: the ``db`` sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    reembed = sub.add_parser(
        "reembed",
        parents=[common],
        help="re-embed a collection with another embedding model, then switch over",
        description="Embed every memory of COLLECTION with the embedder --embedder names "
        "(configured like PGMEMORY_EMBEDDER, e.g. PGMEMORY_OPENAI_EMBEDDING_MODEL for openai), "
        "in batches, beside the vectors searches keep using; then switch the whole collection "
        "to the new vectors and model in one transaction. Interrupted, it resumes where it "
        "stopped. Restart the application with the new embedder after the switch: processes "
        "still on the old one are refused within seconds.",
    )
    reembed.add_argument("collection", help="the collection to re-embed")
    reembed.add_argument("--embedder", required=True, choices=EMBEDDERS, help="the new model")
    reembed.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="N",
        help="memories embedded per batch (default: pgmemory.admin.reembedding.DEFAULT_BATCH)",
    )
    reembed.add_argument(
        "--no-switch",
        action="store_true",
        help="stage the new vectors only; run again without it to switch over",
    )
    reembed.add_argument(
        "--restart",
        action="store_true",
        help="drop vectors staged for another model instead of refusing",
    )
    add_json(
        reembed,
        '{"collection": str, "model": str, "dimensions": int, "embedded": int, "total": int, '
        '"switched": bool}',
    )
    reembed.set_defaults(handler=reembed_command)


def reembed_command(args: argparse.Namespace) -> int:
    """``pgmemory db reembed COLLECTION --embedder NAME [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    return with_store(args, _reembed)


async def _reembed(store: MemoryStore, args: argparse.Namespace) -> int:
    from pgmemory.embedders import make_embedder

    settings = settings_of(args).model_copy(update={"embedder": args.embedder})
    embedder = make_embedder(settings, cache=False)

    def progress(staged: int, total: int) -> None:
        print(f"\rembedded {staged:,}/{total:,}", end="", file=sys.stderr, flush=True)

    sized = {} if args.batch_size is None else {"batch_size": args.batch_size}
    done = await admin_of(store).reembed(
        args.collection,
        embedder,
        **sized,
        switch=not args.no_switch,
        restart=args.restart,
        progress=progress,
    )
    print(file=sys.stderr)
    if args.json:
        print_json(
            {
                "collection": done.collection,
                "model": done.model,
                "dimensions": done.dimensions,
                "embedded": done.embedded,
                "total": done.total,
                "switched": done.switched,
            }
        )
        return 0
    state = "switched to" if done.switched else "staged for"
    print(
        f"collection {quoted_id(done.collection)}: {done.embedded:,} memories embedded; {done.total:,} "
        f"memories {state} {done.model} ({done.dimensions} dimensions)"
    )
    return 0
