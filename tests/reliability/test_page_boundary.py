"""The audit page's network boundary: it answers only to the names it serves, only to who holds
the token, and reading it changes nothing.

- **Host**: every route, asked under a name the page does not serve (what a DNS-rebinding page
  or a misrouted proxy sends), answers 400 with a line naming the setting, token or not; the
  names it serves (loopback's, the bound address, the allowed hosts; with or without a port)
  are answered.
- **Token by default**: the page needs a live token issued for it (kept hashed in the
  store) unless opened with ``insecure_no_token``; every route, without one (or with a
  revoked one, another face's, or a forged cookie), answers 401 and shows nothing.
- **GETs write nothing**: every GET route, for a seeded user and for a made-up one, searches
  in every mode included, leaves every pgmemory table (the audits and the user secrets among
  them) exactly as it was, so nothing a cross-site GET triggers can write.
- **The directory lists users**: after ``erase_user`` no ``erased:`` pseudonym is listed, and
  paging walks past them; the jump form opens any id. The search is cut off at SEARCH_MAX.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Route

from pgmemory.admin import Admin
from pgmemory.store.modes import MODES
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from pgmemory.ui import create_app
from pgmemory.ui.app import COOKIE_NAME, SEARCH_MAX
from pgmemory.ui.guard import ALLOWED_HOSTS_ENV, host_entry
from pgmemory.ui.server import served_hosts
from tests.conftest import unique
from tests.ui.conftest import Seeded, random_vectors


@pytest_asyncio.fixture
async def store(database_url: str, embedder: Any, settings: Any) -> AsyncIterator[MemoryStore]:
    """The page is the operators': it runs as the owner (the application role has no grant on
    the tokens), whatever role the rest of the suite runs as."""
    async with MemoryStore(database_url, settings=settings, embedder=embedder) as opened:
        yield opened


#: Names a hostile or misrouted request carries: rebinding names, look-alikes, ports, junk.
FOREIGN_HOSTS = [
    "attacker.example",
    "attacker.example:8765",
    "localhost.attacker.example",
    "LOCALHOST.attacker.example:8765",
    "127.0.0.1.nip.io",
    "127.0.0.1.nip.io:8765",
    "127-0-0-1.nip.io",
    "attacker.example.localhost.",
    "localhost.",
    "127.0.0.2",
    "0.0.0.0:8765",
    "[::2]",
    "[::1].attacker.example",
    "127.0.0.1@attacker.example",
    "localhost:notaport",
    "localhost:",
    ":8765",
    "::1",
    "",
    " ",
]
#: The names a default page answers to.
LOOPBACK = ["127.0.0.1", "127.0.0.1:8765", "localhost", "localhost:80", "LocalHost:8765",
            "[::1]", "[::1]:8765"]  # fmt: skip
#: What a reverse proxy's operator allows, and what each allowed entry must still refuse.
PROXY_ALLOWED = ["audit.example.com", "proxy.example:8443"]
PROXY_ACCEPTED = ["audit.example.com", "AUDIT.example.com:443", "proxy.example:8443"]
PROXY_REFUSED = ["proxy.example", "proxy.example:9999", "sub.audit.example.com",
                 "audit.example.com.attacker.example", "example.com"]  # fmt: skip


def routes(app: Starlette) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, read from its routing table (new routes count)."""
    found = []
    for route in app.routes:
        assert isinstance(route, Route)
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                found.append((method, route.path))
    assert len(found) >= 12  # 10 GET pages, the sign-in POST and the erase POST
    return found


def client(app: Starlette, **kwargs: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765", **kwargs)


async def ask(
    http: httpx.AsyncClient, method: str, path: str, params: dict[str, str], **kwargs: Any
) -> httpx.Response:
    if method == "POST":
        return await http.post(path, data={**params, "token": "wrong"}, **kwargs)
    return await http.get(path, params=params, **kwargs)


def refused_for_its_host(response: httpx.Response) -> bool:
    return (
        response.status_code == 400
        and ALLOWED_HOSTS_ENV in response.text
        and response.text.count("\n") == 1
        and response.headers["content-type"].startswith("text/plain")
    )


@pytest.fixture
def params(seeded: Seeded) -> dict[str, str]:
    return {"user": seeded.user, "collection": seeded.collection, "session": seeded.session,
            "id": str(seeded.memory_ids[0])}  # fmt: skip


async def test_every_route_refuses_every_foreign_host(
    store: MemoryStore, seeded: Seeded, params: dict[str, str], token: str
) -> None:
    default = create_app(store, allow_writes=True)
    proxied = create_app(store, allowed_hosts=PROXY_ALLOWED)
    opened = create_app(store, insecure_no_token=True)
    cases = [(default, FOREIGN_HOSTS), (proxied, FOREIGN_HOSTS + PROXY_REFUSED),
             (opened, FOREIGN_HOSTS)]  # fmt: skip
    for app, hosts in cases:
        async with client(app) as http:
            for (method, path), host, credentials in itertools.product(
                routes(app), hosts, [{}, {"Authorization": f"Bearer {token}"}]
            ):
                answer = await ask(
                    http, method, path, params, headers={"Host": host, **credentials}
                )
                assert refused_for_its_host(answer), (method, path, host, answer.status_code)
                assert seeded.user not in answer.text and "set-cookie" not in answer.headers
                assert answer.headers["x-frame-options"] == "DENY"  # headers even on refusals


async def test_a_request_without_any_host_header_is_refused(store: MemoryStore) -> None:
    app = create_app(store, insecure_no_token=True)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.0", "method": "GET",
             "scheme": "http", "path": "/", "raw_path": b"/", "root_path": "",
             "query_string": b"", "headers": [], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 8765)}  # fmt: skip
    await app(scope, receive, send)
    assert sent[0]["status"] == 400
    assert ALLOWED_HOSTS_ENV.encode() in b"".join(m.get("body", b"") for m in sent[1:])


