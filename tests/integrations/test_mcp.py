"""``pgmemory mcp`` end to end: the real server process, spoken to by the MCP SDK's own client,
over stdio (one user) and streamable HTTP (a token per user)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import httpx2
from agent_framework import Agent
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel
from sqlalchemy import text

from pgmemory import FactMemoryProvider, MemoryRecord, MemoryScope, MemoryStore
from pgmemory.admin import Admin
from pgmemory.vocabulary import FACTS_NAMESPACE
from tests.conftest import unique
from tests.openai_server import OpenAIServer, json_reply, text as text_reply
from tests.servers import free_port

TOOLS = {"search_memories", "add_memory", "list_recent", "forget_memory", "get_facts"}


def result(call: Any) -> Any:
    """A successful tool call's structured result (a list tool's under ``result``)."""
    assert not call.is_error, call.content
    value = call.structured_content
    return value["result"] if set(value) == {"result"} else value


def error_text(call: Any) -> str:
    assert call.is_error
    return " ".join(getattr(c, "text", "") for c in call.content)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PGMEMORY_DATABASE_URL")}


async def _audited(engine: Any, user: str) -> tuple[int, int]:
    """(recall-audit rows by the MCP server, memory-audit rows with its actor) of a user."""
    async with engine.connect() as conn:
        recalls = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pgmemory_recall_audit WHERE user_id = :u AND provider = 'mcp'"
                ),
                {"u": user},
            )
        ).scalar_one()
        writes = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pgmemory_memory_audit WHERE user_id = :u AND actor = 'mcp'"
                ),
                {"u": user},
            )
        ).scalar_one()
    return recalls, writes


async def test_stdio_serves_its_user_only_and_refuses_bad_calls(
    store_url: str, store: MemoryStore, owner_engine: Any
) -> None:
    alice, bob = unique("alice"), unique("bob")
    collection = unique("mcp")
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "pgmemory",
            "--url",
            store_url,
            "mcp",
            "--collection",
            collection,
            "--user",
            alice,
        ],
        env=_env(),
    )
    async with Client(server) as client:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        added = result(await client.call_tool("add_memory", {"text": "I keep bees on the roof"}))
        # Bob's memory, in the same collection, stored by the application itself.
        await store.add(
            collection, [MemoryRecord(content="I keep bees too", scope=MemoryScope(user_id=bob))]
        )
        found = result(await client.call_tool("search_memories", {"query": "bees", "limit": 5}))
        assert [f["id"] for f in found] == [added["id"]]  # alice's only
        recent = result(await client.call_tool("list_recent", {}))
        assert [r["text"] for r in recent] == ["I keep bees on the roof"]
        await store.merge_facts(FACTS_NAMESPACE, MemoryScope(user_id=alice), {"city": "Lyon"})
        assert result(await client.call_tool("get_facts", {})) == {"city": "Lyon"}

        named = await client.call_tool("search_memories", {"query": "bees", "user_id": bob})
        assert "takes no argument 'user_id'" in error_text(named)
        assert "never an argument" in error_text(named)
        # a typo is answered with the arguments the tool takes, not the binding's warning
        typo = error_text(await client.call_tool("add_memory", {"content": "I like tea"}))
        assert "takes no argument 'content'; it takes 'text'" in typo
        assert "binding" not in typo
        bad = await client.call_tool("search_memories", {"query": "bees", "limit": "lots"})
        assert "limit" in error_text(bad)
        wrong_id = await client.call_tool("forget_memory", {"memory_id": "not-a-uuid"})
        assert "UUID" in error_text(wrong_id)  # the store's refusal, as a tool error

        bobs = await store.list(collection, MemoryScope(user_id=bob))
        assert result(await client.call_tool("forget_memory", {"memory_id": str(bobs[0].id)})) == {
            "deleted": 0
        }
        assert result(await client.call_tool("forget_memory", {"memory_id": added["id"]})) == {
            "deleted": 1
        }
        assert result(await client.call_tool("list_recent", {})) == []
    assert len(await store.list(collection, MemoryScope(user_id=bob))) == 1
    recalls, writes = await _audited(owner_engine, alice)
    assert recalls >= 1 and writes == 2  # the add and the forget, audited with actor mcp


@contextlib.contextmanager
def http_server(url: str, collection: str) -> Iterator[str]:
    """``pgmemory mcp --http`` in a process of its own; yields its endpoint."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgmemory",
            "--url",
            url,
            "mcp",
            "--collection",
            collection,
            "--http",
            "--port",
            str(port),
        ],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    endpoint = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            with contextlib.suppress(httpx.TransportError):
                httpx.get(endpoint, timeout=1)
                break
            time.sleep(0.2)
        yield endpoint
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.asynccontextmanager
async def signed_in(endpoint: str, token: str) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    async with http, Client(streamable_http_client(endpoint, http_client=http)) as client:
        yield client


