"""A scripted OpenAI-compatible chat-completions server for bench/serve/serve.py (stdlib only).

Run as its own process (``python bench/serve/_chat_server.py``) so its work does not share the
application's interpreter lock. It listens on 127.0.0.1 (a free port, printed as
``PORT <n>`` on the first line of stdout), keeps connections alive, and answers every
``POST /v1/chat/completions`` (non-streaming) with a short reply that differs per request
(so the application's embedding cache never hides the cost of embedding it), after an
optional fixed delay standing in for a real model's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time

_PROSE = (
    "noted I will remember that you prefer quiet places near the river and that your "
    "sister visits in spring so we can plan the trip around her schedule next month"
)
WORDS = _PROSE.split()


def reply_for(body: dict) -> str:
    """A deterministic, per-request reply derived from the last user message."""
    messages = body.get("messages") or [{}]
    last = str(messages[-1].get("content", ""))
    digest = hashlib.sha256(last.encode()).digest()
    words = [WORDS[b % len(WORDS)] for b in digest[:12]]
    return f"{' '.join(words).capitalize()} (ref {digest[:4].hex()})."


def completion(body: dict) -> bytes:
    """The chat.completion JSON for a request."""
    content = reply_for(body)
    return json.dumps(
        {
            "id": f"chatcmpl-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "bench-model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 12, "total_tokens": 22},
        }
    ).encode()


async def handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float
) -> None:
    """Serve one keep-alive connection until the client closes it."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip()
                for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method == "POST" and path.endswith("/chat/completions"):
                if delay_s:
                    await asyncio.sleep(delay_s)
                payload, status = completion(json.loads(body or b"{}")), "200 OK"
            else:
                payload, status = b'{"error": {"message": "not found"}}', "404 Not Found"
            writer.write(
                f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main() -> None:
    """Serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=0.0, help="fixed latency per reply")
    args = parser.parse_args()
    delay_s = args.delay_ms / 1000.0
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, delay_s), "127.0.0.1", 0, backlog=1024
    )
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
