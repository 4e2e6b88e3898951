"""Every ```python block of README.md runs as written.

Each block runs as its own script in a fresh interpreter, from an empty temporary directory,
against a new, empty database (``PGMEMORY_DATABASE_URL``: no extension, no schema, as a new
user's) and, for blocks that talk to a model, a scripted OpenAI-compatible server named the one
way the README documents (``PGMEMORY_OPENAI_BASE_URL``; the framework's ``OPENAI_*`` are
unset). A block passes when it exits with status 0. Other blocks (bash, sql) are not run.

Here the blocks run with this environment's packages (every extra). ``make test-readme``
(tests/readme_extras.py) runs each in a venv holding only the extras its section names,
installed from a built wheel, on a fresh embedded data directory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.openai_server import OpenAIServer, Reply, call, text, tool_calls

README = Path(__file__).resolve().parents[1] / "README.md"


#: How a section names what a snippet needs: ``pip install '.[a,b]'`` or ``pip install .``.
INSTALL = re.compile(r"pip install (?:'\.\[(?P<extras>[a-z0-9,-]+)\]'|\.(?=[\s`)]))")


def python_blocks(markdown: str) -> list[tuple[str, str]]:
    """The ```python blocks of a markdown text.

    Args:
        markdown: the document.

    Returns:
        ``(label, code)`` per block, in order; the label is the nearest heading above the
        block and the block's line number, for test ids and failure messages.
    """
    return [(label, code) for label, code, _ in python_blocks_with_extras(markdown)]


def python_blocks_with_extras(markdown: str) -> list[tuple[str, str, frozenset[str] | None]]:
    """Like :func:`python_blocks`, with the extras each block's section names.

    The extras of a block are those of the last ``pip install '.[...]'`` (or ``pip install .``:
    none) between the top-level (``##``) heading of its section and the block; ``None`` when
    the section names none before it.
    """
    blocks: list[tuple[str, str, frozenset[str] | None]] = []
    heading = "top"
    extras: frozenset[str] | None = None
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            if line.startswith("## "):
                extras = None
        elif line.strip().startswith("```") and line.strip() != "```python":
            # Another kind of block (bash, text): its install lines are not a section's word.
            index += 1
            while lines[index].strip() != "```":
                index += 1
        elif line.strip() == "```python":
            start = index + 1
            end = start
            while lines[end].strip() != "```":
                end += 1
            slug = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")
            blocks.append((f"{slug}-line{start}", "\n".join(lines[start:end]) + "\n", extras))
            index = end
        else:
            for found in INSTALL.finditer(line):
                named = found.group("extras")
                extras = frozenset(named.split(",")) if named else frozenset()
        index += 1
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def scripted_model(body: Mapping[str, Any]) -> Reply | dict[str, Any]:
    """Answer any request the README's snippets make, like a cooperative model would.

    A structured-output request gets an object with every property of its schema null (no
    facts learnt); a request offering a tool that takes no arguments, with no tool result
    yet, calls that tool; anything else gets a short text.

    Args:
        body: the chat-completions request.

    Returns:
        The scripted reply.
    """
    response_format = body.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        schema = response_format["json_schema"]["schema"]
        return {name: None for name in schema.get("properties", {})}
    answered = any(message.get("role") == "tool" for message in body.get("messages", []))
    for offered in body.get("tools") or []:
        function = offered["function"]
        if not answered and not function.get("parameters", {}).get("required"):
            return tool_calls(call(function["name"], {}))
    return text("OK: one 番茄炒蛋 is on its way.")


def snippet_environment() -> dict[str, str]:
    """This process's environment without pgmemory's settings or the framework's OpenAI ones
    (``OPENAI_*``), which the README does not use: what a new user's shell holds."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PGMEMORY_", "OPENAI_", "AZURE_OPENAI_"))
    }


@pytest.fixture(scope="module")
def model_server() -> Iterator[OpenAIServer]:
    """One scripted model for every snippet."""
    with OpenAIServer(responder=scripted_model) as server:
        yield server


def test_the_readme_has_python_snippets() -> None:
    assert len(BLOCKS) >= 4, [label for label, _ in BLOCKS]


def test_every_snippet_s_section_names_existing_extras() -> None:
    """What ``make test-readme`` installs for a block is what its section tells the reader."""
    import tomllib

    pyproject = tomllib.loads((README.parent / "pyproject.toml").read_text())
    known = set(pyproject["project"]["optional-dependencies"])
    for label, _, extras in python_blocks_with_extras(README.read_text(encoding="utf-8")):
        assert extras is not None, f"{label}: its section names no `pip install '.[...]'`"
        assert extras <= known, (label, extras - known)


def test_the_install_section_lists_every_extra() -> None:
    import tomllib

    pyproject = tomllib.loads((README.parent / "pyproject.toml").read_text())
    readme = README.read_text(encoding="utf-8")
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    named = set()
    for found in INSTALL.finditer(install):
        named |= set((found.group("extras") or "").split(",")) - {""}
    assert named == set(pyproject["project"]["optional-dependencies"])


@pytest.mark.slow
@pytest.mark.parametrize("code", [code for _, code in BLOCKS], ids=[label for label, _ in BLOCKS])
def test_snippet_runs_as_written(
    code: str, tmp_path: Path, fresh_database: str, model_server: OpenAIServer
) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = snippet_environment()
    env.update(PGMEMORY_DATABASE_URL=fresh_database, PGMEMORY_OPENAI_BASE_URL=model_server.url)
    asked_before = len(model_server.requests)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, f"snippet failed:\n{code}\n{output}"
    # What a snippet prints is for a reader: values, not dataclass reprs (UserSummary(user_id=...)).
    assert not re.search(r"\b[A-Z]\w+\(\w+=", done.stdout), output
    if "chat_client()" in code:  # it really talked to the (scripted) model
        assert len(model_server.requests) > asked_before, output


@pytest.mark.slow
def test_the_quickstart_run_twice_stores_one_memory(tmp_path: Path, fresh_database: str) -> None:
    """``message_id`` is ``add``'s idempotency key: a second run stores nothing new."""
    label, code = next((label, code) for label, code in BLOCKS if label.startswith("quickstart"))
    script = tmp_path / "quickstart.py"
    script.write_text(code, encoding="utf-8")
    env = {name: value for name, value in os.environ.items() if not name.startswith("PGMEMORY_")}
    env.update(PGMEMORY_DATABASE_URL=fresh_database)
    printed = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        printed.append(done.stdout.strip().splitlines())
    assert len(printed[0]) == len(printed[1]) == 1, (label, printed)
