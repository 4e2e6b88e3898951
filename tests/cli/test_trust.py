"""``pgmemory audit verify`` and ``pgmemory db roles`` against a real database."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from pgmemory.cli import run
from pgmemory.store import migrate
from tests.cli.test_cli import cli, cli_json, console, seed, unique


def test_audit_verify_passes_then_names_a_disabled_trigger_and_exits_1(
    fresh_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = fresh_database
    migrate.upgrade(url)
    seed(url, f"c_{uuid.uuid4().hex[:10]}", unique("alice"))
    report = cli_json(capsys, "--url", url, "audit", "verify")
    assert report["ok"] is True and all(c["ok"] for c in report["checks"])
    assert set(report["tables"]) == {
        "pgmemory_memory_audit",
        "pgmemory_recall_audit",
        "pgmemory_fact_audit",
    }
    assert "audit intact" in cli(capsys, "--url", url, "audit", "verify")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("ALTER TABLE pgmemory_fact_audit DISABLE TRIGGER pgmemory_audit_guard")
        )
    engine.dispose()
    assert run(["--url", url, "audit", "verify"]) == 1  # a report, not an error: on stdout
    out = capsys.readouterr().out
    assert (
        "FAILED" in out and "pgmemory_fact_audit: trigger pgmemory_audit_guard is disabled" in out
    )
    assert "audit NOT intact" in out
    status = cli(capsys, "--url", url, "audit", code=2)
    assert "audit needs --user USER" in status


def test_db_roles_creates_a_role_that_runs_the_cli_but_cannot_change_the_audit(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    role, password = f"pgmemory_cli_{uuid.uuid4().hex[:8]}", "a long test password"
    monkeypatch.setenv("PGMEMORY_TEST_ROLE_PASSWORD", password)
    report = cli_json(
        capsys, "--url", database_url, "db", "roles", role,
        "--password-env", "PGMEMORY_TEST_ROLE_PASSWORD",
    )  # fmt: skip
    try:
        assert report["role"] == role and report["created"] is True
        assert all(password not in s for s in report["statements"])
        assert any(
            s.startswith("GRANT SELECT, INSERT ON pgmemory_memory_audit")
            for s in report["statements"]
        )
        as_app = make_url(database_url).set(username=role, password=password)
        app_url = as_app.render_as_string(hide_password=False)
        seed(app_url, f"c_{uuid.uuid4().hex[:10]}", unique("bob"))
        verified = json.loads(cli(capsys, "--url", app_url, "audit", "verify", "--json"))
        assert verified["ok"] is True
        engine = sa.create_engine(app_url)
        try:
            with (
                pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
                engine.begin() as conn,
            ):
                conn.execute(sa.text("DELETE FROM pgmemory_memory_audit"))
        finally:
            engine.dispose()
        said = cli(
            capsys, "--url", database_url, "db", "roles", role,
            "--password-env", "PGMEMORY_TEST_ROLE_PASSWORD",
        )  # fmt: skip
        hint = make_url(database_url).set(username=role, password="PASSWORD")
        assert f"PGMEMORY_DATABASE_URL={hint.render_as_string(hide_password=False)}" in said
        assert password not in said and "embedded server" not in said
        # Again: the role is reset, not duplicated.
        again = cli_json(
            capsys, "--url", database_url, "db", "roles", role,
            "--password-env", "PGMEMORY_TEST_ROLE_PASSWORD",
        )  # fmt: skip
        assert again["created"] is False
    finally:
        owner = sa.create_engine(database_url)
        with owner.begin() as conn:
            conn.execute(sa.text(f'DROP OWNED BY "{role}"'))
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        owner.dispose()


def test_db_roles_without_a_password_or_with_a_bad_name_is_one_line() -> None:
    out = console("db", "roles", "pgmemory_app", "--password-env", "PGMEMORY_UNSET_VARIABLE_X")
    assert out.returncode == 2 and "no password: set the environment variable" in out.stderr
    out = console("db", "roles", 'app"; DROP TABLE x; --')
    assert out.returncode == 2 and "role name must be" in out.stderr


def test_db_roles_on_the_embedded_server_says_what_its_url_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no URL the role is made on the embedded server, whose socket exists only while a
    pgmemory process runs it: the hint says so instead of only naming PGMEMORY_DATABASE_URL."""
    monkeypatch.delenv("PGMEMORY_DATABASE_URL", raising=False)
    monkeypatch.setenv("PGMEMORY_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PGMEMORY_TEST_ROLE_PASSWORD", "a long test password")
    assert run(["db", "upgrade"]) == 0
    capsys.readouterr()
    out = cli(
        capsys, "db", "roles", "pgmemory_app", "--password-env", "PGMEMORY_TEST_ROLE_PASSWORD"
    )
    hint = out.strip().splitlines()[-1]
    assert "PGMEMORY_DATABASE_URL=" in hint and "pgmemory_app:PASSWORD@" in hint
    assert f"embedded server of {tmp_path / 'data'}" in hint
    assert "a long test password" not in out
