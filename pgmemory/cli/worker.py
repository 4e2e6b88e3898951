"""``pgmemory worker``: extract queued facts off the turn path, in a process of its own.

``--app module:factory`` names the application's function that builds its fact providers from
an open store (the same providers the agents use, with ``extraction="queued"``)::

    def fact_providers(store):
        client = OpenAIChatCompletionClient(model="gpt-4o-mini")
        return [FactMemoryProvider(store, client, UserInfo, user_id=current_user,
                                   extraction="queued", profile=True)]

The worker is :class:`pgmemory.integrations.agent_framework.FactWorker`; ``--once`` processes
what is due and exits (with ``--json``, a document of what it did).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgmemory.cli.common import CliError, add_json, print_json, with_store

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``worker``.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    worker = commands.add_parser(
        "worker",
        parents=[common],
        help="extract queued facts (FactMemoryProvider(..., extraction='queued')) until stopped",
        description="Lease due fact jobs from the queue, extract them with the application's "
        "providers (one model call per user and scope) and write the facts, each change "
        "audited with the messages it came from. Runs until interrupted, or --once.",
    )
    worker.add_argument(
        "--app",
        required=True,
        metavar="MODULE:FACTORY",
        help="the application's function that takes the open MemoryStore and returns its "
        "FactMemoryProvider(s), e.g. myapp.memory:fact_providers",
    )
    worker.add_argument("--once", action="store_true", help="process what is due, then exit")
    worker.add_argument(
        "--keep-failed-days",
        type=float,
        default=None,
        help="days a job that used up its attempts is kept, with its messages, before the "
        "worker drops it (default: FactWorker's, a week)",
    )
    worker.add_argument(
        "--poll", type=float, default=1.0, help="seconds to wait when nothing is due (default 1)"
    )
    add_json(worker, '{"jobs_done", "pending"} (with --once)')
    worker.set_defaults(handler=run)


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable ``module:attribute`` names (the module imported from ``sys.path``)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CliError(f"--app {spec!r} is not MODULE:FACTORY, e.g. myapp.memory:fact_providers", 2)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(
            f"--app: cannot import {module_name!r} ({exc.__class__.__name__})", 2
        ) from None
    factory: Callable[..., Any] | None = getattr(module, attribute, None)
    if not callable(factory):
        raise CliError(f"--app: {module_name} has no callable {attribute!r}", 2)
    return factory


def run(args: argparse.Namespace) -> int:
    """Run the worker (until interrupted, or ``--once``)."""
    if args.poll <= 0:
        raise CliError(f"--poll must be a positive number of seconds, got {args.poll}", 2)
    if args.keep_failed_days is not None and not args.keep_failed_days >= 0:
        raise CliError(
            f"--keep-failed-days must be a number of days, 0 or more, got {args.keep_failed_days:g}",
            2,
        )
    if "" not in sys.path:
        sys.path.insert(0, "")  # the application's modules, as `python -m` finds them
    factory = load_factory(args.app)
    with_store(args, lambda store, args: _work(store, args, factory))
    return 0


async def _work(store: MemoryStore, args: argparse.Namespace, factory: Callable[..., Any]) -> None:
    from pgmemory.integrations.agent_framework import FactMemoryProvider, FactWorker

    built = factory(store)
    providers = [built] if isinstance(built, FactMemoryProvider) else list(built or ())
    keep = {} if args.keep_failed_days is None else {"keep_failed_s": args.keep_failed_days * 86400}
    worker = FactWorker(providers, poll_s=args.poll, **keep)
    names = ", ".join(worker.providers)
    if args.once:
        dropped = await worker.sweep()
        done = await worker.run_once()
        pending = await worker.queue.pending(list(worker.providers))
        if args.json:
            print_json({"jobs_done": done, "pending": pending, "failed_dropped": dropped})
        else:
            print(
                f"pgmemory worker: {done} job(s) done for {names}; {pending} pending; "
                f"{dropped} failed job(s) dropped"
            )
        return
    print(f"pgmemory worker: serving {names} (Ctrl-C stops)", file=sys.stderr, flush=True)
    await worker.run()
