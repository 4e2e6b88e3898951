"""`pgmemory --version` prints the installed distribution's version, the one pyproject.toml sets."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pgmemory.extras import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]


def test_version_flag_prints_the_installed_version() -> None:
    out = subprocess.run(
        # The module rather than the console script: run from the project root, it is this
        # checkout's code even where the virtualenv's script belongs to another folder.
        [sys.executable, "-m", "pgmemory", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"pgmemory {importlib.metadata.version(DISTRIBUTION)}"


def test_the_installed_version_is_the_pyproject_version() -> None:
    """Holds for an install of this checkout (``make`` reinstalls when pyproject.toml changes).

    An environment whose pgmemory was installed from another folder (a second worktree sharing
    one virtualenv) carries that folder's version, so there the comparison says nothing.
    """
    # The installed distribution, not a pgmemory.egg-info the build left in the working tree
    found = [
        (d, json.loads(d.read_text("direct_url.json") or "{}"))
        for d in importlib.metadata.distributions(name=DISTRIBUTION)
    ]
    distribution, direct_url = next(((d, u) for d, u in found if u), found[0])
    if direct_url.get("url") != ROOT.as_uri():
        pytest.skip(f"pgmemory is installed from {direct_url.get('url')}, not from {ROOT}")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert distribution.version == project["version"]
