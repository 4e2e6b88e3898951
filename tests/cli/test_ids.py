"""Operators see exactly whom they are looking at (issue 59): ids holding invisible code points
or spaces at either end are shown escaped in the command line's tables and lines (the audit
page's rendering, :func:`pgmemory.text.visible.visible_id`), and exact in ``--json``."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, Settings
from pgmemory.cli import run


def cli(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> tuple[str, str]:
    status = run(list(args))
    out, err = capsys.readouterr()
    assert status == code, err
    return out, err


class Lookalikes:
    """Three users who print alike (the plain id, with a zero-width space, with a trailing
    space), each with a memory in a session whose id holds a no-break space and ends in one."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.collection = f"c_{uuid.uuid4().hex[:10]}"
        self.plain = f"ids-{uuid.uuid4().hex[:8]}"
        self.zero_width = self.plain + "\u200b"
        self.trailing = self.plain + " "
        self.session = "s\u00a0one "

        async def seed() -> None:
            settings = Settings(_env_file=None)  # type: ignore[call-arg]
            async with MemoryStore(url, settings=settings) as store:
                await store.create_collection(self.collection, dimensions=3, embedding_model="t:3")
                for user in (self.plain, self.zero_width, self.trailing):
                    scope = MemoryScope(user_id=user, session_id=self.session)
                    await store.add(
                        self.collection,
                        [MemoryRecord(content=f"a note of {user!r}", scope=scope,
                                      embedding=[1.0, 0.0, 0.0])],
                        actor="seed\u200b",
                    )  # fmt: skip

        asyncio.run(seed())


@pytest.fixture(scope="module")
def lookalikes(database_url: str) -> Lookalikes:
    return Lookalikes(database_url)


def test_users_shows_lookalike_ids_escaped_and_json_keeps_them_exact(
    lookalikes: Lookalikes, capsys: pytest.CaptureFixture[str]
) -> None:
    page = ("--url", lookalikes.url, "users", "--after", lookalikes.plain[:-1], "--limit", "3")
    out, _ = cli(capsys, *page)
    shown = sorted(line.split()[0] for line in out.splitlines()[1:])
    plain = lookalikes.plain
    assert shown == sorted([plain, plain + "\\u200b", plain + "\\u0020"])
    assert "\u200b" not in out
    listed = json.loads(cli(capsys, *page, "--json")[0])
    assert sorted(u["user_id"] for u in listed["users"]) == sorted(
        [plain, lookalikes.zero_width, lookalikes.trailing]
    )


def test_memories_sessions_and_audit_show_ids_escaped(
    lookalikes: Lookalikes, capsys: pytest.CaptureFixture[str]
) -> None:
    url, user = lookalikes.url, lookalikes.zero_width
    session = "s\\u00a0one\\u0020"
    out, _ = cli(capsys, "--url", url, "memories", "--user", user)
    [row] = out.splitlines()[1:]
    assert f"  {lookalikes.collection}  {session}  user  " in row and "\u00a0" not in row
    listed = json.loads(cli(capsys, "--url", url, "memories", "--user", user, "--json")[0])
    assert listed["user_id"] == user
    assert [m["scope"]["session_id"] for m in listed["memories"]] == [lookalikes.session]

    out, _ = cli(capsys, "--url", url, "sessions", "--user", user)
    assert out.splitlines()[1].startswith(session + "  ")
    listed = json.loads(cli(capsys, "--url", url, "sessions", "--user", user, "--json")[0])
    assert [s["session_id"] for s in listed["sessions"]] == [lookalikes.session]

    out, _ = cli(capsys, "--url", url, "audit", "--user", user, "--session", lookalikes.session)
    assert f"of user '{lookalikes.plain}\\u200b', session '{session}'" in out
    [write] = [line for line in out.splitlines() if "  insert  " in line]
    assert f"  {session}  " in write and write.endswith("  seed\\u200b")
    audit = json.loads(
        cli(capsys, "--url", url, "audit", "--user", user, "--session", lookalikes.session,
            "--json")[0]
    )  # fmt: skip
    assert [(w["session_id"], w["actor"]) for w in audit["writes"]] == [
        (lookalikes.session, "seed\u200b")
    ]


def test_forget_names_the_user_it_did_not_find_escaped(
    lookalikes: Lookalikes, capsys: pytest.CaptureFixture[str]
) -> None:
    nobody = lookalikes.plain + "\u2060  "  # a word joiner and two spaces: not one of the three
    _, err = cli(capsys, "--url", lookalikes.url, "forget", nobody, "--yes", code=1)
    assert f"no user '{lookalikes.plain}\\u2060\\u0020\\u0020' in the database" in err
