"""``make demo`` installs only what the demos import (issue 59).

It installed the test and dev extras (pytest, playwright, ruff, mypy, pdoc) and, as root,
apt-get chromium and pgbouncer: 79 s and a 735 MB venv before the first line of the demo.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO_NEEDS = {"local", "embedded", "use", "agent-framework"}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_no_test_or_dev_extra(tmp_path: Path) -> None:
    recipe = subprocess.run(
        ["make", "-n", "-B", "demo", f"VENV={tmp_path / 'venv'}"],  # -B: as on a fresh clone
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert installs, recipe
    for line in installs:
        for extras in re.findall(r"\.\[([^\]]*)\]", line):
            assert set(extras.split(",")) <= DEMO_NEEDS, line
        assert "--upgrade pip" not in line, line
    assert "apt-get" not in recipe and "playwright" not in recipe, recipe
    assert "examples/quickstart.py" in recipe and "examples/food_delivery.py" in recipe
