"""The audit page's boundary: the Host check, the token check and sign-in cookie, and the
security headers every response carries. Tokens are the store's (:mod:`pgmemory.admin.tokens`).

The Host check comes first: a page on loopback is still reachable from any web page its
operator visits, through DNS rebinding (a name the attacker controls, re-pointed at
127.0.0.1), and then the browser sends the attacker's name as Host. So the page answers only
to the names it serves: loopback by default, the bound address, and the allowed hosts.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import MutableMapping
from datetime import UTC
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from pgmemory.ui.render import render, require_ui

require_ui()  # before starlette loads: a missing extra is named, not a raw ImportError

from starlette.datastructures import URL, Headers  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import PlainTextResponse, RedirectResponse, Response  # noqa: E402
from starlette.types import ASGIApp, Receive, Scope, Send  # noqa: E402

if TYPE_CHECKING:
    from pgmemory.admin.admin import Admin
    from pgmemory.admin.tokens import TokenInfo

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


#: The names a page answers to whatever else is allowed: this machine's.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
#: The setting (and option, and argument) that allows more names.
ALLOWED_HOSTS_ENV = "PGMEMORY_UI_ALLOWED_HOSTS"


def host_entry(name: str) -> str:
    """An allowed-host entry, normalised: lower case, IPv6 addresses in brackets.

    Args:
        name: a host name or address, optionally with ``:port`` (then only that port).

    Returns:
        The entry as a Host header would carry it.

    Raises:
        ValueError: not a bare name (a scheme, a path, a wildcard, spaces, or empty).
    """
    entry = name.strip().lower()
    if entry.count(":") > 1 and not entry.startswith("["):
        entry = f"[{entry}]"  # a bare IPv6 address
    if not entry or any(c in entry for c in "/\\*@ ,?#") or ":" in (entry[0], entry[-1]):
        raise ValueError(
            f"{name!r} is not a host name: give a name or address as browsers send it in Host "
            "(e.g. audit.example.com, or audit.example.com:8443 for that port only)"
        )
    return entry


class HostCheck:
    """The names the page answers to: loopback's, and the ``allowed`` ones."""

    def __init__(self, allowed: tuple[str, ...] = ()) -> None:
        self.allowed = frozenset(host_entry(h) for h in (*LOOPBACK_HOSTS, *allowed))

    def accepts(self, host: str) -> bool:
        """Whether a Host header names this page (its name alone, or with a port).

        Args:
            host: the Host header as sent.

        Returns:
            True when the name, or the name with that port, is allowed.
        """
        host = host.strip().lower()
        if host in self.allowed:
            return True
        name, colon, port = host.rpartition(":")
        if not colon or "]" in port or not port.isdigit():
            return False  # no port (and not allowed as a whole), or the end of an IPv6 address
        return name in self.allowed

    def refusal(self) -> Response:
        """The answer to a foreign Host: 400 with one line (421 makes some clients retry)."""
        return PlainTextResponse(
            "This audit page does not answer to that Host name (a DNS rebinding or a misrouted "
            f"request). If it is yours, allow it with {ALLOWED_HOSTS_ENV}, `pgmemory ui "
            "--allowed-host NAME` or create_app(..., allowed_hosts=[...]).\n",
            status_code=400,
        )


class Auth:
    """The token check: tokens issued for the page (``pgmemory token create``, purpose
    ``"ui"``), looked up by their hash in the store, and the sign-in cookie.

    The cookie names the token by its number and is signed with a key of this process; every
    request re-checks that the token is still live, so revoking it (or its expiry) locks the
    page at once, cookies included. A token is never kept in the cookie, the page or the logs.
    """

    def __init__(self, admin: Admin) -> None:
        self.admin = admin
        self._key = os.urandom(32)

    def _mac(self, token_id: int) -> str:
        return hmac.new(self._key, f"pgmemory-ui:{token_id}".encode(), hashlib.sha256).hexdigest()

    async def _signed_in(self, request: Request) -> bool:
        raw = request.cookies.get(COOKIE_NAME, "")
        number, _, mac = raw.partition(".")
        if not number.isdigit() or len(number) > 18 or not same(mac, self._mac(int(number))):
            return False
        return await self.admin.token_still_valid(int(number), purpose="ui")

    async def verify(self, offered: str) -> TokenInfo | None:
        """The record of the offered token when it opens the page, else None."""
        return await self.admin.verify_token(offered.strip(), purpose="ui")

    async def check(self, request: Request) -> Response | None:
        """None when the request may pass, else the response to send instead."""
        header = request.headers.get("authorization", "")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() == "bearer" and await self.verify(credential):
            return None
        if await self._signed_in(request):
            return None
        offered = request.query_params.get("token")
        if offered is not None and request.method == "GET":
            info = await self.verify(offered)
            if info is None:
                return unauthorized(request, "That token is not valid (wrong, expired or revoked).")
            # Signed in: drop the token from the address (history, bookmarks) at once.
            kept = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.replace(query=urlencode(kept, quote_via=quote, safe=""))
            response = RedirectResponse(relative(target), status_code=303)
            self.set_cookie(request, response, info)
            return response
        if request.url.path == login_path(request):
            return None  # the sign-in form, and its POST (which checks the token itself)
        return unauthorized(request, None)

    def set_cookie(self, request: Request, response: Response, info: TokenInfo) -> None:
        """Set the sign-in cookie for ``info``'s token: HttpOnly, SameSite=Strict, Secure over
        https, living no longer than the token."""
        response.set_cookie(
            COOKIE_NAME,
            f"{info.id}.{self._mac(info.id)}",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=request.scope.get("root_path") or "/",
            expires=info.expires_at.astimezone(UTC),
        )


class Guard:
    """ASGI middleware: the Host check, the token check (unless the page was opened on
    purpose) and the security headers."""

    def __init__(self, app: ASGIApp, *, hosts: HostCheck, auth: Auth | None) -> None:
        self.app = app
        self.hosts = hosts
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

        refusal: Response | None
        if not self.hosts.accepts(Headers(scope=scope).get("host", "")):
            refusal = self.hosts.refusal()
        else:
            refusal = await self.auth.check(Request(scope)) if self.auth is not None else None
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
