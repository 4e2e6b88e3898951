"""``pgmemory db``: the schema's migrations (alembic, version table ``pgmemory_alembic_version``)
and the least-privilege application role (``db roles``).

``upgrade`` and ``downgrade`` apply one revision at a time and print each as it is done
(``-> 0003 <what it does>``); an unknown revision is refused before anything runs, with the
list of valid ones.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, NamedTuple

from pgmemory.cli.common import (
    CliError,
    add_json,
    add_yes,
    admin_of,
    confirm,
    database_url,
    print_json,
    print_table,
    require_consent,
    settings_of,
    target,
    with_store,
)
from pgmemory.cli.reembed import add_reembed_parser

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

    from pgmemory.store.store import MemoryStore

_STEP_KEYS = '[{"revision": "0003", "message": str}]'
#: Where ``db roles`` reads the application role's password from by default.
PASSWORD_ENV = "PGMEMORY_APP_ROLE_PASSWORD"


class Step(NamedTuple):
    """One migration: its revision id and what it does (its docstring's first line)."""

    revision: str
    message: str

    def as_dict(self) -> dict[str, str]:
        """The step for ``--json``."""
        return {"revision": self.revision, "message": self.message}


def add_parsers(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add ``db`` and its sub-commands.

    Args:
        commands: the top-level sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    db = commands.add_parser(
        "db",
        help="schema management (alembic; version table pgmemory_alembic_version)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    sub = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")

    upgrade = sub.add_parser(
        "upgrade",
        parents=[common],
        help="apply the migrations up to REVISION (default: head)",
        description="Apply the migrations up to REVISION, printing each as it is applied "
        "(`-> 0003 <what it does>`). The first one runs CREATE EXTENSION vector (superuser, "
        "once per database).",
    )
    upgrade.add_argument(
        "revision",
        nargs="?",
        default="head",
        help="target revision: an id from `pgmemory db history`, or 'head' (default)",
    )
    add_json(upgrade, '{"from": "0001"|null, "to": "0003", "applied": ' + _STEP_KEYS + "}")
    upgrade.set_defaults(handler=upgrade_command)

    downgrade = sub.add_parser(
        "downgrade",
        parents=[common],
        help="revert the migrations down to REVISION ('base' removes every table: asks first)",
        description="Revert the migrations newer than REVISION, newest first, printing each "
        "(`<- 0003 <what it did>`). 'base' drops every pgmemory table and its data. Asks for "
        "confirmation on a terminal; needs --yes otherwise.",
    )
    downgrade.add_argument(
        "revision", help="target revision: an id from `pgmemory db history`, or 'base' (nothing)"
    )
    add_yes(downgrade)
    add_json(downgrade, '{"from": "0003"|null, "to": "0001"|null, "reverted": ' + _STEP_KEYS + "}")
    downgrade.set_defaults(handler=downgrade_command)

    current = sub.add_parser(
        "current", parents=[common], help="print the database's schema revision ('none': no schema)"
    )
    current.set_defaults(handler=current_command)

    heads = sub.add_parser("heads", help="print the newest revision this version of pgmemory ships")
    heads.set_defaults(handler=heads_command)

    roles = sub.add_parser(
        "roles",
        parents=[common],
        help="create (or reset) a least-privilege application role for pgmemory",
        description="Create, or reset, a login role the application connects as: it may read "
        "and write memories, chat history and facts, only INSERT and SELECT the audit tables, "
        "erase users and prune audits through pgmemory's functions, and create nothing (no "
        "DDL); it cannot read the per-user secrets. Run as the role that ran `pgmemory db "
        "upgrade` (the owner). The password is read from the environment variable named by "
        "--password-env, else asked for on a terminal; it is never echoed, and reaches the "
        "server only as a SCRAM-SHA-256 verifier. Migrations and enable_ann still need the "
        "owner.",
    )
    roles.add_argument("name", help="the role's name: 1-63 of a-z, 0-9 and _ (e.g. pgmemory_app)")
    roles.add_argument(
        "--password-env",
        default=PASSWORD_ENV,
        metavar="VAR",
        help=f"environment variable holding the role's password (default: {PASSWORD_ENV}); "
        "when unset, the password is asked for on a terminal",
    )
    add_json(
        roles,
        '{"role", "created": bool, "database", "schema", "statements": [str] (password '
        'masked), "warnings": [str]}',
    )
    roles.set_defaults(handler=roles_command)

    history = sub.add_parser(
        "history", help="list the revisions this version of pgmemory ships, oldest first"
    )
    add_json(history, '{"head": "0003", "revisions": ' + _STEP_KEYS + "}")
    history.set_defaults(handler=history_command)

    add_distribute_parser(sub, common)
    add_partition_parser(sub, common)
    add_half_vectors_parser(sub, common)
    add_reembed_parser(sub, common)


# --- revisions ------------------------------------------------------------------------------


def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    from pgmemory.store import migrate

    return ScriptDirectory.from_config(migrate.alembic_config())


def _steps_oldest_first(script: ScriptDirectory) -> list[Step]:
    return [Step(r.revision, _message(r.doc)) for r in reversed(list(script.walk_revisions()))]


def _message(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0].rstrip(".") if doc and doc.strip() else ""


def revisions_hint() -> str:
    """The valid revisions in words, for error messages.

    Returns:
        E.g. ``0001, 0002, 0003 (head); also 'head' and 'base' (see `pgmemory db history`,
        `pgmemory db heads`)``.
    """
    ids = [step.revision for step in _steps_oldest_first(_script())]
    listed = ", ".join([*ids[:-1], f"{ids[-1]} (head)"]) if ids else "none"
    return f"{listed}; also 'head' and 'base' (see `pgmemory db history`, `pgmemory db heads`)"


def _resolve(script: ScriptDirectory, revision: str) -> str | None:
    """The full id of ``revision`` (None for 'base'); an unknown one is a one-line error."""
    from alembic.util.exc import CommandError

    if revision == "base":
        return None
    try:
        found = script.get_revision(revision)
    except CommandError:
        found = None
    if found is None:
        raise CliError(f"unknown schema revision {revision!r}; valid: {revisions_hint()}", code=2)
    return found.revision


def _chain(script: ScriptDirectory, upper: str | None, lower: str | None) -> list[Step]:
    """The revisions above ``lower`` up to ``upper``, oldest first (None: base)."""
    if upper is None:
        return []
    between = script.iterate_revisions(upper, lower or "base")
    return [Step(r.revision, _message(r.doc)) for r in reversed(list(between))]


def _known_current(script: ScriptDirectory, current: str | None) -> str | None:
    """The database's revision, checked to be one this version ships."""
    from alembic.util.exc import CommandError

    if current is None:
        return None
    try:
        script.get_revision(current)
    except CommandError:
        raise CliError(
            f"the database's schema is at revision {current!r}, which this version of "
            f"pgmemory does not ship (it ships {revisions_hint()}): upgrade pgmemory, or use "
            "the version that migrated the database",
        ) from None
    return current


# --- commands -------------------------------------------------------------------------------


def upgrade_command(args: argparse.Namespace) -> int:
    """``pgmemory db upgrade [REVISION] [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    from pgmemory.store import migrate

    script = _script()
    wanted = _resolve(script, args.revision)
    with database_url(settings_of(args), args.url) as url:
        current = _known_current(script, migrate.current(url))
        below = _chain(script, current, None)
        if wanted is None or any(step.revision == wanted for step in below):
            plan: list[Step] = []  # already there or beyond: an upgrade never goes down
        else:
            plan = _chain(script, wanted, current)
        applied = []
        for step in plan:
            migrate.upgrade(url, step.revision)
            applied.append(step)
            if not args.json:
                print(f"-> {step.revision} {step.message}", flush=True)
        final = migrate.current(url)
    if args.json:
        print_json({"from": current, "to": final, "applied": [s.as_dict() for s in applied]})
    elif applied:
        print(f"pgmemory schema at {final}")
    else:
        print(f"pgmemory schema at {final} (nothing to apply)")
    return 0


def downgrade_command(args: argparse.Namespace) -> int:
    """``pgmemory db downgrade REVISION [--yes] [--json]``: asks first on a terminal.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    from pgmemory.cli.common import mask
    from pgmemory.store import migrate

    require_consent(args, "db downgrade drops pgmemory tables and their data")
    script = _script()
    wanted = _resolve(script, args.revision)
    with database_url(settings_of(args), args.url) as url:
        current = _known_current(script, migrate.current(url))
        if (
            wanted is not None
            and current is not None
            and not any(s.revision == wanted for s in _chain(script, current, None))
        ):
            raise CliError(
                f"revision {wanted} is newer than the database's {current}: "
                f"use `pgmemory db upgrade {wanted}`",
                code=2,
            )
        plan = list(reversed(_chain(script, current, wanted)))  # newest first
        if plan:
            undone = ", ".join(s.revision for s in plan)
            drop = " and DROPS every pgmemory table with all its data" if wanted is None else ""
            confirm(
                args,
                f"Downgrade the pgmemory schema of {mask(url)} from {current} to "
                f"{wanted or 'base'}? This reverts {undone}{drop}.",
            )
        reverted = []
        for step in plan:
            below = script.get_revision(step.revision)
            down = below.down_revision if below is not None else None
            migrate.downgrade(url, down if isinstance(down, str) else "base")
            reverted.append(step)
            if not args.json:
                print(f"<- {step.revision} {step.message}", flush=True)
        final = migrate.current(url)
    if args.json:
        print_json({"from": current, "to": final, "reverted": [s.as_dict() for s in reverted]})
    else:
        print(f"pgmemory schema at {final or 'base (no pgmemory tables)'}")
    return 0


def current_command(args: argparse.Namespace) -> int:
    """``pgmemory db current``: the database's revision, or ``none``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    from pgmemory.store import migrate

    with database_url(settings_of(args), args.url) as url:
        print(migrate.current(url) or "none")
    return 0


def heads_command(args: argparse.Namespace) -> int:
    """``pgmemory db heads``: the newest revision this version ships (no database needed).

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    from pgmemory.store import migrate

    print(migrate.head_revision())
    return 0


def history_command(args: argparse.Namespace) -> int:
    """``pgmemory db history [--json]``: the shipped revisions, oldest first.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    steps = _steps_oldest_first(_script())
    head = steps[-1].revision if steps else None
    if args.json:
        print_json({"head": head, "revisions": [s.as_dict() for s in steps]})
    else:
        print_table(
            ["REVISION", "HEAD", "MESSAGE"],
            [[s.revision, "head" if s.revision == head else "", s.message] for s in steps],
        )
    sys.stdout.flush()
    return 0


def roles_command(args: argparse.Namespace) -> int:
    """``pgmemory db roles NAME [--password-env VAR] [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    from pgmemory.admin.roles import check_role_name

    check_role_name(args.name)  # before asking for a password
    password = _password(args.password_env, args.name)
    return with_store(args, lambda store, a: _roles(store, a, password))


def _password(variable: str, role: str) -> str:
    """The password from ``variable``, else asked twice on a terminal (never echoed)."""
    import getpass
    import os

    value = os.environ.get(variable)
    if value:
        return value
    if not sys.stdin.isatty():
        raise CliError(
            f"no password: set the environment variable {variable} (or name another with "
            "--password-env), or run on a terminal to be asked",
            code=2,
        )
    first = getpass.getpass(f"password for role {role}: ")
    if getpass.getpass("again: ") != first:
        raise CliError("the two passwords differ; run the command again", code=2)
    return first


async def _roles(store: MemoryStore, args: argparse.Namespace, password: str) -> int:
    report = await admin_of(store).create_app_role(args.name, password)
    if args.json:
        print_json(report.as_dict())
        return 0
    verb = "created" if report.created else "reset (attributes, password, grants)"
    print(f"role {report.role} {verb} for database {report.database}, schema {report.schema}:")
    for statement in report.statements:
        print(f"  {statement}")
    for warning in report.warnings:
        print(f"warning: {warning}")
    print(_connect_as(store, report.role))
    return 0


def _connect_as(store: MemoryStore, role: str) -> str:
    """How the application connects as ``role``: the database's own URL with that user (the
    password a placeholder), and what that means on the embedded server."""
    from sqlalchemy.engine import make_url

    url = make_url(store.database.url).set(username=role, password="PASSWORD")
    line = (
        f"connect the application as {role}: PGMEMORY_DATABASE_URL="
        f"{url.render_as_string(hide_password=False)} (PASSWORD: the role's)"
    )
    if target.embedded is not None:
        line += (
            f" (this is the embedded server of {target.embedded}: it listens on that "
            "socket only while a pgmemory process runs it; an application that connects as "
            "another role needs a server of its own)"
        )
    return line


# --- distribute (Citus) ---------------------------------------------------------------------


def add_distribute_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``db distribute``.

    Args:
        sub: the ``db`` sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    distribute = sub.add_parser(
        "distribute",
        parents=[common],
        help="distribute the tables by user_id over Citus (needs the citus extension)",
        description="On a Citus coordinator: make pgmemory_collections a reference table and "
        "distribute every per-user table by user_id, co-located with pgmemory_memories "
        "(create_reference_table, create_distributed_table). Run after `pgmemory db upgrade`; "
        "tables Citus already manages are left as they are. Without the citus extension it "
        "says so and changes nothing.",
    )
    add_json(distribute, '{"distributed": [str], "reference": [str], "unchanged": [str]}')
    distribute.set_defaults(handler=distribute_command)


def distribute_command(args: argparse.Namespace) -> int:
    """``pgmemory db distribute [--json]``; without the citus extension, exit 1 (nothing changed).

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    return with_store(args, _distribute)


async def _distribute(store: MemoryStore, args: argparse.Namespace) -> int:
    from pgmemory.store import routing

    done = await admin_of(store).distribute()
    if args.json:
        print_json(
            {
                "distributed": done.distributed,
                "reference": done.reference,
                "unchanged": done.unchanged,
            }
        )
        return 0
    for table in done.reference:
        print(f"reference table: {table}")
    for table in done.distributed:
        print(f"distributed by {routing.DISTRIBUTION_COLUMN}: {table}")
    for table in done.unchanged:
        print(f"already managed by Citus: {table}")
    return 0


# --- partition (hash partitions of the memories table by user) -----------------------------


def add_partition_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``db partition``.

    Args:
        sub: the ``db`` sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    from pgmemory.admin.partitioning import MAX_PARTITIONS, MIN_PARTITIONS

    partition = sub.add_parser(
        "partition",
        parents=[common],
        help="hash-partition the EMPTY memories table by user_id (opt-in, for heavy users)",
        description="Replace the empty pgmemory_memories table by one hash-partitioned by "
        "user_id, keeping every column, default, key, foreign key and index, in one "
        "transaction under the migration lock. Run once, right after `pgmemory db upgrade` "
        "and before `pgmemory db roles`. Refused (nothing changed) when the table holds rows "
        "or is already partitioned. Large user scopes import and search faster, VACUUM "
        "ANALYZE is slower, and enable_ann is refused (see docs/scaling.md).",
    )
    partition.add_argument(
        "--partitions",
        type=int,
        default=16,
        metavar="N",
        help=f"number of hash partitions, {MIN_PARTITIONS}-{MAX_PARTITIONS} (default: 16)",
    )
    add_json(partition, '{"table": "pgmemory_memories", "partitions": 16, "key": "user_id"}')
    partition.set_defaults(handler=partition_command)


def partition_command(args: argparse.Namespace) -> int:
    """``pgmemory db partition [--partitions N] [--json]``.

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    from pgmemory.admin.partitioning import check_partitions

    check_partitions(args.partitions)  # before connecting
    return with_store(args, _partition)


async def _partition(store: MemoryStore, args: argparse.Namespace) -> int:
    report = await admin_of(store).partition_memories(partitions=args.partitions)
    if args.json:
        print_json(report.as_dict())
        return 0
    print(
        f"{report.table} is now hash-partitioned by {report.key} into {report.partitions} "
        f"partitions ({report.table}_p0 .. {report.table}_p{report.partitions - 1})"
    )
    return 0


# --- half vectors (a second first pass for large scopes) -------------------------------------


def add_half_vectors_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``db half-vectors``.

    Args:
        sub: the ``db`` sub-parsers.
        common: the parent parser of options every command takes (``--url``).
    """
    halves = sub.add_parser(
        "half-vectors",
        parents=[common],
        help="add half-precision vectors: large scopes whose binary codes fail search faster "
        "(opt-in; every write pays for them)",
        description="Add each memory's unit vector in half precision (a stored generated "
        "column) and its index, so that large user scopes of collections whose probe finds the "
        "binary codes below its recall floor are searched in two phases instead of exactly. "
        "Rewrites the memories table (a maintenance window on a large one); needs pgvector >= "
        "0.7; does nothing if they are there. See docs/scaling.md.",
    )
    add_yes(halves)
    add_json(halves, '{"added": true, "column": "embedding_half", "index": "..."}')
    halves.set_defaults(handler=half_vectors_command)


def half_vectors_command(args: argparse.Namespace) -> int:
    """``pgmemory db half-vectors [--yes] [--json]``: asks first on a terminal (every write
    pays for the half vectors from then on, and adding them rewrites the memories table).

    Args:
        args: the parsed command line.

    Returns:
        The exit status.
    """
    require_consent(args, _HALVES_COST)
    return with_store(args, _half_vectors)


#: What adding half vectors costs, for the confirmation.
_HALVES_COST = (
    "db half-vectors rewrites the memories table and makes every later write pay for the half "
    "vectors"
)


async def _half_vectors(store: MemoryStore, args: argparse.Namespace) -> int:
    if "halves" not in store.database.first_passes:
        confirm(
            args,
            "Add half vectors to every memory? It rewrites the memories table, and every later "
            "write pays for them.",
        )
    report = await admin_of(store).add_half_vectors()
    if args.json:
        print_json(report.as_dict())
        return 0
    print(
        f"added {report.column} and {report.index}: large scopes take the half vectors where "
        "their probe holds"
        if report.added
        else f"the memories keep half vectors already ({report.column}); nothing was changed"
    )
    return 0
