"""Read-your-writes bookkeeping and the read-URL setting, without servers."""

from __future__ import annotations

import pytest

from pgmemory.settings import Settings
from pgmemory.store._engine import replicas
from pgmemory.store._engine.replicas import WriteMarks, parse_lsn


def test_parse_lsn_orders_positions_as_postgresql_does() -> None:
    assert parse_lsn("0/0") == 0
    assert parse_lsn("0/16B3748") == 0x16B3748
    assert parse_lsn("1/0") == 1 << 32
    assert parse_lsn("16/B374D848") > parse_lsn("15/FFFFFFFF")


def test_a_users_reads_wait_for_that_users_writes_only() -> None:
    marks = WriteMarks()
    assert marks.needed("alice") == 0 and marks.needed(None) == 0
    marks.note({"alice"}, 100)
    assert marks.needed("alice") == 100
    assert marks.needed("bob") == 0  # bob's reads need not wait for alice's write
    assert marks.needed(None) == 100  # a read across users waits for every write
    marks.note({"alice"}, 50)  # an older position never lowers the mark
    assert marks.needed("alice") == 100


def test_a_write_of_unnamed_users_holds_every_read() -> None:
    marks = WriteMarks()
    marks.note(None, 70)
    assert marks.needed("anyone") == 70
    marks.note({"carol"}, 90)
    assert marks.needed("carol") == 90 and marks.needed("dave") == 70


def test_a_lost_position_sends_every_read_to_the_primary_for_a_while() -> None:
    marks = WriteMarks()
    marks.note_unknown(60)
    assert marks.needed("alice") is None and marks.needed(None) is None
    marks.note_unknown(0)  # never shortens the primary-only window
    assert marks.needed("alice") is None


def test_forgotten_users_raise_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replicas, "MAX_TRACKED_USERS", 2)
    marks = WriteMarks()
    marks.note({"a"}, 10)
    marks.note({"b"}, 20)
    marks.note({"c"}, 30)  # "a" is forgotten: its position becomes everyone's floor
    assert marks.needed("a") == 10 and marks.needed("zed") == 10
    assert marks.needed("c") == 30


def test_read_urls_split_at_commas_and_stay_secret() -> None:
    settings = Settings(_env_file=None, read_urls=" postgresql://r:pw@a/db, ,postgresql://b/db ")  # type: ignore[call-arg]
    assert settings.read_url_list() == ["postgresql://r:pw@a/db", "postgresql://b/db"]
    assert "pw" not in repr(settings)
    assert Settings(_env_file=None).read_url_list() == []  # type: ignore[call-arg]
