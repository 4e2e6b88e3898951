"""The model client of the README's agent snippets and the examples: one way to name the endpoint.

``chat_client()`` is agent-framework's ``OpenAIChatCompletionClient`` on the endpoint the
``PGMEMORY_OPENAI_*`` settings name (the same ones pgmemory's OpenAI embedder reads), so one
set of variables points every snippet, example and embedder at a model::

    PGMEMORY_OPENAI_BASE_URL=http://localhost:11434/v1   # any OpenAI-compatible endpoint
    PGMEMORY_OPENAI_API_KEY=sk-...                       # api.openai.com's key (no base URL)
    PGMEMORY_OPENAI_CHAT_MODEL=gpt-4o-mini               # the default

With neither a base URL nor a key there is no endpoint to talk to: :data:`NO_ENDPOINT` says so,
naming the variables, instead of the framework's error about ``'base_url', 'endpoint'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_framework.openai import OpenAIChatCompletionClient
from openai import AsyncOpenAI

from pgmemory.errors import InvalidInputError

if TYPE_CHECKING:
    from pgmemory.settings import Settings

#: The variables that name the model endpoint (Settings' ``openai_base_url``, ``openai_api_key``).
ENDPOINT_VARIABLES = ("PGMEMORY_OPENAI_BASE_URL", "PGMEMORY_OPENAI_API_KEY")
NO_ENDPOINT = (
    "no model endpoint is configured: set PGMEMORY_OPENAI_BASE_URL to an OpenAI-compatible "
    "endpoint (a local server needs no key), or PGMEMORY_OPENAI_API_KEY for api.openai.com; "
    "PGMEMORY_OPENAI_CHAT_MODEL names the model (default gpt-4o-mini)"
)
#: Sent as the key to an endpoint that needs none (the OpenAI client insists on one).
NO_KEY = "unused"
#: The endpoint of a key with no base URL (explicit: the OpenAI client would read
#: OPENAI_BASE_URL, a second way to name it).
OPENAI_URL = "https://api.openai.com/v1"


def chat_client(
    settings: Settings | None = None, *, model: str | None = None
) -> OpenAIChatCompletionClient:
    """agent-framework's ``OpenAIChatCompletionClient`` on the configured endpoint.

    Args:
        settings: where the endpoint comes from (default: ``Settings()``, the environment).
        model: the chat model (default: ``PGMEMORY_OPENAI_CHAT_MODEL``).

    Returns:
        The client, with the settings' timeout and retries. Its ``client`` attribute is the
        ``AsyncOpenAI`` inside, for ``await client.client.close()`` at shutdown.

    Raises:
        InvalidInputError: neither ``PGMEMORY_OPENAI_BASE_URL`` nor ``PGMEMORY_OPENAI_API_KEY``
            is set (:data:`NO_ENDPOINT`).
    """
    if settings is None:
        from pgmemory.settings import Settings

        settings = Settings()
    if not settings.openai_base_url and settings.openai_api_key is None:
        raise InvalidInputError(NO_ENDPOINT)
    key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else NO_KEY
    openai = AsyncOpenAI(
        base_url=settings.openai_base_url or OPENAI_URL,
        api_key=key,
        max_retries=settings.openai_max_retries,
        timeout=settings.openai_timeout_s,
    )
    return OpenAIChatCompletionClient(
        model=model or settings.openai_chat_model, async_client=openai
    )
