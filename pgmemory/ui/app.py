"""The audit page as an ASGI application: what pgmemory remembers about a user, and why.

Server-rendered HTML (Starlette + Jinja2, no script at all), read-only unless built with
``allow_writes=True``. Every page is bounded (see :mod:`pgmemory.store.browse`); every value is
HTML-escaped by Jinja2's autoescape; user ids travel in query strings, percent-encoded, so any
id (``/``, ``%``, quotes, CJK, emoji) round-trips. Nothing personal is logged: log lines carry
counts and route names, never ids, texts or tokens.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import parse_qsl, quote, urlencode

from pgmemory.errors import PgMemoryError
from pgmemory.extras import require
from pgmemory.store import browse
from pgmemory.store.records import MemoryScope, RecallTrace

require("starlette", extra="ui", purpose="the audit web page (pgmemory.ui)")
require("jinja2", extra="ui", purpose="the audit web page (pgmemory.ui)")

import jinja2  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.datastructures import URL  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import HTMLResponse, RedirectResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402
from starlette.types import ASGIApp, Receive, Scope, Send  # noqa: E402

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore

logger = logging.getLogger(__name__)

#: Name of the cookie a ``?token=`` login sets (HttpOnly, SameSite=Strict).
COOKIE_NAME = "pgmemory_ui"
#: Actor recorded in the audit for erasures made through the page.
ACTOR = "pgmemory-ui"
#: Provider recorded in the recall audit for searches made through the page.
PROVIDER = "pgmemory-ui"
#: Search results shown at most.
SEARCH_MAX = 50
#: Largest form body accepted (the forms hold a few ids and a token).
MAX_FORM_BYTES = 16_384
#: Characters of a memory shown in lists (its own page shows all of it).
SNIPPET_CHARS = 400

_TEMPLATES = Path(__file__).with_name("templates")
_SEARCH_MODES = {
    "hybrid": "fused score (cosine and BM25, each scaled to 0–1 within the scope, summed)",
    "vector": "cosine similarity",
    "text": "BM25",
}
_MODE_OPTIONS = {
    "hybrid": "hybrid · fused score",
    "vector": "vector · cosine",
    "text": "text · BM25",
}
#: No script may run, no resource may load from elsewhere, no framing, no form to elsewhere.
_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS = {
    "content-security-policy": _CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",  # URLs carry user ids
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}


class _Cursors(TypedDict):
    """The page cursors of a request (``?before=`` / ``?after=``)."""

    before: browse.Cursor | None
    after: browse.Cursor | None


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["short"] = lambda s, n=12: (s or "")[:n]
    env.filters["snippet"] = _snippet
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False, indent=1, default=str)
    env.filters["message_text"] = _message_text
    env.globals["modes"] = _SEARCH_MODES
    env.globals["mode_options"] = _MODE_OPTIONS
    return env


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _snippet(value: str | None, limit: int = SNIPPET_CHARS) -> str:
    if value is None:
        return ""
    return value if len(value) <= limit else value[:limit] + " …"


def _message_text(message: Mapping[str, Any]) -> str:
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
            parts.append(f"→ {content.get('name')}({content.get('arguments')})")
        elif kind == "function_result":
            result = content.get("error") or content.get("result")
            parts.append(f"← {json.dumps(result, ensure_ascii=False, default=str)}")
    return "\n".join(parts) or json.dumps(message, ensure_ascii=False, default=str)


class _Auth:
    """The token, and the cookie value a sign-in sets (derived from the token, not the token)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.session_value = hmac.new(
            token.encode("utf-8"), b"pgmemory-ui-session", hashlib.sha256
        ).hexdigest()

    def check(self, request: Request) -> Response | None:
        """None when the request may pass, else the response to send instead."""
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and _same(credential.strip(), self.token):
            return None
        if _same(request.cookies.get(COOKIE_NAME, ""), self.session_value):
            return None
        offered = request.query_params.get("token")
        if offered is not None and request.method == "GET":
            if not _same(offered, self.token):
                return _unauthorized(request, "That token is not right.")
            # Signed in: drop the token from the address (history, bookmarks) at once.
            kept = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.replace(query=urlencode(kept, quote_via=quote, safe=""))
            response = RedirectResponse(_relative(target), status_code=303)
            self.set_cookie(request, response)
            return response
        if request.url.path == _login_path(request):
            return None  # the sign-in form, and its POST (which checks the token itself)
        return _unauthorized(request, None)

    def set_cookie(self, request: Request, response: Response) -> None:
        """Set the sign-in cookie: HttpOnly, SameSite=Strict, Secure over https."""
        response.set_cookie(
            COOKIE_NAME,
            self.session_value,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=request.scope.get("root_path") or "/",
        )


