"""Packaging matches the tree: each package folder found, each imported distribution declared."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from unittest import mock

from pgmemory.store import migrate

ROOT = Path(__file__).resolve().parents[2]


def _packages() -> list[str]:
    """The packages setup.py hands setuptools (its ``setup()`` call captured, not run)."""
    captured: dict[str, list[str]] = {}
    code = (ROOT / "setup.py").read_text()
    with mock.patch("setuptools.setup", lambda **kwargs: captured.update(kwargs)):
        cwd = os.getcwd()
        os.chdir(ROOT)  # setup.py discovers packages relative to the project root
        try:
            exec(compile(code, "setup.py", "exec"), {"__name__": "__main__"})
        finally:
            os.chdir(cwd)
    return captured["packages"]


def test_found_packages_match_the_tree() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in config, "packages are found in setup.py, not listed"
    mapped = config["package-dir"]
    assert mapped == {"pgmemory.migrations": "migrations"}
    packages = _packages()
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "pgmemory").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found <= set(packages), f"packages not found: {sorted(found - set(packages))}"
    # The template folder (no __init__.py) is a package too: without it setuptools warns.
    assert {"pgmemory.ui.templates", "pgmemory.migrations", "pgmemory.migrations.versions"} <= set(
        packages
    )
    assert not [p for p in packages if "__pycache__" in p]
    for package in ("pgmemory.migrations", "pgmemory.migrations.versions"):
        folder = ROOT / "migrations" / "/".join(package.split(".")[2:])
        assert (folder / "__init__.py").is_file(), package


def _imported_top_level_modules() -> set[str]:
    """Top-level names of every absolute import in pgmemory/ and migrations/, lazy ones included,
    plus the modules named to ``pgmemory.extras.require``."""
    names: set[str] = set()
    for path in [*(ROOT / "pgmemory").rglob("*.py"), *(ROOT / "migrations").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(str(node.args[0].value).split(".")[0])
    return names - set(sys.stdlib_module_names) - {"pgmemory", "__future__"}


def _requirement_name(requirement: str) -> str:
    """``"psycopg[binary]>=3.2"`` -> ``"psycopg"`` (normalised as in PEP 503)."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


def test_every_imported_package_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_requirement_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {_requirement_name(r) for r in extra}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module in sorted(_imported_top_level_modules()):
        providers = {_requirement_name(d) for d in distributions.get(module, [])}
        assert providers, f"{module} is imported but not installed, so its distribution is unknown"
        if not providers & declared:
            undeclared[module] = sorted(providers)
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_psycopg_pool_is_not_required() -> None:
    """psycopg_pool is never imported, so the ``pool`` extra of psycopg is not asked for."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any("pool" in r for r in dependencies if _requirement_name(r) == "psycopg")
    assert "psycopg_pool" not in _imported_top_level_modules()


def test_a_checkout_imported_without_the_install_still_finds_its_migrations(tmp_path: Path) -> None:
    """``uvicorn examples.fastapi_app:app`` run in a checkout imports ``pgmemory`` from the
    checkout's own folder, where no ``pgmemory/migrations`` exists (the install maps it): the
    store then migrates from the checkout's ``migrations/``. Run with the editable install's
    mapping taken away, as a wheel installed beside the checkout leaves it, on a copy of the
    checkout's two folders (whatever this checkout links into ``pgmemory/``)."""
    checkout = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", "migrations")
    shutil.copytree(ROOT / "pgmemory", checkout / "pgmemory", ignore=skip)
    shutil.copytree(ROOT / "migrations", checkout / "migrations", ignore=skip)
    code = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if not getattr(f, '__module__', '').startswith('__editable__')]\n"
        "sys.path_hooks[:] = [h for h in sys.path_hooks\n"
        "                     if not getattr(h, '__module__', '').startswith('__editable__')]\n"
        "sys.path_importer_cache.clear()\n"
        f"sys.path.insert(0, {str(checkout)!r})\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('pgmemory.migrations') is None\n"
        "from pgmemory.store.migrate import alembic_config, head_revision\n"
        "print(alembic_config().get_main_option('script_location'))\n"
        "print(head_revision())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    location, head = done.stdout.split()
    assert Path(location) == checkout / "migrations"
    assert head == migrate.head_revision()
