"""A real OpenAI-compatible chat-completions server for tests (stdlib only).

It listens on 127.0.0.1 (a free port), plays scripted replies, and records every request body,
so tests drive the real ``openai`` client over HTTP instead of mocking it::

    with OpenAIServer() as server:
        server.queue(text("Hello!"), tool_calls(call("GetMenu", {})), text("Done"))
        client = OpenAIChatCompletionClient(model="test", base_url=server.url, api_key="test")
        ...
        assert server.requests[0]["messages"][-1]["content"] == "hi"

A reply is a :class:`Reply` (helpers: :func:`text`, :func:`tool_calls` with :func:`call`,
:func:`json_reply`, :func:`error`). The same reply serves a plain request and a streaming one
(``"stream": true``), which gets it as server-sent-event chunks: the text in small pieces and
each tool call's arguments in fragments, like the real API.

Instead of (or after) a queue, ``server.responder`` may be a callable taking the request body
(a dict) and returning a :class:`Reply`, a ``str`` (a text reply) or a dict (a JSON reply).
When neither has a reply, the server answers HTTP 400 naming the request, so the test fails
with a clear message rather than hanging.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


@dataclass(frozen=True)
class ToolCall:
    """One tool call the scripted model makes."""

    name: str
    arguments: str
    id: str


@dataclass(frozen=True)
class Reply:
    """One scripted model reply.

    ``content`` is the assistant text, ``tool_calls`` the calls it makes (several = parallel
    calls). ``status``/``error`` make the server fail the request instead. ``chunk_size`` is
    how many characters of text (or arguments) go into each streamed chunk.
    """

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    status: int = 200
    error: str | None = None
    usage: Mapping[str, int] | None = None
    chunk_size: int = 3
    delay_s: float = 0.0
    #: Answer 200 with this body (``text/html``) instead of a completion: a proxy's page.
    page: str | None = None

    @property
    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


def text(content: str, **options: Any) -> Reply:
    """A plain text reply."""
    return Reply(content=content, **options)


def call(
    name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None
) -> ToolCall:
    """A tool call; ``arguments`` is a dict (encoded to JSON) or raw JSON text."""
    if arguments is None:
        arguments = {}
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(name=name, arguments=args, id=id or f"call_{next(_ids)}")


def tool_calls(*calls: ToolCall, content: str | None = None, **options: Any) -> Reply:
    """A reply that calls one or more tools (several calls = parallel tool calls)."""
    return Reply(content=content, tool_calls=tuple(calls), **options)


def json_reply(value: Any, **options: Any) -> Reply:
    """A structured-output reply: ``value`` encoded as the message's JSON text."""
    return Reply(content=json.dumps(value, ensure_ascii=False), **options)


def error(status: int, message: str = "scripted failure") -> Reply:
    """Fail the request with HTTP ``status`` and an OpenAI-style error body.

    Note that the ``openai`` client retries 408/409/429/5xx unless ``max_retries=0``."""
    return Reply(status=status, error=message)


def page(body: str = "<html><body>Sign in to continue</body></html>") -> Reply:
    """Answer 200 with an HTML page instead of a completion (a captive portal or a proxy)."""
    return Reply(page=body)


Responder = Callable[[dict[str, Any]], "Reply | str | Mapping[str, Any]"]


def _as_reply(value: Any) -> Reply:
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return text(value)
    if isinstance(value, Mapping):
        return json_reply(dict(value))
    raise TypeError(f"a responder must return Reply, str or dict, not {type(value).__name__}")


def _pieces(value: str, size: int) -> Iterator[str]:
    size = max(1, size)
    for start in range(0, len(value), size):
        yield value[start : start + size]


