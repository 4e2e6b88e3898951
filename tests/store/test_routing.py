"""Citus readiness, checked: every statement names one user or is a listed fan-out; every key of
a per-user table holds user_id; `pgmemory db distribute` says clearly when Citus is absent."""

from __future__ import annotations

import ast
import asyncio
import functools
import inspect
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import get_args

import pytest
import sqlalchemy as sa

from pgmemory import MemoryStore
from pgmemory.admin import Admin, statements as s
from pgmemory.cli import run
from pgmemory.errors import DatabaseNotReadyError
from pgmemory.store import queries as q, routing
from pgmemory.store._engine.statement import (
    REGISTRY,
    Registered,
    Statement,
    is_builder,
    registered,
)
from pgmemory.store._ranking import recall as ranking_recall, search as ranking_search
from pgmemory.store._ranking.candidates import FirstPass
from pgmemory.store.models import Base
from pgmemory.store.modes import FUSIONS, SEARCH_MODES
from pgmemory.store.records import MemoryScope

DIMENSION_SETS = [
    combo
    for size in range(1, len(MemoryScope.DIMENSIONS) + 1)
    for combo in itertools.combinations(MemoryScope.DIMENSIONS, size)
]


@functools.cache
def _variants(builder: str) -> tuple[tuple[tuple[str, ...], str], ...]:
    """Every statement a builder makes, with the scope dimensions it was made for (made once
    per test session: the routing and wire tests share them)."""
    return tuple(_made(builder))


def _made(builder: str) -> Iterator[tuple[tuple[str, ...], str]]:
    if builder in ("audit_row_check", "audit_guard_probe"):
        for table in s.AUDIT_TABLES:
            yield (), getattr(s, builder)(table)
        return
    if builder == "record_recall":
        for relax in (True, False):
            yield ("user_id",), q.record_recall(relax_commit=relax)
        return
    for dims in DIMENSION_SETS:
        if builder == "search_memories":
            for (
                covering,
                audit,
                mode,
                fusion,
                ann,
                shortlist,
                relax,
                windowed,
                distributed,
                guarded,
                explain,
            ) in itertools.product(
                (True, False),
                (True, False),
                SEARCH_MODES,
                FUSIONS,
                (None, 384),
                (None, *get_args(FirstPass)),
                (True, False),
                (True, False),
                (True, False),
                (True, False),
                (True, False),
            ):
                if (ann is not None or shortlist is not None) and mode != "vector":
                    continue  # the approximate and two-phase paths serve vector searches only
                if ann is not None and shortlist is not None:
                    continue  # a search takes one of them
                if guarded and not (audit and "user_id" in dims):
                    continue  # the guard is an audited read's of one user
                neighbourly = (False, True) if mode == "hybrid" and fusion == "score" else (False,)
                for neighbours in neighbourly:
                    yield (
                        dims,
                        ranking_search.search_memories(
                            dims,
                            covering=covering,
                            audit=audit,
                            mode=mode,
                            fusion=fusion,
                            neighbours=neighbours,
                            ann_dimensions=ann,
                            shortlist=shortlist,
                            relax_commit=relax,
                            guarded=guarded,
                            windowed=windowed,
                            explain=explain,
                            distributed=distributed,
                        ),
                    )
        elif builder == "recall_memories":
            for (
                covering,
                mode,
                fusion,
                audit,
                relax,
                distributed,
                guarded,
                most,
            ) in itertools.product(
                (True, False),
                (None, *SEARCH_MODES),
                FUSIONS,
                (True, False),
                (True, False),
                (True, False),
                (True, False),
                (1, 3, 8),
            ):
                if guarded and not (audit and "user_id" in dims):
                    continue  # the guard is an audited read's of one user
                yield (
                    dims,
                    ranking_recall.recall_memories(
                        dims,
                        covering=covering,
                        mode=mode,
                        fusion=fusion,
                        neighbours=mode == "hybrid" and fusion == "score",
                        max_results=most,
                        audit=audit,
                        relax_commit=relax,
                        guarded=guarded,
                        distributed=distributed,
                    ),
                )
        elif builder == "list_memories":
            for newest_first in (True, False):
                yield dims, q.list_memories(dims, newest_first=newest_first)
        elif builder == "delete_ids":
            for distributed in (True, False):
                yield dims, q.delete_ids(dims, distributed=distributed)
        elif builder in ("count_memories", "delete_scope"):
            yield dims, getattr(q, builder)(dims)
        else:
            raise AssertionError(
                f"{builder} builds statements this test does not know how to call: "
                "add it to _variants in tests/store/test_routing.py"
            )


