"""The food-delivery agent on agent-framework, with pgmemory as its memory and chat history.

    pip install 'pgmemory[agent-framework]' agent-framework-openai
    python examples/agent_framework_food_delivery.py      # offline: a local stand-in model
    PGMEMORY_OPENAI_BASE_URL=... PGMEMORY_OPENAI_API_KEY=... PGMEMORY_OPENAI_CHAT_MODEL=... \\
        python examples/agent_framework_food_delivery.py  # any OpenAI-compatible endpoint

The agent is agent-framework's own ``Agent`` with its OpenAI chat-completions client; the
switch to pgmemory is the three provider lines in :func:`build_agent`. Offline, the client talks
to a stand-in served on 127.0.0.1 that speaks the chat-completions protocol and decides as
``examples/food_delivery.py``'s replay model does, from what a model would read. For every order
the demo prints what pgmemory injected: Alice's "不能吃辣" reaches her later sessions, Bob never
sees it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import agent_framework as af
from agent_framework.openai import OpenAIChatCompletionClient
from food_delivery import COLLECTION, INSTRUCTIONS, SCRIPT, decide, get_menu, place_order

from pgmemory import MemoryScope, MemoryStore, Settings
from pgmemory.integrations.agent_framework import (
    ChatHistoryMemoryProvider,
    PostgresHistoryProvider,
)


def per_user(session: af.AgentSession) -> ChatHistoryMemoryProvider.State:
    """Store and recall per user; the application put the user id in the session's state."""
    return ChatHistoryMemoryProvider.State(
        storage_scope=MemoryScope(user_id=session.state["user_id"])
    )


class ShowInjected(af.ContextProvider):
    """Prints what the memory provider added to each request (for the demo)."""

    def __init__(self, memory: ChatHistoryMemoryProvider) -> None:
        super().__init__("show_injected")
        self.memory = memory

    async def before_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
        injected = context.context_messages.get(self.memory.source_id, [])
        print("  memory injected:" if injected else "  memory injected: (nothing)")
        for message in injected:
            for line in message.text.splitlines():
                print(f"    | {line}")


def build_agent(client: Any, store: MemoryStore) -> af.Agent:
    """agent-framework's Agent with pgmemory's history and chat-history memory."""
    memory = ChatHistoryMemoryProvider(store, COLLECTION, state_initializer=per_user)
    return af.Agent(
        client,
        INSTRUCTIONS,
        name="FoodDeliveryAgent",
        tools=[af.tool(get_menu, name="GetMenu"), af.tool(place_order, name="PlaceOrder")],
        context_providers=[PostgresHistoryProvider(store), memory, ShowInjected(memory)],
    )


class StandIn(BaseHTTPRequestHandler):
    """A chat-completions endpoint on 127.0.0.1 that answers with :func:`decide`."""

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        messages = body["messages"]
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        called = [
            c["function"]["name"] for m in messages[last_user:] for c in m.get("tool_calls") or []
        ]
        step = decide([(m["role"], str(m.get("content") or "")) for m in messages], called)
        if "call" in step:
            arguments = json.dumps(step["arguments"], ensure_ascii=False)
            call = {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": step["call"], "arguments": arguments},
            }
            message, finish = (
                {"role": "assistant", "content": None, "tool_calls": [call]},
                "tool_calls",
            )
        else:
            message, finish = {"role": "assistant", "content": step["text"]}, "stop"
        reply = json.dumps(
            {
                "id": "chatcmpl-demo",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


async def main() -> None:
    settings = Settings()
    server = None
    if settings.openai_base_url or settings.openai_api_key:
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        client = OpenAIChatCompletionClient(
            model=settings.openai_chat_model, base_url=settings.openai_base_url, api_key=key
        )
        print(
            f"model: {settings.openai_chat_model} at {settings.openai_base_url or 'api.openai.com'}"
        )
    else:
        server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        client = OpenAIChatCompletionClient(model="stand-in", base_url=url, api_key="offline")
        print(f"model: offline stand-in at {url} (set PGMEMORY_OPENAI_* for a real model)")
    try:
        async with MemoryStore(migrate=True, settings=settings) as store:
            await store.create_collection(COLLECTION)  # no-op when it exists with this model
            agent = build_agent(client, store)
            run = uuid.uuid4().hex[:6]  # fresh users each run, so the demo starts from no memories
            for turn, (user, text) in enumerate(SCRIPT, 1):
                session = agent.create_session()
                session.state["user_id"] = f"{user}-{run}"
                print(f"\n#{turn} {user} (new session {session.session_id[:8]}): {text}")
                response = await agent.run(text, session=session)
                for message in response.messages:
                    for content in message.contents:
                        if content.type == "function_call" and content.name == "PlaceOrder":
                            print(f"  PlaceOrder {content.arguments}")
                print(f"  reply: {response.text}")
    finally:
        if server is not None:
            server.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
