"""A chat client over any OpenAI-compatible chat-completions endpoint (``openai.AsyncOpenAI``).

Supports tools and tool choice, streaming, and structured output: pass a pydantic model (or any
type pydantic can validate) as ``response_format`` and the reply's ``value`` is the parsed
object; pass a raw ``{"type": "json_schema", ...}`` dict and ``value`` is the decoded JSON.

The API key is held by the ``openai`` client only; it never appears in reprs or log records.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import openai
import pydantic
from pydantic import SecretStr, TypeAdapter

from pgmemory.errors import InvalidInputError, PgMemoryError, StructuredOutputError
from pgmemory.runtime.chat import ChatResponse, ChatResponseUpdate, ToolChoice
from pgmemory.runtime.messages import FunctionCallContent, Message, TextContent
from pgmemory.runtime.tools import NAME_RE, Tool

if TYPE_CHECKING:
    from pgmemory.settings import Settings

logger = logging.getLogger(__name__)


def strict_json_schema(target: type[pydantic.BaseModel] | TypeAdapter[Any]) -> dict[str, Any]:
    """The JSON schema of ``target`` in the API's strict structured-output form.

    Strict mode requires every property and forbids additional ones; the ``openai`` package's
    own conversion does that. It lives in a private module of that package, so this is the one
    place that imports it; when it is unavailable the plain JSON schema is returned.

    Args:
        target: a pydantic model class, or a ``TypeAdapter`` of any type pydantic validates.

    Returns:
        The schema, ready for ``{"type": "json_schema", "json_schema": {"schema": ...}}``.
    """
    try:  # the openai package's own strict-mode conversion, when available
        from openai.lib._pydantic import to_strict_json_schema

        return to_strict_json_schema(target)
    except Exception:  # pragma: no cover - fallback for other openai versions
        if isinstance(target, TypeAdapter):
            return target.json_schema()
        return target.model_json_schema()


def _schema_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or "response"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(name))[:64]
    return name or "response"


class _Format:
    """A requested response format: what to send, and how to read the reply."""

    def __init__(self, response_format: Any) -> None:
        self.adapter: TypeAdapter[Any] | None = None
        self.decode_json = False
        self.param: dict[str, Any] | None = None
        if response_format is None:
            return
        if isinstance(response_format, Mapping):
            self.param = dict(response_format)
            kind = self.param.get("type")
            if kind not in ("json_schema", "json_object", "text"):
                raise InvalidInputError(
                    f"response_format type {kind!r} is unknown; use 'json_schema', 'json_object', "
                    "'text', or pass a pydantic model class"
                )
            self.decode_json = kind in ("json_schema", "json_object")
            return
        try:
            self.adapter = TypeAdapter(response_format)
            schema = strict_json_schema(self.adapter)
        except (
            pydantic.PydanticUserError,
            pydantic.PydanticSchemaGenerationError,
            TypeError,
        ) as exc:
            raise InvalidInputError(
                f"cannot build a JSON schema from response_format={response_format!r}: {exc}"
            ) from None
        self.param = {
            "type": "json_schema",
            "json_schema": {
                "name": _schema_name(response_format),
                "schema": schema,
                "strict": True,
            },
        }

    def parse(self, text: str) -> Any:
        if self.adapter is not None:
            try:
                return self.adapter.validate_json(text)
            except pydantic.ValidationError as exc:
                raise StructuredOutputError(
                    f"the model's reply does not match the requested format: {exc.error_count()} "
                    f"error(s), first: {exc.errors()[0]['msg']}"
                ) from None
        if self.decode_json:
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise StructuredOutputError(f"the model's reply is not valid JSON: {exc}") from None
        return None


def _openai_name(name: str | None) -> dict[str, str]:
    return {"name": name} if name and NAME_RE.match(name) else {}


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Convert messages to chat-completions message params (one ``tool`` message per result)."""
    result: list[dict[str, Any]] = []
    for message in messages:
        results = message.function_results
        if results:
            for item in results:
                result.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
            continue
        if message.role == "tool":  # no tool_call_id to answer: the API would refuse it
            continue
        if message.role == "assistant":
            param: dict[str, Any] = {"role": "assistant", "content": message.text or None}
            calls = message.function_calls
            if calls:
                param["tool_calls"] = [
                    {
                        "id": c.call_id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in calls
                ]
            param.update(_openai_name(message.author_name))
            result.append(param)
            continue
        result.append(
            {"role": message.role, "content": message.text, **_openai_name(message.author_name)}
        )
    return result


def _usage(usage: Any) -> dict[str, int]:
    if usage is None:
        return {}
    data = {
        "prompt_tokens": getattr(usage, "prompt_tokens", None),
        "completion_tokens": getattr(usage, "completion_tokens", None),
        "total_tokens": getattr(usage, "total_tokens", None),
    }
    return {k: int(v) for k, v in data.items() if v is not None}


class OpenAIChatClient:
    """Chat completions through ``openai.AsyncOpenAI``.

    ``OpenAIChatClient(model="gpt-4o-mini")`` uses api.openai.com and ``OPENAI_API_KEY``;
    ``base_url=`` points it at any compatible server (vLLM, Ollama, LM Studio, a test server),
    where a missing key is replaced by a placeholder. ``client=`` passes a ready
    ``AsyncOpenAI`` instead. ``options`` are default request fields (temperature, seed, ...).
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        client: openai.AsyncOpenAI | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError(
                f"model {model!r} is blank; pass the chat model's name, e.g. model='gpt-4o-mini'"
            )
        self.model = model
        self.options: dict[str, Any] = dict(options or {})
        if client is not None:
            self._client = client
            return
        key = api_key.get_secret_value() if isinstance(api_key, SecretStr) else api_key
        if not key:
            key = os.environ.get("OPENAI_API_KEY")
        if not key:
            if base_url is None:
                raise InvalidInputError(
                    "no API key for api.openai.com: pass api_key=..., set OPENAI_API_KEY, or set "
                    "base_url=... for a server that needs no key"
                )
            key = "not-needed"
        self._client = openai.AsyncOpenAI(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=max_retries
        )

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides: Any) -> OpenAIChatClient:
        """Build one from :class:`pgmemory.settings.Settings` (``PGMEMORY_OPENAI_*`` variables).

        Model, endpoint, key, timeout and retries all come from the settings, whose defaults
        are the only ones that apply here.

        Args:
            settings: the settings to read; ``Settings()`` (environment and ``.env``) if omitted.
            **overrides: constructor arguments that replace the settings' values.
        """
        if settings is None:
            from pgmemory.settings import Settings

            settings = Settings()
        values: dict[str, Any] = {
            "model": settings.openai_chat_model,
            "base_url": settings.openai_base_url,
            "api_key": settings.openai_api_key,
            "timeout": settings.openai_timeout_s,
            "max_retries": settings.openai_max_retries,
        }
        values.update(overrides)
        return cls(**values)

    @property
    def base_url(self) -> str:
        """The endpoint requests go to."""
        return str(self._client.base_url)

    def __repr__(self) -> str:
        return f"OpenAIChatClient(model={self.model!r}, base_url={self.base_url!r})"

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.close()

    async def __aenter__(self) -> OpenAIChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- requests ---------------------------------------------------------------------------

    def _request(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool],
        tool_choice: ToolChoice | None,
        fmt: _Format,
        options: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        request: dict[str, Any] = {**self.options, **dict(options or {})}
        request["model"] = request.get("model") or self.model
        request["messages"] = to_openai_messages(messages)
        if tools:
            request["tools"] = [t.to_openai() for t in tools]
            if tool_choice is not None:
                if tool_choice in ("auto", "none", "required"):
                    request["tool_choice"] = tool_choice
                else:
                    if tool_choice not in {t.name for t in tools}:
                        raise InvalidInputError(
                            f"tool_choice {tool_choice!r} names no tool of this request; "
                            f"choose one of {sorted(t.name for t in tools)} or auto/none/required"
                        )
                    request["tool_choice"] = {"type": "function", "function": {"name": tool_choice}}
        if fmt.param is not None:
            request["response_format"] = fmt.param
        return request

    def _log(self, request: Mapping[str, Any], *, stream: bool) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "chat completion: model=%s messages=%d tools=%d stream=%s",
                request.get("model"),
                len(request.get("messages", [])),
                len(request.get("tools", [])),
                stream,
            )

    async def get_response(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice | None = None,
        response_format: Any = None,
        options: Mapping[str, Any] | None = None,
    ) -> ChatResponse:
        """Send one chat-completions request and return the reply as messages.

        ``response_format`` may be a pydantic model (reply parsed into ``.value``), any type
        pydantic validates, or a raw ``response_format`` dict.
        """
        fmt = _Format(response_format)
        request = self._request(messages, tools, tool_choice, fmt, options)
        self._log(request, stream=False)
        completion = await self._client.chat.completions.create(**request)
        if not completion.choices:
            raise PgMemoryError(
                f"the chat endpoint returned no choices (response id {completion.id!r})"
            )
        choice = completion.choices[0]
        contents: list[Any] = []
        text = choice.message.content
        if text:
            contents.append(TextContent(text))
        for call in choice.message.tool_calls or []:
            function = getattr(call, "function", None)
            if function is None:  # custom (non-function) tool calls are not supported
                continue
            contents.append(
                FunctionCallContent(
                    call_id=call.id, name=function.name, arguments=function.arguments or "{}"
                )
            )
        message = Message("assistant", contents=contents)
        value = (
            fmt.parse(text or "") if fmt.param is not None and not message.function_calls else None
        )
        return ChatResponse(
            messages=[message],
            finish_reason=choice.finish_reason,
            model=completion.model,
            usage=_usage(completion.usage),
            value=value,
            response_id=completion.id,
        )

    async def get_streaming_response(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Tool] = (),
        tool_choice: ToolChoice | None = None,
        response_format: Any = None,
        options: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[ChatResponseUpdate]:
        """Stream the reply: text deltas as they arrive, function calls once complete.

        The last update carries the finish reason, the usage (if the server reports it) and,
        for a structured request, nothing more: parse ``ChatResponse.from_updates(...)`` text
        with :meth:`parse_structured`.
        """
        fmt = _Format(response_format)
        request = self._request(messages, tools, tool_choice, fmt, options)
        request["stream"] = True
        request.setdefault("stream_options", {"include_usage": True})
        self._log(request, stream=True)
        stream = await self._client.chat.completions.create(**request)
        pending: dict[int, dict[str, str]] = {}
        finish_reason: str | None = None
        usage: dict[str, int] | None = None
        model: str | None = None
        response_id: str | None = None
        message_id = Message("assistant").message_id  # one id for every piece of this reply
        try:
            async for chunk in stream:
                model = chunk.model or model
                response_id = chunk.id or response_id
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices[:1] if chunk.choices else []:
                    delta = choice.delta
                    for call in delta.tool_calls or []:
                        slot = pending.setdefault(
                            call.index, {"id": "", "name": "", "arguments": ""}
                        )
                        if call.id:
                            slot["id"] = call.id
                        if call.function is not None:
                            if call.function.name:
                                slot["name"] += call.function.name
                            if call.function.arguments:
                                slot["arguments"] += call.function.arguments
                    if choice.finish_reason:
                        finish_reason = choice.finish_reason
                    if delta.content:
                        yield ChatResponseUpdate(
                            text=delta.content,
                            model=model,
                            response_id=response_id,
                            message_id=message_id,
                        )
        finally:
            await stream.close()
        calls = [
            FunctionCallContent(
                call_id=slot["id"] or f"call_{index}",
                name=slot["name"],
                arguments=slot["arguments"] or "{}",
            )
            for index, slot in sorted(pending.items())
        ]
        yield ChatResponseUpdate(
            function_calls=calls,
            finish_reason=finish_reason,
            model=model,
            usage=usage,
            response_id=response_id,
            message_id=message_id,
        )

    @staticmethod
    def parse_structured(text: str, response_format: Any) -> Any:
        """Parse reply text the way :meth:`get_response` fills ``ChatResponse.value``."""
        return _Format(response_format).parse(text)


__all__ = ["OpenAIChatClient", "strict_json_schema", "to_openai_messages"]