#: Each plane's statement catalogue.
CATALOGUES = [
    pytest.param(q, id="store.queries"),
    pytest.param(ranking_search, id="store._ranking.search"),
    pytest.param(ranking_recall, id="store._ranking.recall"),
    pytest.param(s, id="admin.statements"),
]


def _fan_out(module: ModuleType) -> dict[str, str]:
    """The catalogue's statements and builders that fan out on Citus, with why (the registry)."""
    entries = registered(module.__name__)
    return {name: e.fan_out for name, e in entries.items() if e.fan_out is not None}


def _constant_user(module: ModuleType) -> dict[str, str]:
    """The catalogue's statements that run on the constant user's shard, with why."""
    entries = registered(module.__name__)
    return {name: e.constant_user for name, e in entries.items() if e.constant_user is not None}


def _builders(module: ModuleType) -> dict[str, Callable[..., str]]:
    """The public statement builders of a catalogue (plain or cached functions)."""
    return {
        name: value
        for name, value in vars(module).items()
        if callable(value)
        and not inspect.isclass(value)
        and getattr(value, "__module__", None) == module.__name__
        and not name.startswith("_")
    }


def _constants(module: ModuleType) -> dict[str, str]:
    return {
        name: value
        for name, value in vars(module).items()
        if name.isupper()
        and not name.startswith("_")
        and isinstance(value, str)
        and any(c.isspace() for c in value.strip())  # a statement, not a table or function name
    }


def test_both_catalogues_have_statements_and_builders() -> None:
    assert "search_memories" in _builders(ranking_search) and "audit_row_check" in _builders(s)
    assert "recall_memories" in _builders(ranking_recall) and "delete_ids" in _builders(q)
    assert not set(_constants(q)) & set(_constants(s)), "a statement is defined in both planes"


@pytest.mark.parametrize("module", CATALOGUES)
def test_every_statement_and_builder_of_a_catalogue_is_registered(module: ModuleType) -> None:
    """A statement-like constant that is a plain str (e.g. derived by ``+``) or an unmarked
    builder would escape the routing checks below: each must be a registered value."""
    entries = registered(module.__name__)
    tree = ast.parse(inspect.getsource(module))
    assigned = {
        name.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for name in (target.elts if isinstance(target, ast.Tuple) else [target])
        if isinstance(name, ast.Name)
    }
    own = {name: value for name, value in _constants(module).items() if name in assigned}
    plain = [name for name, value in own.items() if not isinstance(value, Statement)]
    assert not plain, f"{module.__name__}: make these Statement(...) values: {plain}"
    unmarked = [name for name in _builders(module) if not is_builder(getattr(module, name))]
    assert not unmarked, f"{module.__name__}: mark these builders with @builds(...): {unmarked}"
    assert set(entries) == set(own) | set(_builders(module))
    for name in own:
        assert getattr(module, name).name == f"{module.__name__}.{name}"


@pytest.mark.parametrize("module", CATALOGUES)
def test_every_statement_on_per_user_tables_names_one_user_or_is_a_listed_fan_out(
    module: ModuleType,
) -> None:
    fan_out, constant_user = _fan_out(module), _constant_user(module)
    unmarked = []
    for name, statement in _constants(module).items():
        if not routing.touches_per_user_tables(statement) or routing.names_one_user(statement):
            continue
        if name not in fan_out and name not in constant_user:
            unmarked.append(name)
    for name in _builders(module):
        for dims, statement in _variants(name):
            if not routing.touches_per_user_tables(statement):
                continue
            if "user_id" in dims:
                assert routing.names_one_user(statement), (name, dims)
            elif name not in fan_out:
                unmarked.append(f"{name}{dims}")
    assert not unmarked, (
        f"statements touch per-user tables without a user_id = :param filter: {unmarked}; "
        f"filter them on user_id or give them fan_out= (why) where {module.__name__} defines them"
    )


@pytest.mark.parametrize("module", CATALOGUES)
def test_the_classified_statements_need_their_classification(module: ModuleType) -> None:
    fan_out, constant_user = _fan_out(module), _constant_user(module)
    constants, builders = _constants(module), _builders(module)
    for name in {**fan_out, **constant_user}:
        assert name in constants or name in builders, f"{name} is no statement in {module}"
        if name in constants:
            statement = constants[name]
            assert routing.touches_per_user_tables(statement), name
            assert not routing.names_one_user(statement), f"{name} names one user: unclassify it"
    assert set(fan_out).isdisjoint(constant_user)


