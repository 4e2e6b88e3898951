"""``pgmemory token create|list|revoke``: a token is printed once and never listed; revoking it
locks it out at once; mistakes are one line."""

from __future__ import annotations

import asyncio

import pytest

from pgmemory.admin import Admin
from pgmemory.store.store import MemoryStore
from tests.cli.test_cli import cli, cli_json, settings, unique


def verify(url: str, token: str, purpose: str = "ui") -> bool:
    async def check() -> bool:
        async with MemoryStore(url, settings=settings()) as store:
            return await Admin(store).verify_token(token, purpose=purpose) is not None

    return asyncio.run(check())


def test_create_list_revoke(database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    name = unique("laptop")
    made = cli_json(capsys, "token", "create", name, "--expires-in", "2d", "--url", database_url)
    token = made["token"]
    assert token.startswith("pgm_") and made["name"] == name and made["purpose"] == "ui"
    assert verify(database_url, token) and not verify(database_url, token, "mcp")
    listed = cli(capsys, "token", "list", "--url", database_url, "--json")
    assert name in listed and token not in listed and made["token"][4:] not in listed
    plain = cli(
        capsys, "token", "create", unique("robot"), "--purpose", "mcp", "--url", database_url
    )
    assert plain.splitlines()[0].startswith("pgm_") and "shown only now" in plain
    assert verify(database_url, plain.splitlines()[0], "mcp")
    # A second live token of that name: one line saying what to do.
    again = cli(capsys, "token", "create", name, "--url", database_url, code=2)
    assert "already named" in again and "revoke" in again
    revoked = cli_json(capsys, "token", "revoke", name, "--url", database_url)
    assert revoked["name"] == name and revoked["revoked_at"] is not None
    assert not verify(database_url, token)
    gone = cli(capsys, "token", "revoke", name, "--url", database_url, code=1)
    assert "no live token" in gone
    assert name not in cli(capsys, "token", "list", "--url", database_url)
    assert name in cli(capsys, "token", "list", "--all", "--url", database_url)
    for bad in (["--expires-in", "400d"], ["--purpose", "root"]):
        message = cli(capsys, "token", "create", unique("x"), *bad, "--url", database_url, code=2)
        assert "lifetime" in message or "purpose" in message
