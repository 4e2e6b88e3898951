"""examples/fastapi_app.py, served in-process through its real ASGI app and lifespan."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.openai_server import OpenAIServer

pytest.importorskip("fastapi", reason="the FastAPI example needs the 'test' extra (fastapi)")
from fastapi.testclient import TestClient

EXAMPLE = Path(__file__).parents[2] / "examples" / "fastapi_app.py"


@pytest.fixture
def example(
    database_url: str, openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    monkeypatch.setenv("PGMEMORY_DATABASE_URL", database_url)
    monkeypatch.setenv("PGMEMORY_OPENAI_BASE_URL", openai_server.url)
    monkeypatch.setenv("PGMEMORY_OPENAI_API_KEY", "test")
    monkeypatch.setenv("PGMEMORY_OPENAI_MAX_RETRIES", "0")
    spec = importlib.util.spec_from_file_location("fastapi_app_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    yield module


def _memory_text(body: dict) -> str:
    return "\n".join(str(m.get("content")) for m in body["messages"] if m["role"] == "user")


def test_each_user_remembered_and_isolated(
    example: ModuleType, openai_server: OpenAIServer
) -> None:
    openai_server.queue("Noted: no spicy food.", "Here is a mild dish.", "Here is a dish.")
    with TestClient(example.app) as client:
        first = client.post(
            "/chat", json={"message": "I can't eat spicy food"}, headers={"X-User-Id": "alice"}
        )
        assert first.status_code == 200, first.text
        assert first.json()["reply"] == "Noted: no spicy food."

        later = client.post(
            "/chat", json={"message": "Order me a meal"}, headers={"X-User-Id": "alice"}
        )
        assert later.status_code == 200, later.text
        assert later.json()["session_id"] != first.json()["session_id"]
        assert "spicy" in _memory_text(openai_server.requests[1])

        bob = client.post(
            "/chat", json={"message": "Order me a meal"}, headers={"X-User-Id": "bob"}
        )
        assert bob.status_code == 200, bob.text
        assert "spicy" not in _memory_text(openai_server.requests[2])

        # Continuing a session: its history comes back from PostgreSQL.
        openai_server.queue("Same session.")
        again = client.post(
            "/chat",
            json={"message": "And a drink", "session_id": first.json()["session_id"]},
            headers={"X-User-Id": "alice"},
        )
        assert again.status_code == 200, again.text
        sent = [m.get("content") for m in openai_server.requests[3]["messages"]]
        assert "I can't eat spicy food" in sent and "Noted: no spicy food." in sent


def test_bad_input_is_a_400(example: ModuleType, openai_server: OpenAIServer) -> None:
    with TestClient(example.app) as client:
        reply = client.post(
            "/chat", json={"message": "hi", "session_id": "   "}, headers={"X-User-Id": "alice"}
        )
        assert reply.status_code == 400
        assert "session_id" in reply.json()["detail"]
        assert openai_server.requests == []


def test_a_blank_user_is_a_403(example: ModuleType, openai_server: OpenAIServer) -> None:
    with TestClient(example.app) as client:
        reply = client.post("/chat", json={"message": "hi"}, headers={"X-User-Id": " "})
        assert reply.status_code == 403, reply.text
        assert openai_server.requests == []
