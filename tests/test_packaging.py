"""Every package pyproject.toml lists exists in the tree, and every package in the tree is listed."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_listed_packages_match_the_tree() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = config.get("package-dir", {})
    listed = set(config["packages"])
    def folder_of(package: str) -> Path:
        # setuptools maps a package through its longest mapped parent (package-dir).
        parts = package.split(".")
        for cut in range(len(parts), 0, -1):
            prefix = ".".join(parts[:cut])
            if prefix in mapped:
                return ROOT / mapped[prefix] / "/".join(parts[cut:])
        return ROOT / package.replace(".", "/")

    for package in listed:
        folder = folder_of(package)
        assert (folder / "__init__.py").is_file(), f"{package} is listed but {folder} has no __init__.py"
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "pgmemory").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