def test_the_docs_list_exactly_these_statements() -> None:
    readme = (Path(__file__).parents[2] / "docs" / "routing.md").read_text(encoding="utf-8")
    table = readme.split("| statement | why it fans out |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \| (.+) \|$", table, re.MULTILINE)
    lists = [found(m.values[0]) for m in CATALOGUES for found in (_fan_out, _constant_user)]
    assert sorted(listed) == sorted(item for found in lists for item in found.items())


def test_the_rule_tells_a_user_filter_from_a_fan_out() -> None:
    assert routing.names_one_user("SELECT 1 FROM pgmemory_facts WHERE user_id = :user_id")
    assert routing.names_one_user("SELECT 1 FROM pgmemory_facts AS f WHERE f.user_id = :u")
    assert routing.names_one_user("INSERT INTO pgmemory_facts (user_id) VALUES (:user_id)")
    assert not routing.names_one_user("DELETE FROM pgmemory_memories WHERE expires_at < now()")
    assert not routing.names_one_user("SELECT 1 FROM pgmemory_memories WHERE user_id <> :user_id")
    assert not routing.names_one_user(
        "SELECT 1 FROM pgmemory_memories AS m WHERE m.user_id = u.user_id"
    )


def test_every_key_of_a_per_user_table_holds_user_id(database_url: str) -> None:
    """Read from the migrated database itself (what the migrations made, not the models)."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            tables = set(
                conn.execute(
                    sa.text(
                        "SELECT c.relname FROM pg_class AS c JOIN pg_namespace AS n "
                        "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() "
                        "AND c.relkind IN ('r', 'p') AND c.relname LIKE 'pgmemory\\_%' "
                        "AND c.relname <> 'pgmemory_alembic_version'"
                    )
                ).scalars()
            )
            keys = conn.execute(
                sa.text(
                    "SELECT i.indrelid::regclass::text, i.indexrelid::regclass::text, "
                    "ARRAY(SELECT a.attname FROM pg_attribute AS a WHERE a.attrelid = i.indrelid "
                    "AND a.attnum = ANY(i.indkey)) FROM pg_index AS i "
                    "WHERE (i.indisunique OR i.indisprimary) "
                    "AND i.indrelid = ANY(CAST(:tables AS regclass[]))"
                ),
                {"tables": list(routing.PER_USER_TABLES)},
            ).all()
            foreign = conn.execute(
                sa.text(
                    "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint "
                    "WHERE contype = 'f' AND conrelid = ANY(CAST(:tables AS regclass[]))"
                ),
                {"tables": list(routing.PER_USER_TABLES)},
            ).all()
    finally:
        engine.dispose()
    assert tables == (
        set(routing.PER_USER_TABLES)
        | set(routing.REFERENCE_TABLES)
        | set(routing.COORDINATOR_TABLES)
    )
    assert tables == {table.name for table in Base.metadata.sorted_tables}
    assert {table for table, _, _ in keys} == set(routing.PER_USER_TABLES)  # each has a key
    missing = [(table, index) for table, index, columns in keys if "user_id" not in columns]
    assert not missing, f"keys without user_id (Citus cannot distribute them): {missing}"
    # Foreign keys from distributed tables may only point at reference tables.
    assert {target for _, target in foreign} <= set(routing.REFERENCE_TABLES)


def test_distribute_without_citus_says_so_and_changes_nothing(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def distribute() -> None:
        async with MemoryStore(database_url) as store:
            await Admin(store).distribute()

    with pytest.raises(DatabaseNotReadyError, match="citus extension is not installed"):
        asyncio.run(distribute())

    assert run(["--url", database_url, "db", "distribute"]) == 1
    out, err = capsys.readouterr()
    assert not out and "pgmemory: error:" in err and "citus extension is not installed" in err
    assert "CREATE EXTENSION citus" in err and "nothing was changed" in err
    assert run(["--url", database_url, "db", "distribute", "--json"]) == 1
    out, err = capsys.readouterr()
    assert not out and "citus extension is not installed" in err

    engine = sa.create_engine(database_url)
    with engine.connect() as conn:  # still a plain table
        kind = conn.execute(
            sa.text("SELECT relkind FROM pg_class WHERE relname = 'pgmemory_memories'")
        ).scalar_one()
    engine.dispose()
    assert kind == "r"


def test_distribute_help_lists_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(["db", "distribute", "--help"])
    out = capsys.readouterr().out
    assert "create_distributed_table" in out and '"distributed"' in out
    json.dumps(_fan_out(q))  # the reasons are plain data (quoted in docs/routing.md)


#: The golden files of what pgmemory sends (tests/package/test_statements_at_wire.py).
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
_NAMED = re.compile(r"(?<![:\w]):(?!:)\w+")
_NUMBERED = re.compile(r"\$\d+\b")


def _shape(sql: str, placeholders: re.Pattern[str]) -> str:
    """``sql`` with its parameters made ``?`` and each whitespace run one space."""
    return re.sub(r"\s+", " ", placeholders.sub("?", sql)).strip()


def _sent(golden: Path) -> list[str]:
    """The SQL of each statement a golden file records (its wrapped lines joined again)."""
    found: list[str] = []
    in_sql = False  # a continuation line ("    ...") belongs to the field above it
    for line in golden.read_text(encoding="utf-8").splitlines():
        if line.startswith("  sql: "):
            found.append(line[len("  sql: ") :])
            in_sql = True
        elif line.startswith("    ") and in_sql:
            found[-1] += " " + line.strip()
        else:
            in_sql = False
    return found


@functools.cache
def _registered_shapes() -> frozenset[str]:
    """Every registered statement's text and every builder's, in :func:`_shape`."""
    known = {_shape(str(entry.sql), _NAMED) for entry in REGISTRY.values() if entry.sql}
    for module in [param.values[0] for param in CATALOGUES]:
        for name in _builders(module):
            known |= {_shape(text, _NAMED) for _, text in _variants(name)}
    return frozenset(known)


@pytest.mark.parametrize("golden", sorted(GOLDEN.glob("statements-*.txt")), ids=lambda p: p.stem)
def test_every_statement_at_the_wire_on_per_user_tables_is_a_registered_one(golden: Path) -> None:
    """What the search, recall and write paths send (the golden files) reaches per-user data only
    through registered statements, so each is classified for Citus by the tests above."""
    known = _registered_shapes()
    sent = [sql for sql in _sent(golden) if routing.touches_per_user_tables(sql)]
    assert sent, f"{golden.name} records no statement on a per-user table"
    stray = [sql[:120] for sql in sent if _shape(sql, _NUMBERED) not in known]
    assert not stray, (
        f"{golden.name}: statements on per-user tables that no catalogue registers: {stray}"
    )


REGISTRY_GOLDEN = GOLDEN / "registry.txt"


def _classified(entry: Registered) -> str:
    """How a registered statement or builder spreads on Citus, in one line."""
    if entry.sql is None:
        without = f"fan-out: {entry.fan_out}" if entry.fan_out else "touches no per-user table"
        return f"builder; names the scope's user, and without one: {without}"
    if entry.fan_out is not None:
        return f"fan-out: {entry.fan_out}"
    if entry.constant_user is not None:
        return f"constant user: {entry.constant_user}"
    if routing.touches_per_user_tables(entry.sql):
        return "routed: names one user"
    return "no per-user table"


def test_every_registered_statement_has_a_golden_entry_and_a_classification() -> None:
    """The registry, read as a reviewer reads it: each statement and builder of both
    catalogues with how it spreads on Citus, one per line in ``tests/golden/registry.txt``. A
    new, renamed or dropped statement, or a changed classification, is a diff to that file in
    the same commit (``PGMEMORY_UPDATE_GOLDEN=1 pytest tests/store/test_routing.py -k
    golden_entry``, then review it)."""
    lines = [f"{name}\t{_classified(entry)}" for name, entry in sorted(REGISTRY.items())]
    text = (
        "# Every registered statement and builder (pgmemory.store._engine.statement.REGISTRY) and\n"
        "# how it spreads on Citus. Rewrite with PGMEMORY_UPDATE_GOLDEN=1 (see test_routing.py).\n"
        + "\n".join(lines)
        + "\n"
    )
    if os.environ.get("PGMEMORY_UPDATE_GOLDEN") == "1":
        REGISTRY_GOLDEN.write_text(text, encoding="utf-8")
    golden = REGISTRY_GOLDEN.read_text(encoding="utf-8")
    assert golden == text, (
        "the registry differs from tests/golden/registry.txt: rewrite it with "
        "PGMEMORY_UPDATE_GOLDEN=1 and review the diff"
    )
    assert len(lines) == len(REGISTRY) and all("\t" in line for line in lines)
