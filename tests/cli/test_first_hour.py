"""The command line's smaller stumbles of a first hour (issue 59), against a real database."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from pgmemory.cli import _parser, run
from pgmemory.settings import Settings
from pgmemory.store.store import MemoryStore


def _collections(url: str) -> set[str]:
    async def names() -> set[str]:
        async with MemoryStore(url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
            return {info.name for info in await store.list_collections()}

    return asyncio.run(names())


def test_an_undone_import_leaves_no_collection_behind(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`import --create` of a file holding one id twice: refused whole, and the collection it
    created for the import is gone with it ("nothing was stored")."""
    target = f"c_{uuid.uuid4().hex[:10]}"
    row = {"id": str(uuid.uuid4()), "scope": {"user_id": "imp"}, "role": "user",
           "content": "hi", "embedding": [1.0, 0.0, 0.0], "embedding_model": "fixed"}  # fmt: skip
    file = tmp_path / "twice.jsonl"
    file.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    status = run(["--url", database_url, "import", str(file), "--collection", target, "--create"])
    err = capsys.readouterr().err
    assert status == 1 and "nothing was stored" in err, err
    assert target not in _collections(database_url)


def test_memories_of_nobody_says_so_instead_of_a_bare_header(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run(["--url", database_url, "memories", "--user", f"nobody-{uuid.uuid4().hex}"])
    out, err = capsys.readouterr()
    assert status == 0
    assert out == ""  # no header over nothing
    assert "no memories of that user" in err and "pgmemory users" in err
    assert "nobody-" not in err  # the id typed is not echoed back


def test_recall_s_help_says_what_it_returns() -> None:
    recall = _parser()._subparsers._group_actions[0].choices["recall"]  # type: ignore[union-attr]
    assert "the way the library's providers do" not in recall.description
    assert "tool calls" in recall.description
