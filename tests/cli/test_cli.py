"""The ``pgmemory`` command line against a real database.

Most commands run in-process through :func:`pgmemory.cli.run` (the console script's own entry
point, minus the interpreter start-up); the console script itself runs in subprocesses where
the terminal matters: ``--yes`` without a terminal, a confirmation answered on a pseudo-terminal,
and the time ``--help`` takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pty
import resource
import select
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, RecallTrace, Settings
from pgmemory.admin import Admin
from pgmemory.admin.retention import PruneRecord
from pgmemory.cli import _parser, run
from pgmemory.store import migrate

CONSOLE = shutil.which("pgmemory", path=str(Path(sys.executable).parent))
ENTRY = [CONSOLE] if CONSOLE else [sys.executable, "-m", "pgmemory"]
HEAD = migrate.head_revision()
AHEAD = datetime(2100, 1, 1, tzinfo=UTC)
OLD = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def settings() -> Settings:
    return Settings(_env_file=None)  # type: ignore[call-arg]


def cli(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> str:
    """Run the command line in-process; check its exit status; return stdout (stderr if failed)."""
    status = run(list(args))
    out, err = capsys.readouterr()
    assert status == code, f"exit {status}: {err}"
    if code:
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        return err.strip()
    return out


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    return json.loads(cli(capsys, *args, "--json"))


def console(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """The console script in a subprocess (stdin not a terminal), without the caller's URL."""
    env = {k: v for k, v in os.environ.items() if k != "PGMEMORY_DATABASE_URL"}
    return subprocess.run(
        [*ENTRY, *args], stdin=stdin, capture_output=True, text=True, env=env, timeout=120
    )


def on_terminal(*args: str, answer: str) -> tuple[int, str]:
    """Run the console script on a pseudo-terminal; answer its [y/N] question; return the
    exit status and everything it printed."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "PGMEMORY_DATABASE_URL"}
    proc = subprocess.Popen([*ENTRY, *args], stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    output, asked = b"", False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
                if not asked and b"[y/N]" in output:
                    os.write(master, answer.encode() + b"\n")
                    asked = True
            elif proc.poll() is not None:
                break
        assert asked, output.decode(errors="replace")
        return proc.wait(timeout=60), output.decode(errors="replace").replace("\r\n", "\n")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def seed(url: str, collection: str, user: str) -> list[uuid.UUID]:
    """A collection of 3-dimensional vectors (no embedder needed) with three memories of
    ``user``, two recalls, a fact and a chat message; returns the memories' ids."""

    async def go() -> list[uuid.UUID]:
        async with MemoryStore(url, settings=settings()) as store:
            await store.create_collection(collection, dimensions=3, embedding_model="test:3")
            s1 = MemoryScope(user_id=user, session_id="s1")
            ids = await store.add(
                collection,
                [
                    MemoryRecord(content="我不能吃辣", scope=s1, embedding=[0.1, 0.2, 0.3],
                                 metadata={"lang": "zh", "n": [1, 2]}, message_id="m1"),
                    MemoryRecord(content="I live in Shanghai", scope=s1, author_name="Alice",
                                 embedding=[0.3, 0.2, 0.1], created_at=OLD),
                    MemoryRecord(content="<b>noodles</b>, no peanuts", role="assistant",
                                 scope=MemoryScope(user_id=user, session_id="s2", agent_id="chef"),
                                 embedding=[0.0, 1.0, 0.0], expires_at=AHEAD,
                                 source_type="context_provider", source_id="doc-7"),
                ],
                actor="seed",
            )  # fmt: skip
            whole = MemoryScope(user_id=user)
            await store.search(
                collection, whole, query="Shanghai", mode="text", limit=2,
                trace=RecallTrace(provider="test", mode="text", session_id="s2"),
            )  # fmt: skip
            await store.search(
                collection, whole, vector=[0.1, 0.2, 0.3], mode="vector", limit=2,
                trace=RecallTrace(provider="test", mode="vector", session_id="s1"),
            )  # fmt: skip
            await store.merge_facts("profile", whole, {"city": "Shanghai"}, actor="seed")
            await store.append_history(
                "s2", [{"message_id": "h1", "role": "user", "text": "lunch?"}], user_id=user
            )
            return ids

    return asyncio.run(go())


