"""An operator's command line never reports success for work it did not do: pointed at the
wrong database it refuses, asked to erase a user that database does not know it says so, and
an export holds every memory of the user, whenever they were written.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.cli import run
from tests.conftest import unique

#: The earliest and latest instants a Python datetime can hold, and some in between.
INSTANTS = [
    datetime.min.replace(tzinfo=UTC),
    datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2026, 12, 1, 12, tzinfo=UTC),
    datetime(9999, 12, 30, 23, 59, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC),
]


def _status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_no_url_and_no_embedded_server_is_refused_by_every_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A misspelt URL variable with PGMEMORY_EMBEDDED=false must not mean "the local server"."""
    monkeypatch.delenv("PGMEMORY_DATABASE_URL", raising=False)
    monkeypatch.setenv("PGMEMORY_DATABASE_ULR", "postgresql://typo@localhost/none")
    monkeypatch.setenv("PGMEMORY_EMBEDDED", "false")
    monkeypatch.setenv("PGMEMORY_DATA_DIR", str(tmp_path / "never"))
    for command in (["users"], ["collections"], ["forget", "alice", "--yes"], ["audit", "verify"],
                    ["memories", "--user", "alice"], ["db", "current"]):  # fmt: skip
        code, out, err = _status(capsys, *command)
        assert code != 0 and not out, command
        assert "PGMEMORY_EMBEDDED=false" in err and "PGMEMORY_DATABASE_URL" in err, command
    assert not (tmp_path / "never").exists()  # no embedded server was started


def test_forgetting_a_user_the_database_does_not_know_is_an_error(
    capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    ghost = unique("ghost")
    for extra in ([], ["--json"]):
        code, out, err = _status(capsys, "--url", database_url, "forget", ghost, "--yes", *extra)
        assert code == 1 and not out
        assert f"no user {ghost!r}" in err and "nothing erased" in err


def test_forgetting_a_known_user_still_erases(
    capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    user = unique("known")

    async def seed() -> None:
        async with MemoryStore(database_url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
            name = f"c_{unique('x').replace('-', '_')}"
            await store.create_collection(name, dimensions=3, embedding_model="test:3")
            await store.add(
                name,
                [MemoryRecord(content="x", scope=MemoryScope(user_id=user), embedding=[1, 0, 0])],
            )

    asyncio.run(seed())
    code, out, err = _status(capsys, "--url", database_url, "forget", user, "--yes", "--json")
    assert code == 0, err
    assert json.loads(out)["erased"]["memories"] == 1


def test_an_export_holds_every_memory_whenever_it_was_written(
    capsys: pytest.CaptureFixture[str], database_url: str, tmp_path: Path
) -> None:
    user, collection = unique("times"), f"c_{os.urandom(5).hex()}"

    async def seed() -> None:
        async with MemoryStore(database_url, settings=Settings(_env_file=None)) as store:  # type: ignore[call-arg]
            await store.create_collection(collection, dimensions=3, embedding_model="test:3")
            await store.add(
                collection,
                [
                    MemoryRecord(content=f"at {when.isoformat()}", scope=MemoryScope(user_id=user),
                                 embedding=[1, 0, 0], created_at=when)
                    for when in INSTANTS
                ],
            )  # fmt: skip
            listed = await store.list(collection, MemoryScope(user_id=user), limit=100)
            assert sorted(m.created_at for m in listed) == sorted(INSTANTS)

    asyncio.run(seed())
    out = tmp_path / "out.jsonl"
    code, _, err = _status(
        capsys, "--url", database_url, "export", "--user", user, "--collection", collection,
        "-o", str(out),
    )  # fmt: skip
    assert code == 0, err
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(datetime.fromisoformat(line["created_at"]) for line in exported) == INSTANTS
