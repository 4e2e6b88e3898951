"""`make docs` builds the API reference from the docstrings (pdoc), with the public classes in it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def api_modules() -> list[str]:
    """The modules `make docs` documents, read from the Makefile (one list to keep)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    found = re.search(r"^API_MODULES := (.+)$", makefile, re.MULTILINE)
    assert found, "the Makefile defines API_MODULES"
    return found.group(1).split()


@pytest.mark.slow
def test_the_reference_builds_and_documents_the_store(tmp_path: Path) -> None:
    modules = api_modules()
    subprocess.run(
        [sys.executable, "-m", "pdoc", "--docformat", "google", "-o", str(tmp_path), *modules],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    page = (tmp_path / "pgmemory.html").read_text(encoding="utf-8")
    for name in ("MemoryStore", "MemoryRecord", "MemoryScope", "SyncMemoryStore"):
        assert f'id="{name}"' in page, f"{name} is not in the reference"
    assert 'id="MemoryStore.search"' in page  # methods too, with their docstrings
    for module in modules[1:]:
        assert (tmp_path / (module.replace(".", "/") + ".html")).is_file(), module