class Seeded:
    def __init__(self, url: str) -> None:
        self.url = url
        self.collection = f"c_{uuid.uuid4().hex[:10]}"
        self.user = unique("alice")
        self.ids = seed(url, self.collection, self.user)


@pytest.fixture(scope="module")
def seeded(database_url: str) -> Seeded:
    return Seeded(database_url)


# --- the grammar and --help ----------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_every_option_has_help_and_listings_document_their_json() -> None:
    listings = {"collections", "users", "memories", "sessions", "audit", "recall"}
    seen = set()
    for prog, parser in _parsers(_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{prog} {action.option_strings or action.dest} has no help"
        name = prog.removeprefix("pgmemory ").strip()
        if name in listings:
            seen.add(name)
            [json_flag] = [a for a in parser._actions if "--json" in a.option_strings]
            assert "keys" in (json_flag.help or "") and "{" in (json_flag.help or "")
    assert seen == listings


def test_help_costs_under_half_a_second_of_cpu() -> None:
    """CPU time, not wall time, so that a busy machine does not fail it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = console("--help")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0 and "prune-audit" in out.stdout and "memories" in out.stdout
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.5, f"pgmemory --help took {cpu:.2f} s of CPU"


# --- listings ------------------------------------------------------------------------------------


MEMORY_KEYS = {
    "id", "collection", "scope", "role", "content", "author_name", "message_id", "source_type",
    "source_id", "embedding_model", "created_at", "expires_at", "metadata",
}  # fmt: skip


def test_listings_print_one_json_document_with_the_documented_keys(
    seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    url, user, coll = seeded.url, seeded.user, seeded.collection

    collections = cli_json(capsys, "--url", url, "collections")
    [entry] = [c for c in collections["collections"] if c["name"] == coll]
    assert entry == {**entry, "dimensions": 3, "embedding_model": "test:3"}
    assert set(entry) == {"name", "dimensions", "embedding_model", "created_at"}

    listed = cli_json(capsys, "memories", "--url", url, "--user", user)  # --url after the command
    assert set(listed) == {"user_id", "collection", "session_id", "memories", "more"}
    assert listed["more"] is False and len(listed["memories"]) == 3
    assert all(set(m) == MEMORY_KEYS for m in listed["memories"])
    newest_first = [m["created_at"] for m in listed["memories"]]
    assert newest_first == sorted(newest_first, reverse=True)
    oldest = listed["memories"][-1]
    assert oldest["content"] == "I live in Shanghai" and oldest["created_at"] == OLD.isoformat()
    assert oldest["scope"] == {"application_id": None, "agent_id": None, "user_id": user,
                               "session_id": "s1"}  # fmt: skip
    one = cli_json(capsys, "--url", url, "memories", "--user", user, "--collection", coll,
                   "--session", "s2", "--limit", "1")  # fmt: skip
    assert [m["content"] for m in one["memories"]] == ["<b>noodles</b>, no peanuts"]
    two = cli_json(capsys, "--url", url, "memories", "--user", user, "--limit", "2")
    assert two["more"] is True

    sessions = cli_json(capsys, "--url", url, "sessions", "--user", user)
    by_id = {s["session_id"]: s for s in sessions["sessions"]}
    assert set(by_id) == {"s1", "s2"} and set(by_id["s2"]) == {
        "session_id", "messages", "memories", "first_at", "last_at"
    }  # fmt: skip
    assert (by_id["s2"]["messages"], by_id["s2"]["memories"], by_id["s1"]["memories"]) == (1, 1, 2)

    users = cli_json(capsys, "--url", url, "users", "--after", user[:-1], "--limit", "1")
    assert set(users) == {"users", "next_after"}
    [mine] = users["users"]
    assert set(mine) == {"user_id", "memories", "total_memories", "recalls", "last_activity"}
    assert (mine["user_id"], mine["memories"], mine["recalls"]) == (user, {coll: 3}, 2)

    audit = cli_json(capsys, "--url", url, "audit", "--user", user)
    assert set(audit) == {"user_id", "session_id", "recalls", "writes", "fact_changes", "more"}
    vector, text = audit["recalls"]
    assert (vector["mode"], vector["score_kind"]) == ("vector", "cosine similarity")
    assert (text["mode"], text["score_kind"], text["provider"]) == ("text", "BM25", "test")
    assert vector["memories"][0]["memory_id"] == str(seeded.ids[0])
    assert vector["memories"][0]["score"] == pytest.approx(1.0)
    assert set(vector) >= {"id", "at", "collection", "scope", "requesting_session_id",
                           "query_sha256", "query_text", "returned", "memories"}  # fmt: skip
    assert [w["operation"] for w in audit["writes"]] == ["insert"] * 3
    [fact] = audit["fact_changes"]
    assert (fact["namespace"], fact["key"], fact["new_value"]) == ("profile", "city", "Shanghai")
    only_s1 = cli_json(capsys, "--url", url, "audit", "--user", user, "--session", "s1")
    assert [r["mode"] for r in only_s1["recalls"]] == ["vector"]  # requested from s1
    assert len(only_s1["writes"]) == 2 and only_s1["fact_changes"] == []

    hits = cli_json(capsys, "--url", url, "recall", coll, "Shanghai", "--user", user,
                    "--mode", "text")  # fmt: skip
    assert (hits["mode"], hits["score_kind"]) == ("text", "BM25")
    assert [h["memory"]["content"] for h in hits["hits"]] == ["I live in Shanghai"]
    assert set(hits["hits"][0]) == {"rank", "score", "memory"}

    history = cli_json(capsys, "db", "history")
    assert history["head"] == HEAD and history["revisions"][-1]["revision"] == HEAD


def test_listings_print_a_header_row_and_aligned_columns(
    seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    url, user, coll = seeded.url, seeded.user, seeded.collection
    headers = {
        ("collections",): "NAME DIMENSIONS MODEL CREATED",
        ("memories", "--user", user): "CREATED COLLECTION SESSION ROLE ID CONTENT",
        ("sessions", "--user", user): "SESSION MESSAGES MEMORIES FIRST LAST",
        ("users",): "USER MEMORIES RECALLS LAST_ACTIVITY PER_COLLECTION",
        ("recall", coll, "Shanghai", "--user", user, "--mode", "text"):
            "RANK SCORE(BM25) CREATED ROLE ID CONTENT",
        ("db", "history"): "REVISION HEAD MESSAGE",
    }  # fmt: skip
    for args, header in headers.items():
        lines = cli(capsys, "--url", url, *args).splitlines()
        assert lines[0].split() == header.split(), (args, lines[:2])
        assert len(lines) > 1, args
    table = cli(capsys, "--url", url, "memories", "--user", user).splitlines()
    column = table[0].index("SESSION")
    assert sorted(line[column : column + 2] for line in table[1:]) == ["s1", "s1", "s2"]
    with pytest.raises(SystemExit):
        run(["recall", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    for words in ("cosine similarity", "BM25", "fused score", "scaled to 0..1 within the scope"):
        assert words in usage, words
    report = cli(capsys, "--url", url, "audit", "--user", user)
    for title in ("RECALLS of", "RECALL  TIME", "SCORE_KIND", "cosine similarity", "BM25",
                  "MEMORY WRITES AND DELETES", "OPERATION", "FACT CHANGES"):  # fmt: skip
        assert title in report, title


# --- one-line errors -----------------------------------------------------------------------------


def test_refused_connection_is_one_line_naming_host_port_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    error = cli(capsys, "--url", f"postgresql://bob:s3cr3t@127.0.0.1:{port}/db",
                "memories", "--user", "alice", code=1)  # fmt: skip
    assert error.startswith(f"pgmemory: error: cannot connect to PostgreSQL at 127.0.0.1:{port}")
    assert "PGMEMORY_DATABASE_URL" in error and "start the server" in error
    assert "s3cr3t" not in error and "bob:***@" in error


def test_unknown_collection_lists_the_existing_ones(
    seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    error = cli(capsys, "--url", seeded.url, "memories", "--user", "a", "--collection", "nope",
                code=2)  # fmt: skip
    assert error.startswith("pgmemory: error: unknown collection 'nope'; existing collections:")
    assert seeded.collection in error
    error = cli(capsys, "--url", seeded.url, "recall", "nope", "x", "--user", "a", code=2)
    assert seeded.collection in error


def test_bad_input_is_told_in_the_command_lines_words(
    seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    """A library error whose message gives a library remedy (``allow_unscoped=True``,
    ``MemoryStore(embedder=...)``) is told as the command line's flag, setting or command."""
    error = cli(capsys, "--url", seeded.url, "recall", seeded.collection, "x", code=2)
    assert error.startswith("pgmemory: error: no scope given")
    assert "--user" in error and "allow_unscoped" not in error
    # the seeded collection's vectors are of model test:3; the command line embeds with use
    error = cli(capsys, "--url", seeded.url, "recall", seeded.collection, "x", "--user", "a",
                code=2)  # fmt: skip
    assert "holds vectors of model 'test:3'" in error and "PGMEMORY_EMBEDDER" in error
    assert f"pgmemory db reembed {seeded.collection} --embedder" in error
    assert "MemoryStore(" not in error


def test_fresh_database_missing_extension_unknown_revision_and_each_revision_applied(
    fresh_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = fresh_database
    error = cli(capsys, "--url", url, "memories", "--user", "alice", code=1)
    assert "pgvector extension is not installed" in error and "CREATE EXTENSION" in error
    assert "superuser" in error

    # A role that may not create the extension gets the statement and the role it takes.
    role = f"pgm_plain_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        try:
            conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
        except sa.exc.ProgrammingError:
            role = ""  # the test server's role may not create roles (an external server)
        else:
            conn.execute(sa.text(f'GRANT CREATE ON SCHEMA public TO "{role}"'))
    try:
        if role:
            plain = sa.engine.make_url(url).set(username=role, password=None)
            error = cli(capsys, "--url", plain.render_as_string(hide_password=False), "db",
                        "upgrade", code=1)  # fmt: skip
            assert f"role {role!r} may not create it" in error
            assert "have a superuser run `CREATE EXTENSION vector;`" in error
    finally:
        with admin.connect() as conn:
            if role:
                conn.execute(sa.text(f'REVOKE CREATE ON SCHEMA public FROM "{role}"'))
                conn.execute(sa.text(f'DROP ROLE "{role}"'))
        admin.dispose()

    error = cli(capsys, "--url", url, "db", "upgrade", "nope", code=2)
    assert error.startswith("pgmemory: error: unknown schema revision 'nope'; valid: 0001")
    assert f"{HEAD} (head)" in error and "pgmemory db heads" in error

    lines = cli(capsys, "--url", url, "db", "upgrade").splitlines()
    revisions = [r["revision"] for r in cli_json(capsys, "db", "history")["revisions"]]
    assert [line.split()[:2] for line in lines[:-1]] == [["->", r] for r in revisions]
    assert lines[0].startswith("-> 0001 Initial schema")
    assert lines[-1] == f"pgmemory schema at {HEAD}"
    nothing = cli_json(capsys, "--url", url, "db", "upgrade")
    assert nothing == {"from": HEAD, "to": HEAD, "applied": []}

    refused = cli(capsys, "--url", url, "db", "downgrade", "base", code=2)  # stdin: no terminal
    assert "--yes" in refused
    down = cli_json(capsys, "--url", url, "db", "downgrade", revisions[-2], "--yes")
    assert down == {"from": HEAD, "to": revisions[-2], "reverted": [
        {"revision": HEAD, "message": cli_json(capsys, "db", "history")["revisions"][-1]["message"]}
    ]}  # fmt: skip
    up = cli_json(capsys, "--url", url, "db", "upgrade")
    assert [s["revision"] for s in up["applied"]] == [HEAD]
    assert cli(capsys, "--url", url, "db", "current").strip() == HEAD


# --- destructive commands ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [("forget", "alice"), ("prune-audit", "--older-than", "90d"), ("db", "downgrade", "base")],
    ids=["forget", "prune-audit", "db-downgrade"],
)
def test_destructive_commands_need_yes_without_a_terminal(args: tuple[str, ...]) -> None:
    out = console("--url", "postgresql://nobody@127.0.0.1:1/none", *args)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("pgmemory: error:") and "--yes" in line and out.stdout == ""


def test_confirmation_on_a_terminal(seeded: Seeded, capsys: pytest.CaptureFixture[str]) -> None:
    user = unique("erin")
    seed(seeded.url, f"c_{uuid.uuid4().hex[:10]}", user)
    status, output = on_terminal("--url", seeded.url, "forget", user, answer="n")
    assert status == 1 and f"Erase everything stored about user {user!r}" in output
    assert "not confirmed; nothing was changed" in output
    assert len(cli_json(capsys, "--url", seeded.url, "memories", "--user", user)["memories"]) == 3

    status, output = on_terminal("--url", seeded.url, "forget", user, "--json", answer="y")
    assert status == 0, output
    erased = json.loads(output[output.index("{") :])
    assert erased["user_id"] == user and erased["erased"]["memories"] == 3
    assert cli_json(capsys, "--url", seeded.url, "memories", "--user", user)["memories"] == []


# --- export / import -----------------------------------------------------------------------------


def test_export_import_round_trips_exactly(
    seeded: Seeded, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url, user = seeded.url, unique("porter")
    source, target = f"c_{uuid.uuid4().hex[:10]}", f"c_{uuid.uuid4().hex[:10]}"
    ids = seed(url, source, user)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    cli(capsys, "--url", url, "export", "--user", user, "--collection", source, "-o", str(first))
    lines = [json.loads(line) for line in first.read_text().splitlines()]
    assert [line["content"] for line in lines] == ["I live in Shanghai", "我不能吃辣",
                                                   "<b>noodles</b>, no peanuts"]  # fmt: skip
    assert set(lines[0]) == MEMORY_KEYS | {"embedding"}
    by_content = {line["content"]: line for line in lines}
    spicy = by_content["我不能吃辣"]
    assert spicy["id"] == str(ids[0]) and spicy["message_id"] == "m1"
    assert spicy["metadata"] == {"lang": "zh", "n": [1, 2]}
    assert spicy["embedding"] == [float(np.float32(x)) for x in (0.1, 0.2, 0.3)]  # float32, exact
    assert by_content["I live in Shanghai"]["created_at"] == OLD.isoformat()
    noodles = by_content["<b>noodles</b>, no peanuts"]
    assert (noodles["expires_at"], noodles["source_type"], noodles["scope"]["agent_id"]) == (
        AHEAD.isoformat(), "context_provider", "chef"
    )  # fmt: skip

    error = cli(capsys, "--url", url, "import", str(first), "--collection", target, code=2)
    assert "unknown collection" in error and "--create" in error
    # The same ids for the same user cannot be stored twice: refused whole, one line.
    error = cli(capsys, "--url", url, "import", str(first), "--collection", target, "--create",
                code=1)  # fmt: skip
    assert "already stored under its id" in error and "--new-ids" in error

    async def move_out() -> None:
        async with MemoryStore(url, settings=settings()) as store:
            await store.delete(source, scope=MemoryScope(user_id=user))

    asyncio.run(move_out())
    # The refused import took the collection it created with it: --create again.
    done = cli_json(capsys, "--url", url, "import", str(first), "--collection", target, "--create")
    assert done == {"collection": target, "file": str(first), "read": 3, "imported": 3}
    cli(capsys, "--url", url, "export", "--user", user, "--collection", target, "-o", str(second))
    again = [json.loads(line) for line in second.read_text().splitlines()]
    assert [{**line, "collection": source} for line in again] == lines

    # Copies get new ids; the message already stored in the same scope is skipped.
    copies = cli(capsys, "--url", url, "import", str(first), "--collection", target, "--new-ids")
    assert copies.strip() == (
        f"imported 2 of 3 memories into {target!r} (1 skipped: their messages were already stored)"
    )
    listed = cli_json(capsys, "--url", url, "memories", "--user", user, "--collection", target)
    assert len({m["id"] for m in listed["memories"]}) == 5


# --- retention -----------------------------------------------------------------------------------


def test_prune_audit_deletes_only_old_rows_and_records_itself(
    seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    url, user = seeded.url, unique("olga")
    seed(url, f"c_{uuid.uuid4().hex[:10]}", user)
    long_ago = datetime.now(UTC) - timedelta(days=365 * 30)
    engine = sa.create_engine(url)
    tables = ("pgmemory_recall_audit", "pgmemory_memory_audit", "pgmemory_fact_audit")
    try:
        with engine.begin() as conn:
            # Backdating is a change to audit rows: the owner's sanctioned bypass of the guard.
            conn.execute(sa.text("SET LOCAL citus.propagate_set_commands = 'local'"))  # shards too
            conn.execute(sa.text("SET LOCAL pgmemory.audit_change = 'sanctioned'"))
            for table in tables[:2]:  # backdate one row of each of the user's first two audits
                conn.execute(
                    sa.text(f"UPDATE {table} SET at = :at WHERE user_id = :u AND id = "
                            f"(SELECT min(id) FROM {table} WHERE user_id = :u)"),
                    {"at": long_ago, "u": user},
                )  # fmt: skip

        def counts() -> list[int]:
            with engine.connect() as conn:
                return [
                    conn.execute(
                        sa.text(f"SELECT count(*) FROM {t} WHERE user_id = :u"), {"u": user}
                    ).scalar_one()
                    for t in tables
                ]

        before = counts()
        pruned = cli_json(capsys, "--url", url, "prune-audit", "--older-than", f"{365 * 29}d",
                          "--yes", "--actor", "retention-test")  # fmt: skip
        assert set(pruned) == {"cutoff", "deleted"}
        assert set(pruned["deleted"]) == {"recall_audit", "memory_audit", "fact_audit"}
        assert pruned["deleted"]["recall_audit"] >= 1 and pruned["deleted"]["memory_audit"] >= 1
        assert counts() == [before[0] - 1, before[1] - 1, before[2]]
    finally:
        engine.dispose()

    async def prunes() -> list[PruneRecord]:
        async with MemoryStore(url, settings=settings()) as store:
            return await Admin(store).list_prunes()

    latest = asyncio.run(prunes())[0]
    assert latest.actor == "retention-test" and latest.deleted == pruned["deleted"]


# --- the audit page's command --------------------------------------------------------------------


def test_ui_is_a_subcommand_refusing_the_retired_token_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pgmemory.ui import cli as ui_cli, server
    from pgmemory.ui.guard import ALLOWED_HOSTS_ENV

    assert (ui_cli.DEFAULT_HOST, ui_cli.DEFAULT_PORT, ui_cli.TOKEN_ENV) == (
        server.DEFAULT_HOST, server.DEFAULT_PORT, server.TOKEN_ENV
    )  # fmt: skip
    assert ui_cli.ALLOWED_HOSTS_ENV == ALLOWED_HOSTS_ENV
    monkeypatch.delenv(server.TOKEN_ENV, raising=False)
    # The opt-out beyond loopback: refused before any database is touched.
    error = cli(capsys, "ui", "--host", "0.0.0.0", "--insecure-no-token",
                "--url", "postgresql://x@nowhere.invalid/db", code=2)  # fmt: skip
    assert "--insecure-no-token" in error

    served: dict[str, Any] = {}
    monkeypatch.setattr(server, "serve", lambda *a, **k: served.update(args=a, **k))
    assert run(["--url", "postgresql://x@db/y", "ui", "--port", "9", "--allow-writes"]) == 0
    assert served["args"] == (ui_cli.DEFAULT_HOST, 9) and served["allow_writes"] is True
    assert served["url"] == "postgresql://x@db/y" and served["run_token"] is True
    assert served["insecure_no_token"] is False and served["allowed_hosts"] == []
    assert "token" not in served  # tokens come from the database, never from the settings
    served.clear()
    assert run(["ui", "--no-run-token"]) == 0 and served["run_token"] is False

    # The retired plain-text setting is refused, naming what to do instead.
    monkeypatch.setenv(server.TOKEN_ENV, "from-the-environment")
    error = cli(capsys, "ui", "--url", "postgresql://x@nowhere.invalid/db", code=2)
    assert "retired" in error and "pgmemory token create" in error
    monkeypatch.delenv(server.TOKEN_ENV)
    served.clear()
    assert run(["ui", "--insecure-no-token", "--allowed-host", "a.example",
                "--allowed-host", "b.example:8443"]) == 0  # fmt: skip
    assert served["insecure_no_token"] is True
    assert served["allowed_hosts"] == ["a.example", "b.example:8443"]
    assert ui_cli.NO_TOKEN_WARNING in capsys.readouterr().err
    # PGMEMORY_UI_ALLOWED_HOSTS is read, and checked before anything starts (and before the
    # warning: a refused start warns of nothing).
    monkeypatch.setenv(ui_cli.ALLOWED_HOSTS_ENV, "ok.example, https://proxy.example/")
    error = cli(capsys, "ui", "--insecure-no-token", code=2)
    assert "not a host name" in error and "WARNING" not in error
    monkeypatch.setenv(ui_cli.ALLOWED_HOSTS_ENV, "ok.example, proxy.example:8443")
    from pgmemory.settings import Settings

    assert Settings().ui_allowed_host_list() == ["ok.example", "proxy.example:8443"]
