"""The shape a fact extraction asks the chat model for, derived from the model of facts.

Every field becomes nullable (the messages may state none of it) while keeping its constraints
and description, and the result is sent as a strict JSON schema.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Annotated, Any, Optional

import pydantic
from pydantic import BaseModel, Field

logger = logging.getLogger(__name__)


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


#: The extraction reply's field holding the updated profile summary (when one is kept).
PROFILE_FIELD = "profile_summary"


def with_profile(extraction: type[BaseModel], max_chars: int) -> type[BaseModel]:
    """``extraction`` with one more nullable field, :data:`PROFILE_FIELD`: the profile summary
    the chat model returns, of at most ``max_chars`` characters (said in its description; the
    provider cuts a longer one)."""
    field = Field(
        default=None,
        description=f"a summary of the user in at most {max_chars} characters, or null",
    )
    fields: dict[str, Any] = {PROFILE_FIELD: (Optional[str], field)}  # noqa: UP045
    return pydantic.create_model(extraction.__name__, __base__=extraction, **fields)


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


def validate_values(
    model: type[BaseModel], raw: Mapping[str, Any], *, owner: str
) -> dict[str, Any]:
    """Validate each extracted value through ``model``'s own field (constraints and field
    validators run); returns JSON-native values. Nulls, blank strings, unknown keys and
    rejected values are dropped (rejections are logged by field name only, for ``owner``)."""
    result: dict[str, Any] = {}
    validator = model.__pydantic_validator__
    # Fields without a default are None in the holder, so model validators can run.
    unset = {n: None for n, f in model.model_fields.items() if f.is_required()}
    for name in model.model_fields:
        value = raw.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        holder = model.model_construct(**unset)
        try:
            validator.validate_assignment(holder, name, value)
            dumped = holder.model_dump(mode="json", include={name})
        except Exception as exc:  # ValidationError, or a validator that raised
            logger.warning(
                "fact memory %s: extracted %r rejected by %s (%s)",
                owner,
                name,
                model.__name__,
                type(exc).__name__,
            )
            continue
        if dumped.get(name) is not None:
            result[name] = dumped[name]
    return result


__all__ = [
    "PROFILE_FIELD",
    "extraction_model",
    "response_format",
    "strict_json_schema",
    "validate_values",
    "with_profile",
]
