"""Tools: plain Python callables (sync or async) the model may call.

The JSON schema of a tool's parameters comes from the callable's signature:

* type hints give the types (any type pydantic understands: ``list[Item]`` where ``Item`` is a
  TypedDict, a pydantic model or a dataclass, enums, literals, optionals, ...);
* ``Annotated[str, "what it is"]`` (or ``Annotated[str, Field(description=...)]``) describes a
  parameter; so does an ``Args:`` section (or ``:param name:`` lines) in the docstring;
* the docstring's first paragraph describes the tool;
* a variadic ``*items: Item`` becomes one array parameter ``items`` (e.g. the order lines of
  ``place_order(*items: OrderItem)``), and the call passes it back spread out.

Arguments from the model are validated with pydantic before the call; an invalid call, an
unknown tool or a tool that raises becomes an error result the model sees, never a crash.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, get_args, get_origin, get_type_hints, overload

import pydantic
from pydantic import ConfigDict, Field, create_model
from pydantic_core import to_jsonable_python

from pgmemory.errors import InvalidInputError, ToolArgumentsError

#: The names the chat-completions API accepts, for a tool and for a message's author alike.
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True, eq=False)
class Tool:
    """A callable the model may call, with its name, description and parameter schema.

    Build one with :func:`tool` (or let the agent convert a plain function). ``parameters`` is a
    JSON schema object; :meth:`invoke` validates arguments against it and calls ``fn``.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any] | None = field(repr=False, default=None)
    arguments_model: type[pydantic.BaseModel] | None = field(repr=False, default=None)
    variadic: str | None = field(repr=False, default=None)
    run_sync_in_thread: bool = field(repr=False, default=True)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise InvalidInputError(
                f"tool name {self.name!r} is invalid: use 1-64 letters, digits, '_' or '-' "
                "(pass name=... to tool())"
            )

    def to_openai(self) -> dict[str, Any]:
        """The ``tools=[...]`` entry of a chat-completions request."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}

    def validate_arguments(self, arguments: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Validate ``arguments`` and return ``(args, kwargs)`` for the call."""
        if self.arguments_model is None:
            return [], dict(arguments)
        try:
            validated = self.arguments_model.model_validate(dict(arguments))
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolArgumentsError(
                f"invalid arguments for tool {self.name!r}: {problems}"
            ) from None
        kwargs = {name: getattr(validated, name) for name in type(validated).model_fields}
        args: list[Any] = []
        if self.variadic is not None:
            args = list(kwargs.pop(self.variadic) or [])
        return args, kwargs

    async def invoke(self, arguments: Mapping[str, Any] | None = None) -> Any:
        """Validate the arguments, call the function, and return its result as JSON-native data."""
        if self.fn is None:
            raise InvalidInputError(
                f"tool {self.name!r} is declaration-only (no function); the caller must answer it"
            )
        args, kwargs = self.validate_arguments(arguments or {})
        if inspect.iscoroutinefunction(self.fn) or not self.run_sync_in_thread:
            result = self.fn(*args, **kwargs)
        else:
            result = await asyncio.to_thread(self.fn, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return to_jsonable_python(result, fallback=str)


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into (summary paragraph, {param: description})."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    params: dict[str, str] = {}
    # :param name: text
    for match in re.finditer(r"^:param\s+(?:[^:\s]+\s+)?(\w+):\s*(.+(?:\n(?!:)\s+.+)*)", doc, re.M):
        params[match.group(1)] = " ".join(match.group(2).split())
    # Google style "Args:" block
    section = re.search(
        r"^(?:Args|Arguments|Parameters|Params):\s*\n((?:[ \t]+.*\n?|\s*\n)+)", doc, re.M
    )
    if section:
        current: str | None = None
        for line in section.group(1).splitlines():
            item = re.match(r"^\s{1,8}(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if item:
                current = item.group(1).lstrip("*")
                params[current] = item.group(2).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
    summary = re.split(r"\n\s*\n", doc, maxsplit=1)[0]
    if re.match(
        r"^(?:Args|Arguments|Parameters|Params|Returns|Raises):", summary
    ) or summary.startswith(":param"):
        summary = ""
    return " ".join(summary.split()), params


def _split_annotated(annotation: Any) -> tuple[Any, str | None, list[Any]]:
    """Pull a plain-string description out of ``Annotated[...]``; keep other metadata."""
    if get_origin(annotation) is Annotated:
        base, *meta = get_args(annotation)
        description = None
        rest: list[Any] = []
        for item in meta:
            if isinstance(item, str) and description is None:
                description = item
            else:
                rest.append(item)
        return base, description, rest
    return annotation, None, []


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's auto-generated titles from the top level and from properties."""
    schema = dict(schema)
    schema.pop("title", None)
    props = schema.get("properties")
    if isinstance(props, dict):
        schema["properties"] = {
            name: {k: v for k, v in prop.items() if k != "title"}
            if isinstance(prop, dict)
            else prop
            for name, prop in props.items()
        }
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return schema


def _build(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    run_sync_in_thread: bool = True,
) -> Tool:
    if not callable(fn):
        raise InvalidInputError(f"tool() needs a callable, got {fn!r}")
    target = fn
    signature = inspect.signature(target)
    try:
        hints = get_type_hints(target, include_extras=True)
    except Exception:  # unresolved forward references: fall back to raw annotations
        hints = {}
    summary, param_docs = _docstring_parts(inspect.getdoc(target))
    fields: dict[str, Any] = {}
    variadic: str | None = None
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        annotation = hints.get(param.name, param.annotation)
        if annotation is inspect.Parameter.empty:
            annotation = Any
        base, text, meta = _split_annotated(annotation)
        doc = text or param_docs.get(param.name)
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            variadic = param.name
            base = list[base]  # type: ignore[valid-type]
            default: Any = ...
        else:
            default = ... if param.default is inspect.Parameter.empty else param.default
        info = Field(default=default, description=doc) if doc else Field(default=default)
        field_type = Annotated[base, *meta] if meta else base
        fields[param.name] = (field_type, info)
    tool_name = name or getattr(fn, "__name__", None) or type(fn).__name__
    try:
        model = create_model(
            f"{tool_name}_arguments",
            __config__=ConfigDict(arbitrary_types_allowed=False, extra="ignore"),
            **fields,
        )
        schema = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as exc:
        raise InvalidInputError(
            f"cannot build a JSON schema for tool {tool_name!r}: {exc}"
        ) from None
    return Tool(
        name=tool_name,
        description=description if description is not None else summary,
        parameters=_clean_schema(schema),
        fn=fn,
        arguments_model=model,
        variadic=variadic,
        run_sync_in_thread=run_sync_in_thread,
    )


@overload
def tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    run_sync_in_thread: bool = True,
) -> Tool: ...
@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    run_sync_in_thread: bool = True,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    run_sync_in_thread: bool = True,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a sync or async callable into a :class:`Tool`.

    ``name`` defaults to the function's name and ``description`` to its docstring summary.
    A sync function runs in a worker thread (so a blocking tool does not stall the event loop,
    and parallel calls overlap) unless ``run_sync_in_thread=False``. Works as a call
    (``tool(get_menu, name="GetMenu")``) and as a decorator (``@tool`` or
    ``@tool(name="GetMenu")``).
    """
    if fn is None:
        return lambda f: _build(f, name, description, run_sync_in_thread)
    if isinstance(fn, Tool):
        changes: dict[str, Any] = {}
        if name is not None:
            changes["name"] = name
        if description is not None:
            changes["description"] = description
        return _replace_tool(fn, **changes) if changes else fn
    return _build(fn, name, description, run_sync_in_thread)


def _replace_tool(t: Tool, **changes: Any) -> Tool:
    values: dict[str, Any] = {
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "fn": t.fn,
        "arguments_model": t.arguments_model,
        "variadic": t.variadic,
        "run_sync_in_thread": t.run_sync_in_thread,
    }
    values.update(changes)
    return Tool(**values)


ToolLike = Tool | Callable[..., Any] | Callable[..., Awaitable[Any]]


def as_tools(items: Iterable[ToolLike]) -> list[Tool]:
    """Convert callables to tools (tools pass through) and refuse duplicate names."""
    result: list[Tool] = []
    seen: set[str] = set()
    for item in items:
        t = item if isinstance(item, Tool) else tool(item)
        if t.name in seen:
            raise InvalidInputError(
                f"two tools are named {t.name!r}; rename one with tool(fn, name=...)"
            )
        seen.add(t.name)
        result.append(t)
    return result


def merge_tools(base: Iterable[Tool], extra: Iterable[Tool]) -> list[Tool]:
    """``base`` plus ``extra``; the same tool twice is kept once, two tools with one name fail."""
    result = list(base)
    by_name = {t.name: t for t in result}
    for t in extra:
        known = by_name.get(t.name)
        if known is None:
            by_name[t.name] = t
            result.append(t)
        elif known is not t:
            raise InvalidInputError(
                f"two different tools are named {t.name!r}; rename one with tool(fn, name=...)"
            )
    return result


__all__ = ["Tool", "ToolLike", "as_tools", "merge_tools", "tool"]
