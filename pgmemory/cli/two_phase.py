"""``pgmemory two-phase COLLECTION``: how searches of a collection's large user scopes run.

It runs the probe a store runs by itself (:meth:`MemoryStore.probe_two_phase
<pgmemory.store.store.MemoryStore.probe_two_phase>`): each first pass the memories keep, measured
against the exact search on stored rows of the largest scopes, and the pass searches take. When
the binary codes miss the floor and the memories keep no half vectors, it names the command that
adds them (``pgmemory db half-vectors``). Reads only (no audit rows); prints counts and recalls,
never a user id.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import add_json, known_collection, print_json, print_table, with_store

if TYPE_CHECKING:
    from pgmemory.store.records import TwoPhaseStatus
    from pgmemory.store.store import MemoryStore


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``two-phase``.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    parser = commands.add_parser(
        "two-phase",
        parents=[common],
        help="measure how searches of a collection's large user scopes run (two-phase or "
        "exact), and why",
        description="Probe the two-phase path of COLLECTION now: every first pass the memories "
        "keep (binary codes; half vectors where `pgmemory db half-vectors` added them) is "
        "measured against the exact search on stored rows of its largest user scopes, and "
        "searches of those scopes take the cheapest pass at the recall floor, or stay exact. "
        "Reads only; prints no user id. See docs/scaling.md.",
    )
    parser.add_argument("collection", metavar="COLLECTION", help="the collection to probe")
    add_json(
        parser,
        '{"collection", "first_passes": [str], "first_pass": str|null, '
        '"recalls": {pass: float}, "recall_floor", "min_scope_rows", "large_scopes", '
        '"probed_scopes", "advice": str|null}',
    )
    parser.set_defaults(handler=two_phase_command)


def two_phase_command(args: argparse.Namespace) -> int:
    """``pgmemory two-phase COLLECTION [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status (0; the probe's verdict is in the output, not the status).
    """
    return with_store(args, _two_phase)


def advice(status: TwoPhaseStatus) -> str | None:
    """What an operator can do about the status, or None when nothing is to be done.

    Args:
        status: what the probe measured.

    Returns:
        One sentence naming the fix, when the large scopes stay exact and a first pass the
        schema does not keep yet could serve them.
    """
    if status.first_pass is None and status.recalls and "halves" not in status.first_passes:
        return (
            "the binary codes keep too few of these vectors' neighbours: `pgmemory db "
            "half-vectors` adds half vectors (every write pays for them; docs/scaling.md)"
        )
    return None


async def _two_phase(store: MemoryStore, args: argparse.Namespace) -> int:
    await known_collection(store, args.collection)
    status = await store.probe_two_phase(args.collection)
    hint = advice(status)
    if args.json:
        print_json({**status.as_dict(), "advice": hint})
        return 0
    print(
        f"{status.large_scopes} user scope(s) of more than {status.min_scope_rows:,} memories; "
        f"{status.probed_scopes} probed"
    )
    if status.recalls:
        print_table(
            ["FIRST PASS", "RECALL@10", "AT THE FLOOR"],
            [
                [p, f"{r:.4f}", "yes" if r >= status.recall_floor else "no"]
                for p, r in status.recalls.items()
            ],
        )
    elif not status.first_passes:
        print("the memories keep no first pass (pgvector < 0.7): every search is exact")
    verdict = status.first_pass or "none: they stay exact"
    print(f"first pass of large-scope searches: {verdict} (recall floor {status.recall_floor})")
    if hint:
        print(f"hint: {hint}")
    return 0