async def test_http_gives_each_token_its_own_user(database_url: str) -> None:
    alice, bob = unique("alice"), unique("bob")
    collection = unique("mcp")
    async with MemoryStore(database_url) as owner:  # the tokens are the owner's to issue
        admin = Admin(owner)
        alice_token = (await admin.issue_token(alice, purpose="mcp")).token
        bob_token = (await admin.issue_token(bob, purpose="mcp")).token
        page_token = (await admin.issue_token(unique("page"), purpose="ui")).token
        with http_server(database_url, collection) as endpoint:
            async with signed_in(endpoint, alice_token) as as_alice:
                assert {t.name for t in (await as_alice.list_tools()).tools} == TOOLS
                mine = result(await as_alice.call_tool("add_memory", {"text": "my locker is 42"}))
            async with signed_in(endpoint, bob_token) as as_bob:
                assert result(await as_bob.call_tool("search_memories", {"query": "locker"})) == []
                assert result(
                    await as_bob.call_tool("forget_memory", {"memory_id": mine["id"]})
                ) == {"deleted": 0}
            async with signed_in(endpoint, alice_token) as as_alice:
                found = result(await as_alice.call_tool("search_memories", {"query": "locker"}))
                assert [f["id"] for f in found] == [mine["id"]]

            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
            headers = {"Accept": "application/json, text/event-stream"}
            for refused in ({}, {"Authorization": "Bearer nope"},
                            {"Authorization": f"Bearer {page_token}"}):  # fmt: skip
                answer = httpx.post(endpoint, json=call, headers={**headers, **refused})
                assert answer.status_code == 401, answer.text
                assert alice not in answer.text and "locker" not in answer.text
            await admin.revoke_token(bob)
            answer = httpx.post(
                endpoint, json=call, headers={**headers, "Authorization": f"Bearer {bob_token}"}
            )
            assert answer.status_code == 401  # revoked: refused at once
            foreign = httpx.post(
                endpoint,
                json=call,
                headers={
                    **headers,
                    "Authorization": f"Bearer {alice_token}",
                    "Host": "attacker.example",
                },
            )
            assert foreign.status_code in (400, 403, 421), foreign.status_code
        kept = await owner.list(collection, MemoryScope(user_id=alice))
        assert [m.content for m in kept] == ["my locker is 42"]  # bob's forget deleted nothing


async def test_get_facts_by_default_reads_what_fact_memory_writes(
    store_url: str, store: MemoryStore, openai_server: OpenAIServer, chat_client: Any
) -> None:
    """A FactMemoryProvider left at its defaults extracts facts in a real agent run; `pgmemory
    mcp` started without --facts-namespace shows exactly them through get_facts."""
    alice = unique("alice")

    class UserInfo(BaseModel):
        name: str | None = None
        city: str | None = None

    facts = FactMemoryProvider(store, chat_client, UserInfo, user_id=alice)
    agent = Agent(chat_client, "Be brief.", context_providers=[facts])
    openai_server.queue(text_reply("Hi Ana!"), json_reply({"name": "Ana", "city": "Lyon"}))
    await agent.run("I'm Ana and I live in Lyon", session=agent.create_session())
    assert await store.get_facts(facts.namespace, MemoryScope(user_id=alice)) == {
        "name": "Ana",
        "city": "Lyon",
    }
    server = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "pgmemory",
            "--url",
            store_url,
            "mcp",
            "--collection",
            unique("mcp"),
            "--user",
            alice,
        ],
        env=_env(),
    )
    async with Client(server) as client:
        shown = result(await client.call_tool("get_facts", {}))
    assert shown == {"name": "Ana", "city": "Lyon"}
