"""Settings: a ``.env`` file is read only when asked for, and what is asked for wins in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgmemory.embedders import make_embedder
from pgmemory.errors import InvalidInputError
from pgmemory.settings import ENV_FILE_VARIABLE, Settings


@pytest.fixture
def env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``.env`` in a temporary working directory, with no PGMEMORY_* variable set."""
    for name in list(os.environ):
        if name.startswith("PGMEMORY_"):
            monkeypatch.delenv(name)
    path = tmp_path / ".env"
    path.write_text("PGMEMORY_EMBEDDER=minilm\nPGMEMORY_MAX_TEXT_CHARS=7\nOTHER_TOOL=x\n")
    monkeypatch.chdir(tmp_path)
    return path


def test_a_dotenv_in_the_working_directory_is_ignored_by_default(env_file: Path) -> None:
    settings = Settings()
    assert settings.embedder == "use"
    assert settings.max_text_chars == 32_000


def test_a_file_is_read_when_asked_for(env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for settings in (Settings.from_env_file(env_file), Settings(_env_file=env_file)):  # type: ignore[call-arg]
        assert (settings.embedder, settings.max_text_chars) == ("minilm", 7)
    # The environment wins over the file; keyword arguments win over both.
    monkeypatch.setenv("PGMEMORY_MAX_TEXT_CHARS", "9")
    settings = Settings.from_env_file(env_file, embedder="openai")
    assert (settings.embedder, settings.max_text_chars) == ("openai", 9)


def test_the_environment_can_name_the_file(
    env_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "conf" / "pgmemory.env"
    elsewhere.parent.mkdir()
    elsewhere.write_text("PGMEMORY_EMBEDDER=minilm\n")
    monkeypatch.setenv(ENV_FILE_VARIABLE, str(elsewhere))
    assert Settings().embedder == "minilm"
    # ...including the Settings() the library makes itself.
    assert make_embedder(cache=False).dimensions == 384
    # An explicit file replaces the one the environment names.
    other = tmp_path / "other.env"
    other.write_text("PGMEMORY_MAX_TEXT_CHARS=5\n")
    settings = Settings.from_env_file(other)
    assert (settings.embedder, settings.max_text_chars) == ("use", 5)


def test_a_missing_file_is_an_error(env_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidInputError, match=r"from_env_file names .*nope\.env.*does not exist"):
        Settings.from_env_file("nope.env")
    monkeypatch.setenv(ENV_FILE_VARIABLE, "nope.env")
    with pytest.raises(InvalidInputError, match=rf"{ENV_FILE_VARIABLE} names .*nope\.env"):
        Settings()


def test_cli_reads_an_env_file_only_when_given(env_file: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgmemory", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ},
        )

    env_file.write_text("PGMEMORY_DATABASE_URL=postgresql://nobody@127.0.0.1:1/none\n")
    missing = cli("--env-file", "nope.env", "collections")
    assert missing.returncode == 2
    assert missing.stderr.startswith("pgmemory: error: Settings.from_env_file names")
    # With the file, the CLI tries the URL it names (and fails to connect: nothing listens).
    given = cli("--env-file", str(env_file), "db", "current")
    assert given.returncode != 0 and "127.0.0.1" in given.stderr
