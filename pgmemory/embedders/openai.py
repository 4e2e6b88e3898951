"""Embeddings from any OpenAI-compatible endpoint, through the ``openai`` package."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import openai

from pgmemory.embedders.base import as_matrix
from pgmemory.errors import EmbeddingError, InvalidInputError


class OpenAIEmbedder:
    """Batches texts to ``embeddings.create``; the client retries transient errors with backoff.

    Args:
        model: the embeddings model, e.g. ``"text-embedding-3-small"``.
        dimensions: the vector size the collection will hold. For models that can shorten
            their output (text-embedding-3-*) it is also sent as the request's ``dimensions``;
            for others pass the model's native size and ``send_dimensions=False``.
        base_url: an OpenAI-compatible endpoint; ``None`` is api.openai.com.
        api_key: the endpoint's key (``"unused"`` is sent when ``None``).
        batch_size: most texts per request.
        max_retries: retries of transient errors (with exponential backoff).
        timeout_s: per-request timeout in seconds.
        send_dimensions: send ``dimensions`` with each request.
        client: a ready ``openai.AsyncOpenAI`` to use instead of building one.
        model_id: the id recorded with every vector (default ``openai:<model>@<dimensions>``).
            It names the model and its size, never the endpoint, so the same model served
            from another URL keeps its collections; give your own id to tell apart two
            different models served under one name.

    Raises:
        InvalidInputError: ``batch_size`` is below 1.
    """

    def __init__(
        self,
        *,
        model: str,
        dimensions: int,
        base_url: str | None = None,
        api_key: str | None = None,
        batch_size: int = 256,
        max_retries: int = 4,
        timeout_s: float = 60.0,
        send_dimensions: bool = True,
        client: openai.AsyncOpenAI | None = None,
        model_id: str | None = None,
    ) -> None:
        if batch_size < 1:
            raise InvalidInputError(f"batch_size is {batch_size}; expected at least 1")
        self.model = model
        self.dimensions = dimensions
        self.batch_size = batch_size
        self.send_dimensions = send_dimensions
        self.model_id = model_id or f"openai:{model}@{dimensions}"
        self._client = client or openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "unused",
            max_retries=max_retries,
            timeout=timeout_s,
        )

    async def warm_up(self) -> None:
        """Nothing to load: the model runs behind the endpoint (present for a uniform API)."""

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed a batch, ``batch_size`` texts per request.

        Args:
            texts: the texts to embed.

        Returns:
            A ``(len(texts), dimensions)`` float32 array, in the order of ``texts``.

        Raises:
            EmbeddingError: a request failed (after retries) or returned unusable vectors.
        """
        batch = list(texts)
        out: list[list[float]] = []
        for start in range(0, len(batch), self.batch_size):
            part = batch[start : start + self.batch_size]
            kwargs: dict[str, Any] = {"dimensions": self.dimensions} if self.send_dimensions else {}
            try:
                response = await self._client.embeddings.create(
                    model=self.model, input=part, encoding_format="float", **kwargs
                )
            except openai.OpenAIError as exc:
                raise EmbeddingError(
                    f"embedding request to model {self.model!r} failed: {exc}"
                ) from exc
            except ValueError as exc:  # a 200 whose JSON body does not decode
                raise EmbeddingError(
                    f"embedding response from model {self.model!r} is not JSON "
                    f"({type(exc).__name__}); is base_url an OpenAI-compatible endpoint?"
                ) from None
            out.extend(self._vectors(response, len(part)))
        if not batch:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return as_matrix(out, rows=len(batch), dimensions=self.dimensions, model_id=self.model_id)

    def _vectors(self, response: Any, count: int) -> list[Any]:
        """The ``count`` vectors of an embeddings response, in input order.

        Raises:
            EmbeddingError: The response is not a list of ``count`` embeddings indexed 0 to
                ``count - 1`` (an HTML page answered with status 200, another API's JSON);
                the body itself is not repeated in the message.
        """
        data = getattr(response, "data", None)
        items = data if isinstance(data, list) else None
        indexes = [getattr(item, "index", None) for item in items or ()]
        if items is None or sorted(i for i in indexes if isinstance(i, int)) != list(range(count)):
            got = type(data).__name__ if items is None else f"{len(items)} items"
            raise EmbeddingError(
                f"embedding response from model {self.model!r} is not a list of {count} "
                f"embeddings (got {got}); is base_url an OpenAI-compatible endpoint?"
            )
        ordered = sorted(items, key=lambda item: item.index)
        return [item.embedding for item in ordered]
