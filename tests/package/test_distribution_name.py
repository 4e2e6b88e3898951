"""pgmemory is distributed under a name of its own (issue 59).

``pgmemory`` on the public package index is an unrelated project with its own ``import
pgmemory``: an install hint naming ``pgmemory[...]`` would install that project. The
distribution's name is defined once (:data:`pgmemory.extras.DISTRIBUTION`); pyproject.toml and
every install hint in the code, the examples and the docs use it.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

from pgmemory import extras

ROOT = Path(__file__).resolve().parents[2]

#: ``pip install 'pgmemory[...]'``, ``"pgmemory[...]"`` as a requirement, ``pgmemory[local]``
#: in prose: any mention of the index's name with extras.
OLD_HINT = re.compile(r"(?<![\w./-])pgmemory\[")

#: Files the rule does not apply to, each with why. Every entry must still hold the old hint,
#: so the list shrinks as they are fixed.
NOT_YET: set[str] = set()


def _normalized(name: str) -> str:
    """PEP 503: runs of ``-``, ``_`` and ``.`` are one ``-``, case is ignored."""
    return re.sub(r"[-_.]+", "-", name).lower()


def test_pyproject_is_distributed_under_the_one_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == extras.DISTRIBUTION
    assert _normalized(extras.DISTRIBUTION) != "pgmemory"  # the index's unrelated project
    for requirements in project["optional-dependencies"].values():  # self-references
        for requirement in requirements:
            if _normalized(requirement.split("[")[0]).startswith("pgmemory"):
                assert requirement.startswith(f"{extras.DISTRIBUTION}["), requirement


def test_an_install_from_an_index_or_a_wheel_is_told_the_distribution_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.metadata, "distributions", lambda *, name: [])
    assert extras.install_line("ui") == "pip install 'pgmemory-agents[ui]'"


def _tracked_text_files() -> list[Path]:
    suffixes = {".py", ".md", ".toml", ".txt", ".cfg", ".yaml", ".yml", ".html"}
    skip = {".venv", ".git", "node_modules", ".peers", ".cache", "tests", "build", "dist"}
    found = []
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if any(part in skip or part.endswith(".egg-info") for part in relative.parts):
            continue
        if path.is_file() and (path.suffix in suffixes or path.name in {"Makefile", "run"}):
            found.append(path)
    return found


def test_no_install_hint_names_the_other_project() -> None:
    offending = []
    for path in _tracked_text_files():
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        hits = [
            f"{relative}:{n}: {line.strip()}"
            for n, line in enumerate(text.splitlines(), 1)
            if OLD_HINT.search(line)
        ]
        if relative in NOT_YET:
            assert hits, f"{relative} no longer names pgmemory[...]: remove it from NOT_YET"
        else:
            offending += hits
    assert not offending, "install hints naming the index's unrelated 'pgmemory':\n" + "\n".join(
        offending
    )


def test_the_readme_says_which_name_installs_which_import() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert f"`{extras.DISTRIBUTION}`" in install
    assert "import pgmemory" in install  # and that the other project also uses it
