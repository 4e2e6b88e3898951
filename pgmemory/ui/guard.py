"""The audit page's boundary: the token check and sign-in cookie, and the security headers
every response carries."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import quote, urlencode

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from pgmemory.ui.render import render

#: Name of the cookie a ``?token=`` login sets (HttpOnly, SameSite=Strict).
COOKIE_NAME = "pgmemory_ui"
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


class Auth:
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
        if scheme.lower() == "bearer" and same(credential.strip(), self.token):
            return None
        if same(request.cookies.get(COOKIE_NAME, ""), self.session_value):
            return None
        offered = request.query_params.get("token")
        if offered is not None and request.method == "GET":
            if not same(offered, self.token):
                return unauthorized(request, "That token is not right.")
            # Signed in: drop the token from the address (history, bookmarks) at once.
            kept = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.replace(query=urlencode(kept, quote_via=quote, safe=""))
            response = RedirectResponse(relative(target), status_code=303)
            self.set_cookie(request, response)
            return response
        if request.url.path == login_path(request):
            return None  # the sign-in form, and its POST (which checks the token itself)
        return unauthorized(request, None)

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


class Guard:
    """ASGI middleware: the token check (when a token is set) and the security headers."""

    def __init__(self, app: ASGIApp, *, auth: Auth | None) -> None:
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


def same(offered: str, expected: str) -> bool:
    return hmac.compare_digest(offered.encode("utf-8"), expected.encode("utf-8"))


def relative(url: URL) -> str:
    return url.path + (f"?{url.query}" if url.query else "")


def login_path(request: Request) -> str:
    return (request.scope.get("root_path") or "") + "/login"


def unauthorized(request: Request, problem: str | None) -> Response:
    response = render(request, "login.html", status=401, title="Sign in", problem=problem)
    response.headers["www-authenticate"] = "Bearer"
    return response
