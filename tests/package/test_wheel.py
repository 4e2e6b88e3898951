"""The built wheel carries the migrations: `pgmemory db upgrade` works from an installed wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _source_copy(into: Path) -> Path:
    """The files a build reads, copied: building in the checkout leaves a pgmemory.egg-info
    there, which then shadows the installed distribution's metadata."""
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, into / name)
    for folder in ("pgmemory", "migrations"):
        shutil.copytree(ROOT / folder, into / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return into


@pytest.mark.slow
def test_wheel_ships_migrations_and_upgrades_a_database(
    tmp_path: Path, fresh_database: str
) -> None:
    (tmp_path / "src").mkdir()
    source = _source_copy(tmp_path / "src")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("pgmemory_agents-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "pgmemory/migrations/env.py" in names
    assert "pgmemory/migrations/script.py.mako" in names
    assert "pgmemory/migrations/versions/0001_initial_schema.py" in names
    assert "pgmemory/embedders/minilm_tokenizer.json" in names
    assert not any(name.startswith("tests/") for name in names)

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    # Run from an empty folder, with the installed wheel first on the path: no checkout involved.
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import pgmemory, sys; print(pgmemory.__file__); "
            "from pgmemory.cli import main; sys.exit(main(['--url', sys.argv[1], 'db', 'upgrade']))",
            fresh_database,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(str(target))
    from pgmemory.store.migrate import head_revision

    assert (
        out.stdout.splitlines()[-1] == f"pgmemory schema at {head_revision()}"
    )  # after "-> 0001 ..." lines