class _Guard:
    """ASGI middleware: the token check (when a token is set) and the security headers."""

    def __init__(self, app: ASGIApp, *, auth: _Auth | None) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                for name, value in _SECURITY_HEADERS.items():
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        refusal = self.auth.check(Request(scope)) if self.auth is not None else None
        if refusal is None:
            await self.app(scope, receive, send_with_headers)
        else:
            await refusal(scope, receive, send_with_headers)


def _same(offered: str, expected: str) -> bool:
    return hmac.compare_digest(offered.encode("utf-8"), expected.encode("utf-8"))


def _relative(url: URL) -> str:
    return url.path + (f"?{url.query}" if url.query else "")


def _login_path(request: Request) -> str:
    return (request.scope.get("root_path") or "") + "/login"


def _render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Render a template; ``url(name, **params)`` in it links to a page, params percent-encoded."""

    def url(name: str, **params: Any) -> str:
        path = request.url_for(name).path
        kept = {k: v for k, v in params.items() if v is not None and v != ""}
        return path + ("?" + urlencode(kept, quote_via=quote, safe="") if kept else "")

    context.setdefault("crumbs", [])
    context.setdefault("allow_writes", False)
    context.setdefault("signed_in", False)
    body = _environment().get_template(template).render(url=url, **context)
    return HTMLResponse(body, status_code=status)


async def _form(request: Request) -> dict[str, str]:
    """An url-encoded form body (the only kind these pages send), at most MAX_FORM_BYTES."""
    if (
        request.headers.get("content-type", "").split(";")[0].strip()
        != "application/x-www-form-urlencoded"
    ):
        raise _HTTPError(415, "Expected an HTML form (application/x-www-form-urlencoded).")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise _HTTPError(413, "That form is too large.")
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
    except UnicodeDecodeError:
        raise _HTTPError(400, "That form is not UTF-8.") from None


def _unauthorized(request: Request, problem: str | None) -> Response:
    response = _render(request, "login.html", status=401, title="Sign in", problem=problem)
    response.headers["www-authenticate"] = "Bearer"
    return response


class _UI:
    """The pages, bound to one open store."""

    def __init__(self, store: MemoryStore, *, allow_writes: bool, auth: _Auth | None) -> None:
        self.store = store
        self.allow_writes = allow_writes
        self.auth = auth
        self.secret = os.urandom(32)  # signs the erase forms' CSRF tokens (per process)

    # --- plumbing ----------------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        return _render(
            request,
            template,
            status,
            allow_writes=self.allow_writes,
            signed_in=self.auth is not None,
            **context,
        )

    def page(
        self, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request)
            except _HTTPError as exc:
                return self.render(
                    request, "error.html", status=exc.status, title="Error", message=exc.message
                )
            except PgMemoryError as exc:
                logger.info("ui: %s refused a request: %s", handler.__name__, type(exc).__name__)
                return self.render(
                    request, "error.html", status=400, title="Error", message=str(exc)
                )

        endpoint.__name__ = handler.__name__
        return endpoint

    @staticmethod
    def user_of(request: Request) -> str:
        user = request.query_params.get("user")
        if not user or not user.strip():
            raise _HTTPError(400, "Which user? The address has no user= parameter.")
        return user

    @staticmethod
    def limit_of(request: Request) -> int:
        raw = request.query_params.get("limit")
        try:
            return browse.clamp_limit(int(raw)) if raw else browse.DEFAULT_PAGE
        except ValueError:
            return browse.DEFAULT_PAGE

    @staticmethod
    def cursors(request: Request, *, id_type: type = int) -> _Cursors:
        def decode(key: str) -> browse.Cursor | None:
            raw = request.query_params.get(key)
            return browse.Cursor.decode(raw, id_type=id_type) if raw else None

        return {"before": decode("before"), "after": decode("after")}

    def csrf(self, action: str, fields: Mapping[str, str]) -> str:
        payload = json.dumps([action, sorted(fields.items())], ensure_ascii=False)
        return hmac.new(self.secret, payload.encode("utf-8"), hashlib.sha256).hexdigest()

    # --- pages -----------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        after = request.query_params.get("after", "")
        page = await browse.list_users(self.store, after=after, limit=self.limit_of(request))
        collections = await self.store.list_collections()
        prunes = await browse.list_prunes(self.store, limit=5)
        return self.render(
            request,
            "index.html",
            title="Users",
            page=page,
            after=after,
            limit=self.limit_of(request),
            collections=collections,
            prunes=prunes,
        )

    async def login(self, request: Request) -> Response:
        if self.auth is None:
            return RedirectResponse(request.url_for("index").path, status_code=303)
        if request.method == "POST":
            form = await _form(request)
            if _same(form.get("token", ""), self.auth.token):
                response = RedirectResponse(request.url_for("index").path, status_code=303)
                self.auth.set_cookie(request, response)
                return response
            return _unauthorized(request, "That token is not right.")
        return _unauthorized(request, None)

    async def user(self, request: Request) -> Response:
        user = self.user_of(request)
        scopes = await browse.user_scopes(self.store, user)
        sessions = await browse.user_sessions(self.store, user)
        facts = await browse.user_facts(self.store, user, limit=20)
        collections: dict[str, int] = {}
        for scope in scopes:
            collections[scope.collection] = collections.get(scope.collection, 0) + scope.memories
        return self.render(
            request,
            "user.html",
            title=user,
            user=user,
            scopes=scopes,
            sessions=sessions,
            facts=facts,
            collections=collections,
            crumbs=[("user", user)],
        )

    async def memories(self, request: Request) -> Response:
        user = self.user_of(request)
        params = request.query_params
        known = [c.name for c in await self.store.list_collections()]
        scopes = await browse.user_scopes(self.store, user)
        mine = list(dict.fromkeys(s.collection for s in scopes)) or known
        collection = params.get("collection") or (mine[0] if mine else None)
        session = params.get("session") or None
        query = (params.get("q") or "").strip()
        asked = params.get("mode") or "hybrid"
        mode = asked if asked in _SEARCH_MODES else "hybrid"
        page = hits = None
        if collection is not None and collection not in known:
            raise _HTTPError(404, "There is no such collection.")
        if collection is not None and query:
            scope = MemoryScope(user_id=user, session_id=session)
            hits = await self.store.search(
                collection,
                scope,
                query=query,
                mode=mode,
                limit=min(self.limit_of(request), SEARCH_MAX),
                trace=RecallTrace(provider=PROVIDER, mode=mode),
            )
            logger.info("ui: searched a user's memories (%s, %d hits)", mode, len(hits))
        elif collection is not None:
            page = await browse.user_memories(
                self.store,
                user,
                collection,
                session_id=session,
                limit=self.limit_of(request),
                **self.cursors(request, id_type=uuid.UUID),
            )
        return self.render(
            request,
            "memories.html",
            title=f"Memories of {user}",
            user=user,
            collection=collection,
            collections=mine,
            session=session,
            query=query,
            mode=mode,
            page=page,
            hits=hits,
            limit=self.limit_of(request),
            crumbs=[("user", user), ("memories", None)],
        )

    async def memory(self, request: Request) -> Response:
        user = self.user_of(request)
        try:
            memory_id = uuid.UUID(request.query_params.get("id", ""))
        except ValueError:
            raise _HTTPError(400, "That is not a memory id.") from None
        memory = await browse.get_memory(self.store, user, memory_id)
        trail = await browse.memory_audit_trail(self.store, user, memory_id)
        recalls = await browse.recalls_of_memory(self.store, user, memory_id)
        if memory is None and not trail and not recalls:
            raise _HTTPError(404, "This user has no such memory, and the audit knows none.")
        return self.render(
            request,
            "memory.html",
            title="Memory",
            user=user,
            memory=memory,
            memory_id=memory_id,
            trail=trail,
            recalls=recalls,
            crumbs=[("user", user), ("memories", None), ("memory", None)],
        )

    async def recalls(self, request: Request) -> Response:
        user = self.user_of(request)
        page = await browse.user_recalls(
            self.store, user, limit=self.limit_of(request), **self.cursors(request)
        )
        return self.render(
            request,
            "recalls.html",
            title=f"Recalls of {user}",
            user=user,
            page=page,
            limit=self.limit_of(request),
            crumbs=[("user", user), ("recalls", None)],
        )

    async def recall(self, request: Request) -> Response:
        user = self.user_of(request)
        try:
            recall_id = int(request.query_params.get("id", ""))
        except ValueError:
            raise _HTTPError(400, "That is not a recall id.") from None
        recall = await browse.get_recall(self.store, user, recall_id)
        if recall is None:
            raise _HTTPError(404, "This user has no such recall (pruned, or never made).")
        return self.render(
            request,
            "recall.html",
            title="Recall",
            user=user,
            recall=recall,
            crumbs=[("user", user), ("recalls", None), ("recall", None)],
        )

    async def audit(self, request: Request) -> Response:
        user = self.user_of(request)
        page = await browse.user_memory_audit(
            self.store, user, limit=self.limit_of(request), **self.cursors(request)
        )
        return self.render(
            request,
            "audit.html",
            title=f"Audit of {user}",
            user=user,
            page=page,
            limit=self.limit_of(request),
            crumbs=[("user", user), ("write/delete audit", None)],
        )

    async def facts(self, request: Request) -> Response:
        user = self.user_of(request)
        facts = await browse.user_facts(self.store, user)
        page = await browse.user_fact_history(
            self.store, user, limit=self.limit_of(request), **self.cursors(request)
        )
        return self.render(
            request,
            "facts.html",
            title=f"Facts of {user}",
            user=user,
            facts=facts,
            page=page,
            limit=self.limit_of(request),
            crumbs=[("user", user), ("facts", None)],
        )

    async def session(self, request: Request) -> Response:
        user = self.user_of(request)
        session = request.query_params.get("session") or ""
        if not session.strip():
            raise _HTTPError(400, "Which session? The address has no session= parameter.")
        seqs = {}
        for key in ("after_seq", "before_seq"):
            raw = request.query_params.get(key)
            try:
                seqs[key] = int(raw) if raw else None
            except ValueError:
                raise _HTTPError(400, f"{key} must be a number.") from None
        page = await browse.session_history(
            self.store, user, session, limit=self.limit_of(request), **seqs
        )
        return self.render(
            request,
            "session.html",
            title=f"Session {session}",
            user=user,
            session=session,
            page=page,
            limit=self.limit_of(request),
            crumbs=[("user", user), ("session", None)],
        )

    # --- erasure ---------------------------------------------------------------------------

    def erase_target(self, source: Mapping[str, Any]) -> dict[str, str]:
        """The erase form's fields: user, and optionally one scope (collection + dimensions)."""
        user = str(source.get("user") or "")
        if not user.strip():
            raise _HTTPError(400, "Which user? The request has no user.")
        target = {"user": user}
        for key in ("collection", "application", "agent", "session"):
            value = str(source.get(key) or "")
            if value:
                target[key] = value
        if "collection" not in target and len(target) > 1:
            raise _HTTPError(400, "A scope to erase names its collection.")
        return target

    @staticmethod
    def scope_of(target: Mapping[str, str]) -> MemoryScope:
        return MemoryScope(
            user_id=target["user"],
            application_id=target.get("application"),
            agent_id=target.get("agent"),
            session_id=target.get("session"),
        )

    async def erase(self, request: Request) -> Response:
        if not self.allow_writes:
            raise _HTTPError(
                403, "This page is read-only: start it with allow_writes (--allow-writes) to erase."
            )
        if request.method == "POST":
            return await self.erase_now(request, await _form(request))
        target = self.erase_target(request.query_params)
        if "collection" in target:
            live = await self.store.count(target["collection"], self.scope_of(target))
        else:
            live = sum(s.memories for s in await browse.user_scopes(self.store, target["user"]))
        return self.render(
            request,
            "erase.html",
            title="Erase?",
            target=target,
            user=target["user"],
            live=live,
            csrf=self.csrf("erase", target),
            crumbs=[("user", target["user"]), ("erase", None)],
        )

    async def erase_now(self, request: Request, form: Mapping[str, str]) -> Response:
        origin = request.headers.get("origin")
        if origin and origin != "null" and URL(origin).netloc != request.url.netloc:
            raise _HTTPError(403, "This form was sent from another site.")
        target = self.erase_target(form)
        if not _same(str(form.get("csrf") or ""), self.csrf("erase", target)):
            raise _HTTPError(
                403, "This form has expired or was not made by this page: start again."
            )
        if form.get("confirm") != "yes":
            raise _HTTPError(400, "Tick the confirmation box to erase.")
        if "collection" in target:
            deleted = await self.store.delete(
                target["collection"], scope=self.scope_of(target), actor=ACTOR
            )
            counts = {"memories": deleted}
        else:
            counts = await self.store.erase_user(target["user"], actor=ACTOR)
        logger.info("ui: erased %s: %s", "a scope" if "collection" in target else "a user", counts)
        return self.render(
            request,
            "erased.html",
            title="Erased",
            target=target,
            user=target["user"],
            counts=counts,
            crumbs=[("user", target["user"]), ("erased", None)],
        )


