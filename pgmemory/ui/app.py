"""The audit page as an ASGI application: what pgmemory remembers about a user, and why.

Server-rendered HTML (Starlette + Jinja2, no script at all), read-only unless built with
``allow_writes=True``. Every page is bounded (see :mod:`pgmemory.admin`); every value is
HTML-escaped by Jinja2's autoescape; every id is shown as the command line prints it
(:func:`pgmemory.text.visible.visible_id`: invisible code points escaped); user ids travel in
query strings, percent-encoded, so any id (``/``, ``%``, quotes, CJK, emoji) round-trips.
Nothing personal is logged: log lines carry counts and route names, never ids, texts or tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import parse_qsl

from pgmemory.admin import Admin
from pgmemory.admin.pages import DEFAULT_PAGE, Cursor, clamp_limit
from pgmemory.errors import PgMemoryError
from pgmemory.store.modes import DEFAULT_MODE, MODES
from pgmemory.store.records import MemoryScope
from pgmemory.text.visible import visible_id
from pgmemory.ui.guard import COOKIE_NAME, Auth, Guard, HostCheck, same, unauthorized
from pgmemory.ui.render import render, require_ui

require_ui()  # before starlette loads: a missing extra is named, not a raw ImportError

from starlette.applications import Starlette  # noqa: E402
from starlette.datastructures import URL  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import RedirectResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore

logger = logging.getLogger(__name__)

#: Actor recorded in the audit for erasures made through the page.
ACTOR = "pgmemory-ui"
#: Search results shown at most.
SEARCH_MAX = 50
#: Largest form body accepted (the forms hold a few ids and a token).
MAX_FORM_BYTES = 16_384


class _Cursors(TypedDict):
    """The page cursors of a request (``?before=`` / ``?after=``)."""

    before: Cursor | None
    after: Cursor | None


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


class _UI:
    """The pages, bound to one open store."""

    def __init__(self, store: MemoryStore, *, allow_writes: bool, tokens: bool) -> None:
        self.store = store
        self.admin = Admin(store)
        self.allow_writes = allow_writes
        self.auth = Auth(self.admin) if tokens else None
        self.secret = os.urandom(32)  # signs the erase forms' CSRF tokens (per process)

    # --- plumbing ----------------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        return render(
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
            return clamp_limit(int(raw)) if raw else DEFAULT_PAGE
        except ValueError:
            return DEFAULT_PAGE

    @staticmethod
    def cursors(request: Request, *, id_type: type = int) -> _Cursors:
        def decode(key: str) -> Cursor | None:
            raw = request.query_params.get(key)
            return Cursor.decode(raw, id_type=id_type) if raw else None

        return {"before": decode("before"), "after": decode("after")}

    def csrf(self, action: str, fields: Mapping[str, str]) -> str:
        payload = json.dumps([action, sorted(fields.items())], ensure_ascii=False)
        return hmac.new(self.secret, payload.encode("utf-8"), hashlib.sha256).hexdigest()

    # --- pages -----------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        after = request.query_params.get("after", "")
        page = await self.admin.list_users(after=after, limit=self.limit_of(request))
        collections = await self.store.list_collections()
        prunes = await self.admin.list_prunes(limit=5)
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
            info = await self.auth.verify(form.get("token", ""))
            if info is not None:
                response = RedirectResponse(request.url_for("index").path, status_code=303)
                self.auth.set_cookie(request, response, info)
                return response
            return unauthorized(request, "That token is not valid (wrong, expired or revoked).")
        return unauthorized(request, None)

    async def user(self, request: Request) -> Response:
        user = self.user_of(request)
        scopes = await self.admin.user_scopes(user)
        sessions = await self.admin.user_sessions(user)
        facts = await self.admin.user_facts(user, limit=20)
        collections: dict[str, int] = {}
        for scope in scopes:
            collections[scope.collection] = collections.get(scope.collection, 0) + scope.memories
        return self.render(
            request,
            "user.html",
            title=visible_id(user),
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
        scopes = await self.admin.user_scopes(user)
        mine = list(dict.fromkeys(s.collection for s in scopes)) or known
        collection = params.get("collection") or (mine[0] if mine else None)
        session = params.get("session") or None
        query = (params.get("q") or "").strip()
        asked = params.get("mode") or DEFAULT_MODE
        mode = MODES[asked].name if asked in MODES else DEFAULT_MODE
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
                audit=False,  # a GET writes nothing: the operator's look is not the user's recall
            )
            logger.info("ui: searched a user's memories (%s, %d hits)", mode, len(hits))
        elif collection is not None:
            page = await self.admin.user_memories(
                user,
                collection,
                session_id=session,
                limit=self.limit_of(request),
                **self.cursors(request, id_type=uuid.UUID),
            )
        return self.render(
            request,
            "memories.html",
            title=f"Memories of {visible_id(user)}",
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
        memory = await self.admin.get_memory(user, memory_id)
        trail = await self.admin.memory_audit_trail(user, memory_id)
        recalls = await self.admin.recalls_of_memory(user, memory_id)
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
        page = await self.admin.user_recalls(
            user, limit=self.limit_of(request), **self.cursors(request)
        )
        return self.render(
            request,
            "recalls.html",
            title=f"Recalls of {visible_id(user)}",
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
        recall = await self.admin.get_recall(user, recall_id)
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
        page = await self.admin.user_memory_audit(
            user, limit=self.limit_of(request), **self.cursors(request)
        )
        return self.render(
            request,
            "audit.html",
            title=f"Audit of {visible_id(user)}",
            user=user,
            page=page,
            limit=self.limit_of(request),
            crumbs=[("user", user), ("write/delete audit", None)],
        )

    async def facts(self, request: Request) -> Response:
        user = self.user_of(request)
        facts = await self.admin.user_facts(user)
        page = await self.admin.user_fact_history(
            user, limit=self.limit_of(request), **self.cursors(request)
        )
        return self.render(
            request,
            "facts.html",
            title=f"Facts of {visible_id(user)}",
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
        page = await self.admin.session_history(user, session, limit=self.limit_of(request), **seqs)
        return self.render(
            request,
            "session.html",
            title=f"Session {visible_id(session)}",
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
            live = sum(s.memories for s in await self.admin.user_scopes(target["user"]))
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
        if not same(str(form.get("csrf") or ""), self.csrf("erase", target)):
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
    store: MemoryStore,
    *,
    allow_writes: bool = False,
    insecure_no_token: bool = False,
    allowed_hosts: Iterable[str] = (),
) -> Starlette:
    """The audit page as an ASGI app on an open store (mountable in a host ASGI app).

    Every request must name the page in its Host header (127.0.0.1, localhost, [::1], or one
    of ``allowed_hosts``), else 400: so a web page the operator visits cannot read it through
    DNS rebinding. And every request must present a live token issued for the page
    (``pgmemory token create NAME`` or :meth:`Admin.issue_token
    <pgmemory.admin.admin.Admin.issue_token>`; kept hashed in the store, revocable, expiring),
    unless the page is opened on purpose with ``insecure_no_token=True``. GETs write nothing:
    the page's searches are not recorded in the recall audit (they are the operator's, not the
    user's recalls), and neither are its reads.

    Args:
        store: an open :class:`~pgmemory.store.store.MemoryStore`; the app neither opens nor
            closes it (so it must be opened on the event loop that serves the app).
        allow_writes: offer erasure (of a user, or of one scope) behind a confirmation page;
            off, every erase request gets 403.
        insecure_no_token: serve without a token: whoever reaches the page reads every memory.
            Read-only only.
        allowed_hosts: more names the page answers to (a reverse proxy's), as Host carries
            them: ``name`` (any port) or ``name:port`` (that port only).

    A token is presented as ``Authorization: Bearer <token>``, or once as ``?token=<token>``
    (or through the sign-in form), which sets an HttpOnly, SameSite=Strict cookie re-checked
    against the token on every request; without one: 401.

    Returns:
        The Starlette application.

    Raises:
        ValueError: ``allow_writes`` with ``insecure_no_token``; an allowed host that is not a
            host name.
    """
    if allow_writes and insecure_no_token:
        raise ValueError(
            "allow_writes needs tokens: drop insecure_no_token, so only operators holding a "
            "token issued for the page (`pgmemory token create NAME`) can erase"
        )
    hosts = HostCheck(tuple(allowed_hosts))
    ui = _UI(store, allow_writes=allow_writes, tokens=not insecure_no_token)
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
    app = Starlette(routes=routes, middleware=[Middleware(Guard, hosts=hosts, auth=ui.auth)])
    return app


__all__ = ["ACTOR", "COOKIE_NAME", "create_app"]
