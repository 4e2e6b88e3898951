"""Rendering the audit page: its templates and the filters they use.

Ids (users, sessions, agents, applications, collections, actors) are shown through the
``shown_id`` filter: the command line's rendering (:func:`pgmemory.text.visible.visible_id`,
invisible code points escaped), HTML-escaped on top. Links and form values carry the exact id.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from pgmemory.extras import require
from pgmemory.store.modes import MODES
from pgmemory.text.clean import readable_json
from pgmemory.text.visible import visible_id


def require_ui() -> None:
    """Raise :class:`~pgmemory.errors.MissingExtraError` naming the ui extra if it is missing
    (before the page's modules import its packages)."""
    for package in ("starlette", "jinja2"):
        require(package, extra="ui", purpose="the audit web page (pgmemory.ui)")


require_ui()

import jinja2  # noqa: E402
from markupsafe import Markup  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import HTMLResponse  # noqa: E402

#: Characters of a memory shown in lists (its own page shows all of it).
SNIPPET_CHARS = 400

_TEMPLATES = Path(__file__).with_name("templates")
#: Why a recall showed a memory, for the audit page.
REASONS = {
    "match": "matched the query (its signals say by how much each)",
    "recent": "one of the most recent turns of the scope, shown whatever the query",
    "neighbour": "most of its score was lent by the adjacent message of its conversation",
}
#: Each mode's ranking (the explanation) and its menu label.
_SEARCH_MODES = {name: mode.ranking for name, mode in MODES.items()}
_MODE_OPTIONS = {name: f"{name} · {mode.ranking.split(' (')[0]}" for name, mode in MODES.items()}


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["short"] = lambda s, n=12: (s or "")[:n]
    env.filters["snippet"] = snippet
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, indent=1, default=str)
    env.filters["message_text"] = message_text
    env.filters["shown_id"] = shown_id
    env.globals["modes"] = _SEARCH_MODES
    env.globals["mode_options"] = _MODE_OPTIONS
    env.globals["reasons"] = REASONS
    return env


def when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def shown_id(value: str | None) -> Markup | str:
    """An id on the page: :func:`~pgmemory.text.visible.visible_id`'s text (what the command
    line prints), HTML-escaped, in a ``span.id`` that keeps its spaces as they are (HTML would
    show ``a  b`` as ``a b``); ``""`` for none, so ``(x | shown_id) or '—'`` marks a blank."""
    if not value:
        return ""
    return Markup('<span class="id">{}</span>').format(visible_id(value))


def snippet(value: str | None, limit: int = SNIPPET_CHARS) -> str:
    if value is None:
        return ""
    return value if len(value) <= limit else value[:limit] + " …"


def message_text(message: Mapping[str, Any]) -> str:
    """A chat message's readable text: its text, tool calls and results, else its JSON."""
    parts: list[str] = []
    text = message.get("text")
    if isinstance(text, str) and text:
        parts.append(text)
    for content in message.get("contents") or []:
        if not isinstance(content, Mapping):
            continue
        kind = content.get("type")
        if kind == "function_call":
            arguments = content.get("arguments")
            if isinstance(arguments, str):
                arguments = readable_json(arguments)
            parts.append(f"→ {content.get('name')}({arguments})")
        elif kind == "function_result":
            result = content.get("error") or content.get("result")
            parts.append(f"← {_result_text(result)}")
    return "\n".join(parts) or json.dumps(message, ensure_ascii=False, default=str)


def _result_text(result: object) -> str:
    """A tool result as the page shows it: JSON text (what the framework stores) readable,
    whether it was stored readable or ASCII-escaped (before 0.3); other text quoted; any other
    value as JSON."""
    if isinstance(result, str) and _is_json(result):
        return readable_json(result)
    return json.dumps(result, ensure_ascii=False, default=str)


def _is_json(text: str) -> bool:
    """Whether ``text`` is a JSON document."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render a template; ``url(name, **params)`` in it links to a page, params percent-encoded."""

    def url(name: str, **params: Any) -> str:
        path = request.url_for(name).path
        kept = {k: v for k, v in params.items() if v is not None and v != ""}
        return path + ("?" + urlencode(kept, quote_via=quote, safe="") if kept else "")

    context.setdefault("crumbs", [])
    context.setdefault("allow_writes", False)
    context.setdefault("signed_in", False)
    body = environment().get_template(template).render(url=url, **context)
    return HTMLResponse(body, status_code=status)