class OpenAIServer:
    """The server. Use as a context manager, or call :meth:`start` / :meth:`stop`.

    Attributes: ``url`` (the base URL to give the client, ending in ``/v1``), ``requests``
    (every request body, in order), ``headers`` (the matching request headers, names lower-cased), ``responder``.
    """

    def __init__(
        self, replies: Any = (), *, responder: Responder | None = None, model: str = "test-model"
    ) -> None:
        self._replies: deque[Reply] = deque(_as_reply(r) for r in replies)
        self.responder: Responder | None = responder
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting -------------------------------------------------------------------------

    def queue(self, *replies: Reply | str | Mapping[str, Any]) -> OpenAIServer:
        """Append replies; each request takes the next one."""
        with self._lock:
            self._replies.extend(_as_reply(r) for r in replies)
        return self

    @property
    def pending(self) -> int:
        """Replies queued but not yet played."""
        return len(self._replies)

    @property
    def last_request(self) -> dict[str, Any]:
        """The most recent request body."""
        if not self.requests:
            raise AssertionError("the test server has received no request yet")
        return self.requests[-1]

    def _next_reply(self, body: dict[str, Any]) -> Reply | None:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        if self.responder is not None:
            return _as_reply(self.responder(body))
        return None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the test server is not running; call start() or use 'with'")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIServer:
        """Bind a free port on 127.0.0.1 and serve in a daemon thread."""
        if self._httpd is not None:
            return self
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="openai-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Shut the server down."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- building responses -----------------------------------------------------------------

    def completion(self, reply: Reply) -> dict[str, Any]:
        """The JSON body of a non-streaming chat completion for ``reply``."""
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in reply.tool_calls
            ]
        return {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": reply.finish, "logprobs": None}
            ],
            "usage": dict(
                reply.usage or {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            ),
        }

    def chunks(self, reply: Reply, *, include_usage: bool) -> Iterator[dict[str, Any]]:
        """The chunk bodies of a streamed chat completion for ``reply``."""
        cid = f"chatcmpl-{next(_ids)}"
        base = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                ],
            }

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(reply.content or "", reply.chunk_size):
            yield chunk({"content": piece})
        for index, c in enumerate(reply.tool_calls):
            yield chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": ""},
                        }
                    ]
                }
            )
            for piece in _pieces(c.arguments, reply.chunk_size):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, reply.finish)
        if include_usage:
            usage = dict(
                reply.usage or {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            )
            yield {**base, "choices": [], "usage": usage}


def _tool_sequence_problem(messages: list[Mapping[str, Any]]) -> str | None:
    """What the real chat-completions API would reject about tool calls and results: a tool
    message must answer a call of the assistant message before it, and every call must be
    answered before the next non-tool message."""
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_calls:
                return f"messages[{i}]: tool message answers unknown tool_call_id {call_id!r}"
            open_calls.discard(call_id)
            continue
        if open_calls:
            return f"messages[{i}]: tool calls {sorted(open_calls)} were not answered before it"
        if role == "assistant":
            open_calls = {c.get("id") for c in message.get("tool_calls") or []}
    if open_calls:
        return f"tool calls {sorted(open_calls)} were not answered"
    return None


class _Handler(BaseHTTPRequestHandler):
    owner: OpenAIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _send_json(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send_json(
                200, {"object": "list", "data": [{"id": self.owner.model, "object": "model"}]}
            )
        else:
            self._send_json(
                404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
            )

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send_json(
                404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
            )
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as exc:
            self._send_json(
                400, {"error": {"message": f"bad JSON: {exc}", "type": "invalid_request_error"}}
            )
            return
        problem = _tool_sequence_problem(body.get("messages") or [])
        if problem:  # the real API refuses these too, so a client bug cannot pass unnoticed
            self._send_json(400, {"error": {"message": problem, "type": "invalid_request_error"}})
            return
        owner = self.owner
        with owner._lock:
            owner.requests.append(body)
            owner.headers.append({k.lower(): v for k, v in self.headers.items()})
            number = len(owner.requests)
        try:
            reply = owner._next_reply(body)
        except Exception as exc:  # a failing responder fails the request, visibly
            self._send_json(
                500, {"error": {"message": f"responder raised {exc!r}", "type": "server_error"}}
            )
            return
        if reply is None:
            self._send_json(
                400,
                {
                    "error": {
                        "message": f"test server: no scripted reply left for request #{number}",
                        "type": "invalid_request_error",
                    }
                },
            )
            return
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.page is not None:
            payload = reply.page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if reply.error is not None or reply.status != 200:
            self._send_json(
                reply.status,
                {"error": {"message": reply.error or "error", "type": "scripted_error"}},
            )
            return
        if not body.get("stream"):
            self._send_json(200, owner.completion(reply))
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for item in owner.chunks(reply, include_usage=include_usage):
            self.wfile.write(f"data: {json.dumps(item, ensure_ascii=False)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


__all__ = [
    "OpenAIServer",
    "Reply",
    "Responder",
    "ToolCall",
    "call",
    "error",
    "json_reply",
    "page",
    "text",
    "tool_calls",
]