def create_app(
    store: MemoryStore, *, allow_writes: bool = False, token: str | None = None
) -> Starlette:
    """The audit page as an ASGI app on an open store (mountable in a host ASGI app).

    Args:
        store: an open :class:`~pgmemory.store.store.MemoryStore`; the app neither opens nor
            closes it (so it must be opened on the event loop that serves the app).
        allow_writes: offer erasure (of a user, or of one scope) behind a confirmation page;
            off, every erase request gets 403.
        token: when set, every request must present it, as ``Authorization: Bearer <token>``,
            or once as ``?token=<token>`` (or the sign-in form), which sets an HttpOnly,
            SameSite=Strict cookie; without it: 401. Required when ``allow_writes`` is on.

    Returns:
        The Starlette application.

    Raises:
        ValueError: ``allow_writes`` without a token.
    """
    if token is not None and not token.strip():
        token = None
    if allow_writes and token is None:
        raise ValueError(
            "allow_writes needs a token: pass token=... (e.g. from PGMEMORY_UI_TOKEN), so only "
            "operators who hold it can erase"
        )
    auth = _Auth(token) if token is not None else None
    ui = _UI(store, allow_writes=allow_writes, auth=auth)
    routes = [
        Route("/", ui.page(ui.index), name="index"),
        Route("/login", ui.page(ui.login), name="login", methods=["GET", "POST"]),
        Route("/user", ui.page(ui.user), name="user"),
        Route("/user/memories", ui.page(ui.memories), name="memories"),
        Route("/user/memory", ui.page(ui.memory), name="memory"),
        Route("/user/recalls", ui.page(ui.recalls), name="recalls"),
        Route("/user/recall", ui.page(ui.recall), name="recall"),
        Route("/user/audit", ui.page(ui.audit), name="audit"),
        Route("/user/facts", ui.page(ui.facts), name="facts"),
        Route("/user/session", ui.page(ui.session), name="session"),
        Route("/user/erase", ui.page(ui.erase), name="erase", methods=["GET", "POST"]),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(_Guard, auth=auth)])
    return app


__all__ = ["ACTOR", "COOKIE_NAME", "PROVIDER", "create_app"]