async def test_the_names_it_serves_are_answered(
    store: MemoryStore, seeded: Seeded, token: str
) -> None:
    cases = [
        (create_app(store), LOOPBACK),
        (create_app(store, allowed_hosts=PROXY_ALLOWED), LOOPBACK + PROXY_ACCEPTED),
        # the bound address is served (as `pgmemory ui --host` passes it), a wildcard names none
        (create_app(store, allowed_hosts=served_hosts("192.0.2.7")),
         ["192.0.2.7", "192.0.2.7:8765"]),
        (create_app(store, allowed_hosts=served_hosts("2001:db8::7")),
         ["[2001:db8::7]", "[2001:db8::7]:8765"]),
    ]  # fmt: skip
    for app, hosts in cases:
        async with client(app, headers={"Authorization": f"Bearer {token}"}) as http:
            for host in hosts:
                index = await http.get("/", params={"after": seeded.user[:-1]},
                                       headers={"Host": host})  # fmt: skip
                assert index.status_code == 200, host
                assert seeded.user in index.text, host
                unsigned = await http.get("/", headers={"Host": host, "Authorization": ""})
                assert unsigned.status_code == 401, host  # served, and still behind the token
    assert served_hosts("0.0.0.0") == served_hosts("::") == []
    assert served_hosts("::1", ["a.example"]) == ["[::1]", "a.example"]
    assert host_entry("2001:DB8::1") == "[2001:db8::1]"
    for bad in ["*", "*.example.com", "https://audit.example.com", "audit.example.com/",
                "a b", "", "a,b", "user@host", "name:", ":8443"]:  # fmt: skip
        with pytest.raises(ValueError, match="not a host name"):
            create_app(store, allowed_hosts=[bad])


async def test_every_route_needs_a_live_token_by_default(
    store: MemoryStore, seeded: Seeded, params: dict[str, str], token: str
) -> None:
    admin = Admin(store)
    revoked = await admin.issue_token(unique("revoked"))
    await admin.revoke_token(revoked.info.id)
    app = create_app(store, allow_writes=True)
    mcp = (await admin.issue_token(unique("mcp"), purpose="mcp")).token  # opens another face
    wrong = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"},
             {"Authorization": f"Bearer {revoked.token}"}, {"Authorization": f"Bearer {mcp}"},
             {"Cookie": f"{COOKIE_NAME}=wrong"}, {"Cookie": f"{COOKIE_NAME}={token}"},
             {"Cookie": f"{COOKIE_NAME}={revoked.info.id}.{'0' * 64}"}]  # fmt: skip
    async with client(app) as http:
        for (method, path), headers in itertools.product(routes(app), wrong):
            answer = await ask(http, method, path, params, headers=headers)
            assert answer.status_code == 401, (method, path, headers)
            assert "Sign in" in answer.text and seeded.user not in answer.text
            assert "set-cookie" not in answer.headers


async def table_counts(engine: AsyncEngine) -> dict[str, int]:
    """Rows of every pgmemory table, read as the owner (the secrets too)."""
    async with engine.connect() as conn:
        tables = (
            await conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                    "AND tablename LIKE 'pgmemory%' ORDER BY tablename"
                )
            )
        ).scalars()
        counts = {}
        for table in list(tables):
            counts[table] = (
                await conn.execute(text(f'SELECT count(*) FROM "{table}"'))
            ).scalar_one()
    assert {"pgmemory_recall_audit", "pgmemory_memory_audit", "pgmemory_fact_audit",
            "pgmemory_user_secrets", "pgmemory_memories"} <= set(counts)  # fmt: skip
    return counts


