"""The examples `make demo` runs, run as it runs them: from the checkout, on a new database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pgmemory.store.modes import DEFAULT_MODE, MODES

ROOT = Path(__file__).resolve().parents[1]


def test_the_quickstart_says_what_its_scores_mean(fresh_database: str) -> None:
    """The quickstart prints each hit's score, and once what a score of its search means (the
    modes' own description: a fused score is no similarity, and ranges past 1)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PGMEMORY_")}
    env.update(PGMEMORY_DATABASE_URL=fresh_database)
    done = subprocess.run(
        [sys.executable, "examples/quickstart.py"], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        f"scores ({DEFAULT_MODE} search, the default): {MODES[DEFAULT_MODE].scale}" in done.stdout
    )
    assert "0..3 with the default weights" in MODES[DEFAULT_MODE].scale
    assert "neither user recalled the other's memories." in done.stdout
