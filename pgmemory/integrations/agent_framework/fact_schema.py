"""The shape a fact extraction asks the chat model for, derived from the model of facts.

Every field becomes nullable (the messages may state none of it) while keeping its constraints
and description, and the result is sent as a strict JSON schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import pydantic
from pydantic import BaseModel, Field


def extraction_model(model: type[BaseModel]) -> type[BaseModel]:
    """A copy of ``model`` whose every field is nullable and defaults to None.

    Field constraints (``ge``, ``max_length``, ...) and descriptions are kept, so they reach the
    JSON schema the chat model sees; validators are not copied (values are validated through
    the original model afterwards).
    """
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation: Any = info.annotation
        if info.metadata:
            annotation = Annotated[(annotation, *info.metadata)]
        fields[name] = (
            Optional[annotation],  # noqa: UP045 - a runtime-built type, not an annotation
            Field(default=None, description=info.description, title=info.title),
        )
    return pydantic.create_model(f"{model.__name__}Extraction", **fields)


def strict_json_schema(target: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of ``target`` in the API's strict structured-output form (every property
    required, no additional ones), by the ``openai`` package's own conversion when available.
    """
    try:
        from openai.lib._pydantic import to_strict_json_schema

        return to_strict_json_schema(target)
    except Exception:  # pragma: no cover - another openai version: the plain schema
        return target.model_json_schema()


def response_format(extraction: type[BaseModel]) -> dict[str, Any]:
    """The ``response_format`` of an extraction request: ``extraction``'s strict JSON schema.

    It is a raw schema (the client decodes the reply, it does not parse it into the model), so
    the provider can validate each value on its own and one bad value loses only itself.

    Args:
        extraction: a model from :func:`extraction_model`.

    Returns:
        ``{"type": "json_schema", "json_schema": {...}}`` with every property required and
        nullable.
    """
    schema = strict_json_schema(extraction)  # every property required, nullable
    return {
        "type": "json_schema",
        "json_schema": {"name": extraction.__name__[:64], "schema": schema, "strict": True},
    }


__all__ = ["extraction_model", "response_format", "strict_json_schema"]