async def test_no_get_writes_anything(
    store: MemoryStore, seeded: Seeded, owner_engine: AsyncEngine, token: str
) -> None:
    recall = (await Admin(store).user_recalls(seeded.user)).items[0].id
    made_up = unique("made-up")
    app = create_app(store, allow_writes=True)
    gets = [path for method, path in routes(app) if method == "GET"]
    queries: list[dict[str, str]] = [{}]
    queries += [{"q": "what do I eat?", "mode": mode} for mode in MODES]
    queries += [{"q": "peanuts"}, {"id": str(recall)}, {"id": str(seeded.deleted_id)}]
    before = await table_counts(owner_engine)
    # As a cross-site page would send them: a signed-in browser's cookie, a foreign Origin.
    async with client(app) as http:
        signed_in = await http.get("/", params={"token": token})  # the ?token= sign-in GET
        assert signed_in.status_code == 303 and COOKIE_NAME in http.cookies
        for path, user, query in itertools.product(gets, [seeded.user, made_up], queries):
            params = {"user": user, "collection": seeded.collection,
                      "session": seeded.session, **query}  # fmt: skip
            answer = await http.get(path, params=params, headers={
                "Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"})  # fmt: skip
            assert answer.status_code < 500, (path, user, query)
        searched = await http.get("/user/memories", params={
            "user": seeded.user, "collection": seeded.collection, "q": "peanuts", "mode": "text"})  # fmt: skip
        assert "I am allergic to peanuts" in searched.text  # the search did run
    assert await table_counts(owner_engine) == before
    async with owner_engine.connect() as conn:
        secret = await conn.execute(
            text("SELECT count(*) FROM pgmemory_user_secrets WHERE user_id = :u"), {"u": made_up}
        )
        assert secret.scalar_one() == 0
    listed = await Admin(store).list_users(after=made_up[:-1], limit=5)
    assert made_up not in [u.user_id for u in listed.users]


async def test_the_directory_lists_no_pseudonym_and_pages_past_them(
    store: MemoryStore, seeded: Seeded, collection: str, token: str
) -> None:
    # Users on both sides of where the pseudonyms sort (in C and in natural-language orders).
    before, after = f"erasea-{unique('u')}", f"erasedz-{unique('u')}"
    for user in (before, after):
        await store.add(collection, [MemoryRecord(content="kept", scope=MemoryScope(user_id=user))])
    for _ in range(3):  # three erased users: their audit rows stay under their pseudonyms
        doomed = unique("doomed")
        await store.add(
            collection, [MemoryRecord(content="gone", scope=MemoryScope(user_id=doomed))]
        )
        await store.erase_user(doomed)
    await store.erase_user(seeded.user)
    pseudonyms = await pseudonyms_of(store)
    assert len(pseudonyms) >= 4
    app = create_app(store)
    async with client(app, headers={"Authorization": f"Bearer {token}"}) as http:
        seen: list[str] = []
        cursor = "erase"
        for _ in range(200):  # one user per page: the walk must not stall at the pseudonyms
            page = await http.get("/", params={"after": cursor, "limit": "1"})
            assert page.status_code == 200
            users = [httpx.URL(h.replace("&amp;", "&")).params["user"]
                     for h in re.findall(r'href="(/user\?user=[^"&]*)"', page.text)]  # fmt: skip
            seen += users
            found = re.search(r'rel="next" href="[^"]*after=([^"&]*)', page.text)
            if after in users or found is None:
                break
            cursor = httpx.URL(f"/?after={found.group(1)}").params["after"]
        assert before in seen and after in seen
        assert not [u for u in seen if u.startswith("erased:")]
        big = await http.get("/", params={"after": "erase", "limit": "200"})
        assert not any(p in big.text for p in pseudonyms)
        # Not listed, but an operator can still open a pseudonym's page through the jump form.
        form = re.search(r'<form[^>]*method="get"[^>]*action="(/user)"', big.text)
        assert form and 'name="user"' in big.text
        opened = await http.get(form.group(1), params={"user": pseudonyms[0]})
        assert opened.status_code == 200 and pseudonyms[0] in opened.text
    api = await Admin(store).list_users(after="erase", limit=200)
    assert not [u.user_id for u in api.users if u.user_id.startswith("erased:")]


async def pseudonyms_of(store: MemoryStore) -> list[str]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT DISTINCT user_id FROM pgmemory_memory_audit "
                "WHERE left(user_id, 7) = 'erased:'"
            )
        )
        return list(rows.scalars())


async def test_the_search_is_cut_off(store: MemoryStore, collection: str, token: str) -> None:
    user = unique("many")
    await store.add(
        collection,
        [MemoryRecord(content=f"bulk note {i}", scope=MemoryScope(user_id=user), embedding=v)
         for i, v in enumerate(random_vectors(SEARCH_MAX + 20, seed=11))],
    )  # fmt: skip
    app = create_app(store)
    async with client(app, headers={"Authorization": f"Bearer {token}"}) as http:
        for mode, limit in itertools.product(["text", "hybrid"], ["1000000", "200", ""]):
            page = await http.get("/user/memories", params={
                "user": user, "collection": collection, "q": "bulk note", "mode": mode,
                "limit": limit})  # fmt: skip
            hits = re.findall(r'href="/user/memory\?', page.text)
            assert len(hits) == SEARCH_MAX, (mode, limit, len(hits))  # 70 match; 50 shown
