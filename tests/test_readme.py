"""Every ```python block of README.md runs as written.

Each block runs as its own script in a fresh interpreter, from an empty temporary directory,
against the test session's migrated database (``PGMEMORY_DATABASE_URL``) and, for blocks that
talk to a model, a scripted OpenAI-compatible server (``PGMEMORY_OPENAI_BASE_URL``). A block
passes when it exits with status 0. Other blocks (bash, sql) are not run.
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


def python_blocks(markdown: str) -> list[tuple[str, str]]:
    """The ```python blocks of a markdown text.

    Args:
        markdown: the document.

    Returns:
        ``(label, code)`` per block, in order; the label is the nearest heading above the
        block and the block's line number, for test ids and failure messages.
    """
    blocks: list[tuple[str, str]] = []
    heading = "top"
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.strip() == "```python":
            start = index + 1
            end = start
            while lines[end].strip() != "```":
                end += 1
            slug = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-")
            blocks.append((f"{slug}-line{start}", "\n".join(lines[start:end]) + "\n"))
            index = end
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


@pytest.fixture(scope="module")
def model_server() -> Iterator[OpenAIServer]:
    """One scripted model for every snippet."""
    with OpenAIServer(responder=scripted_model) as server:
        yield server


def test_the_readme_has_python_snippets() -> None:
    assert len(BLOCKS) >= 4, [label for label, _ in BLOCKS]


@pytest.mark.slow
@pytest.mark.parametrize("code", [code for _, code in BLOCKS], ids=[label for label, _ in BLOCKS])
def test_snippet_runs_as_written(
    code: str, tmp_path: Path, database_url: str, model_server: OpenAIServer
) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {name: value for name, value in os.environ.items() if not name.startswith("PGMEMORY_")}
    env.update(
        PGMEMORY_DATABASE_URL=database_url,
        PGMEMORY_OPENAI_BASE_URL=model_server.url,
        PGMEMORY_OPENAI_API_KEY="test",
        OPENAI_BASE_URL=model_server.url,
        OPENAI_API_KEY="test",
    )
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
    if "OpenAIChatCompletionClient" in code:  # it really talked to the (scripted) model
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
