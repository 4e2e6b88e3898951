"""OpenAIChatClient against the scripted server: request shape, tools, tool choice, streaming,
structured output, errors, and the API key staying out of reprs and logs."""

from __future__ import annotations

import logging

import openai
import pytest
from pydantic import BaseModel

from pgmemory.errors import InvalidInputError, StructuredOutputError
from pgmemory.runtime.chat import ChatResponse
from pgmemory.runtime.messages import FunctionCallContent, FunctionResultContent, Message
from pgmemory.runtime.openai_client import OpenAIChatClient
from pgmemory.runtime.tools import tool
from tests.openai_server import OpenAIServer, call, error, json_reply, text, tool_calls


def get_menu() -> list[str]:
    """Return today's dishes."""
    return ["番茄炒蛋"]


class UserFacts(BaseModel):
    name: str | None
    age: int | None


async def test_text_reply_and_request_shape(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    openai_server.queue(
        text("Hello!", usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7})
    )
    history = [
        Message("system", "Be kind."),
        Message("user", "hi", author_name="alice"),
        Message("assistant", contents=[FunctionCallContent("c9", "get_menu", "{}")]),
        Message("tool", contents=[FunctionResultContent("c9", ["a", "b"])]),
    ]
    reply = await chat_client.get_response(history, options={"temperature": 0.2})
    assert reply.text == "Hello!" and reply.finish_reason == "stop"
    assert reply.usage == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    body = openai_server.last_request
    assert body["model"] == "test-model" and body["temperature"] == 0.2
    assert body["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "hi", "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c9",
                    "type": "function",
                    "function": {"name": "get_menu", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c9", "content": '["a", "b"]'},
    ]
    assert openai_server.headers[-1]["authorization"] == "Bearer test"


async def test_tools_and_tool_choice(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    menu = tool(get_menu, name="GetMenu")
    openai_server.queue(tool_calls(call("GetMenu", {}, id="x1"), call("GetMenu", {}, id="x2")))
    reply = await chat_client.get_response(
        [Message("user", "menu?")], tools=[menu], tool_choice="GetMenu"
    )
    assert [c.call_id for c in reply.function_calls] == ["x1", "x2"]
    assert reply.finish_reason == "tool_calls"
    body = openai_server.last_request
    assert body["tools"][0]["function"]["name"] == "GetMenu"
    assert body["tool_choice"] == {"type": "function", "function": {"name": "GetMenu"}}
    with pytest.raises(InvalidInputError, match="tool_choice 'Nope' names no tool"):
        await chat_client.get_response([Message("user", "x")], tools=[menu], tool_choice="Nope")


async def test_streaming_assembles_text_and_tool_calls(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    openai_server.queue(
        tool_calls(
            call("GetMenu", {"kind": "素菜"}, id="s1"),
            call("PlaceOrder", {"n": 2}, id="s2"),
            content="Checking",
        ),
    )
    updates = [u async for u in chat_client.get_streaming_response([Message("user", "go")])]
    assert len([u for u in updates if u.text]) > 1  # really streamed in pieces
    assert openai_server.last_request["stream"] is True
    reply = ChatResponse.from_updates(updates)
    assert reply.text == "Checking"
    assert [(c.name, c.parse_arguments()) for c in reply.function_calls] == [
        ("GetMenu", {"kind": "素菜"}),
        ("PlaceOrder", {"n": 2}),
    ]
    assert reply.finish_reason == "tool_calls" and reply.usage["total_tokens"] == 2
    assert (
        len({u.message_id for u in updates})
        == 1
        == len({reply.messages[0].message_id, updates[0].message_id})
    )


async def test_structured_output_with_a_pydantic_model(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    openai_server.queue(json_reply({"name": "Alice", "age": 30}))
    reply = await chat_client.get_response(
        [Message("user", "I am Alice, 30.")], response_format=UserFacts
    )
    assert reply.value == UserFacts(name="Alice", age=30)
    fmt = openai_server.last_request["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "UserFacts"
    assert fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["additionalProperties"] is False
    assert sorted(fmt["json_schema"]["schema"]["required"]) == ["age", "name"]

    openai_server.queue(json_reply({"name": 5}))
    with pytest.raises(StructuredOutputError, match="does not match"):
        await chat_client.get_response([Message("user", "x")], response_format=UserFacts)

    raw = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    openai_server.queue(json_reply({"any": [1]}))
    reply = await chat_client.get_response([Message("user", "x")], response_format=raw)
    assert reply.value == {"any": [1]}
    with pytest.raises(InvalidInputError, match="response_format type 'xml'"):
        await chat_client.get_response([Message("user", "x")], response_format={"type": "xml"})


async def test_responder_decides_from_the_request(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    openai_server.responder = lambda body: f"you said {body['messages'][-1]['content']}"
    reply = await chat_client.get_response([Message("user", "ping")])
    assert reply.text == "you said ping"


async def test_errors_propagate_and_empty_script_is_explicit(
    openai_server: OpenAIServer, chat_client: OpenAIChatClient
) -> None:
    openai_server.queue(error(401, "bad key"))
    with pytest.raises(openai.AuthenticationError, match="bad key"):
        await chat_client.get_response([Message("user", "x")])
    with pytest.raises(openai.BadRequestError, match="no scripted reply left for request #2"):
        await chat_client.get_response([Message("user", "x")])


async def test_api_key_never_shown(
    openai_server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    from pydantic import SecretStr

    client = OpenAIChatClient(
        model="m", base_url=openai_server.url, api_key=SecretStr("sk-secret-123"), max_retries=0
    )
    caplog.set_level(logging.DEBUG)
    openai_server.queue(text("ok"))
    await client.get_response([Message("user", "x")])
    await client.aclose()
    assert "sk-secret-123" not in repr(client)
    assert "sk-secret-123" not in caplog.text
    assert openai_server.headers[-1]["authorization"] == "Bearer sk-secret-123"


def test_constructor_errors_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(InvalidInputError, match="no API key for api.openai.com"):
        OpenAIChatClient(model="gpt-4o-mini")
    with pytest.raises(InvalidInputError, match="model '' is blank"):
        OpenAIChatClient(model="", base_url="http://127.0.0.1:1/v1")
    local = OpenAIChatClient(model="llama", base_url="http://127.0.0.1:1/v1")
    assert local.base_url.startswith("http://127.0.0.1:1/v1")

    from pgmemory.settings import Settings

    settings = Settings(
        _env_file=None,
        openai_base_url="http://127.0.0.1:2/v1",
        openai_api_key="k",
        openai_chat_model="x",
    )  # type: ignore[call-arg]
    client = OpenAIChatClient.from_settings(settings)
    assert client.model == "x" and client.base_url.startswith("http://127.0.0.1:2/v1")


async def test_the_test_server_rejects_what_the_real_api_rejects(openai_server) -> None:
    """A tool result without its call (or a call left unanswered) is a 400, as on the real API,
    so a runtime bug that builds such a request cannot pass the tests unnoticed."""
    import openai

    client = openai.AsyncOpenAI(base_url=openai_server.url, api_key="test", max_retries=0)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    bad = [
        [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "x"}],
        [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "user", "content": "next"},
        ],
    ]
    for messages in bad:
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="m", messages=messages)
    assert openai_server.requests == []
    await client.close()
