"""The audit page through an in-process ASGI client: auth, read-only, escaping, paging, ids."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator

import httpx
import markupsafe
import pytest
from sqlalchemy import text
from starlette.applications import Starlette
from starlette.routing import Mount

from pgmemory.admin import Admin, pages
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from pgmemory.ui import create_app
from pgmemory.ui.app import ACTOR, COOKIE_NAME
from pgmemory.ui.server import TOKEN_ENV, check_access
from tests.conftest import unique
from tests.ui.conftest import AWKWARD_USER_IDS, SCRIPT_MEMORY, Seeded, random_vectors


def bearer(token: str) -> dict[str, str]:
    """What an operator's program sends: the token, as a header."""
    return {"Authorization": f"Bearer {token}"}


def client_for(app: Starlette, **kwargs: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost:8765", **kwargs
    )


@pytest.fixture
async def reader(store: MemoryStore, token: str) -> AsyncIterator[httpx.AsyncClient]:
    """A signed-in client of the read-only page (the default: tokens, on loopback)."""
    async with client_for(create_app(store), headers=bearer(token)) as client:
        yield client


def links(body: str, pattern: str) -> list[str]:
    """The hrefs in a page matching a regex, HTML-unescaped (as a browser would follow them)."""
    return [
        html.unescape(h)
        for h in re.findall(r'href="([^"]*)"', body)
        if re.search(pattern, html.unescape(h))
    ]


async def test_a_live_token_opens_the_page_and_a_revoked_one_no_longer(
    store: MemoryStore, token: str
) -> None:
    admin = Admin(store)
    app = create_app(store)
    async with client_for(app) as client:
        denied = await client.get("/")
        assert denied.status_code == 401 and "Sign in" in denied.text
        assert (await client.get("/user", params={"user": "x"})).status_code == 401
        assert (await client.get("/", headers=bearer("nope"))).status_code == 401
        assert (await client.get("/", headers=bearer(token + "x"))).status_code == 401
        assert (await client.get("/", headers=bearer(token))).status_code == 200
        assert (await client.get("/", params={"token": "nope"})).status_code == 401
        # ?token= signs in: a cookie (HttpOnly, SameSite=Strict), and the token leaves the URL.
        login = await client.get("/user", params={"user": "a/b", "token": token})
        assert login.status_code == 303
        assert login.headers["location"] == "/user?user=a%2Fb"
        cookie = login.headers["set-cookie"]
        assert (
            cookie.startswith(f"{COOKIE_NAME}=")
            and "HttpOnly" in cookie
            and "SameSite=strict" in cookie
        )
        assert token not in cookie and token[4:20] not in cookie
        assert (await client.get("/")).status_code == 200  # the client kept the cookie
        # A forged cookie (another token's number, or no signature) opens nothing.
        number = client.cookies[COOKIE_NAME].split(".")[0]
        for forged in (f"{int(number) + 1}.{'0' * 64}", number, f"{number}."):
            async with client_for(app, cookies={COOKIE_NAME: forged}) as other:
                assert (await other.get("/")).status_code == 401, forged
        # The cookie is signed by this page's process: another page does not take it.
        kept = client.cookies[COOKIE_NAME]
        async with client_for(create_app(store), cookies={COOKIE_NAME: kept}) as other:
            assert (await other.get("/")).status_code == 401
        # Revoking the token locks out its header and the cookie it signed in, at once.
        [live] = [t for t in await admin.list_tokens() if str(t.id) == number]
        assert (await admin.revoke_token(live.name)) is not None
        assert (await client.get("/")).status_code == 401
        assert (await client.get("/", headers=bearer(token))).status_code == 401
    second = (await admin.issue_token(unique("operator"))).token
    async with client_for(create_app(store)) as client:
        form = await client.post("/login", data={"token": second})
        assert form.status_code == 303 and COOKIE_NAME in form.headers["set-cookie"]
        assert (await client.get("/")).status_code == 200
        wrong = await client.post("/login", data={"token": token})  # the revoked one
        assert wrong.status_code == 401 and "revoked" in wrong.text


async def test_tokens_are_kept_hashed_expire_and_open_only_their_purpose(
    store: MemoryStore,
) -> None:
    from datetime import timedelta

    from pgmemory.admin.tokens import token_sha256
    from pgmemory.errors import InvalidInputError

    admin = Admin(store)
    name = unique("operator")
    issued = await admin.issue_token(name, lifetime=timedelta(hours=1))
    assert issued.token.startswith("pgm_") and len(issued.token) >= 40
    assert issued.token not in repr(issued) and issued.token not in repr(issued.info)
    async with store.engine.connect() as conn:
        stored = (
            await conn.execute(
                text("SELECT to_jsonb(t)::text FROM pgmemory_access_tokens AS t WHERE name = :n"),
                {"n": name},
            )
        ).scalar_one()
    assert issued.token not in stored and token_sha256(issued.token) in stored
    assert (await admin.verify_token(issued.token)) is not None
    assert (await admin.verify_token(issued.token, purpose="mcp")) is None
    with pytest.raises(InvalidInputError, match="already named"):
        await admin.issue_token(name)
    for lifetime in (timedelta(0), timedelta(days=400), timedelta(seconds=-1)):
        with pytest.raises(InvalidInputError, match="lifetime"):
            await admin.issue_token(unique("operator"), lifetime=lifetime)
    with pytest.raises(InvalidInputError, match="purpose"):
        await admin.issue_token(unique("operator"), purpose="everything")
    # Expired (by the server's clock): refused, and its name is free again.
    async with store.engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE pgmemory_access_tokens SET created_at = now() - interval '2 hours', "
                "expires_at = now() - interval '1 second' WHERE name = :n"
            ),
            {"n": name},
        )
    assert (await admin.verify_token(issued.token)) is None
    assert name not in [t.name for t in await admin.list_tokens()]
    assert name in [t.name for t in await admin.list_tokens(include_inactive=True)]
    again = await admin.issue_token(name)
    assert (await admin.verify_token(again.token)) is not None
    assert (await admin.revoke_token(name)) is not None
    assert (await admin.revoke_token(name)) is None  # nothing live left under that name


async def test_writes_and_open_binds_need_tokens(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match="tokens"):
        create_app(store, allow_writes=True, insecure_no_token=True)
    create_app(store)  # tokens, the default
    create_app(store, insecure_no_token=True)  # the explicit opt-out
    with pytest.raises(ValueError, match="--insecure-no-token"):
        check_access("0.0.0.0", allow_writes=False, insecure_no_token=True)
    with pytest.raises(ValueError, match="--insecure-no-token"):
        check_access("127.0.0.1", allow_writes=True, insecure_no_token=True)
    check_access("127.0.0.1", allow_writes=False, insecure_no_token=True)
    check_access("::1", allow_writes=False, insecure_no_token=True)
    check_access("0.0.0.0", allow_writes=True, insecure_no_token=False)
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    with pytest.raises(ValueError, match="retired"):
        check_access("127.0.0.1", allow_writes=False, insecure_no_token=False)


async def test_read_only_refuses_erasure(
    reader: httpx.AsyncClient, store: MemoryStore, seeded: Seeded
) -> None:
    refused = await reader.post(
        "/user/erase", data={"user": seeded.user, "confirm": "yes", "csrf": "x"}
    )
    assert refused.status_code == 403 and "read-only" in refused.text
    assert (await reader.get("/user/erase", params={"user": seeded.user})).status_code == 403
    assert "Erase" not in (await reader.get("/user", params={"user": seeded.user})).text
    assert len((await Admin(store).user_memories(seeded.user, seeded.collection)).items) == 3


async def test_markup_in_a_memory_renders_as_text(
    reader: httpx.AsyncClient, seeded: Seeded
) -> None:
    for path, params in [
        ("/user/memories", {"user": seeded.user, "collection": seeded.collection}),
        ("/user/memory", {"user": seeded.user, "id": str(seeded.memory_ids[2])}),
    ]:
        page = await reader.get(path, params=params)
        assert page.status_code == 200
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert str(markupsafe.escape(SCRIPT_MEMORY)) in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert "script-src" not in page.headers["content-security-policy"]


async def test_pages_are_bounded_and_linked(
    reader: httpx.AsyncClient, store: MemoryStore, collection: str
) -> None:
    user = unique("bulk")
    await store.add(
        collection,
        [
            MemoryRecord(content=f"bulk note {i}", scope=MemoryScope(user_id=user), embedding=v)
            for i, v in enumerate(random_vectors(250, seed=7))
        ],
    )
    params = {"user": user, "collection": collection}
    first = await reader.get("/user/memories", params={**params, "limit": "1000000"})
    rows = links(first.text, r"^/user/memory\?")
    assert len(rows) == pages.MAX_PAGE
    [older] = links(first.text, r"before=")
    assert "limit" not in older or "limit=200" in older
    second = await reader.get(older)
    assert len(links(second.text, r"^/user/memory\?")) == 50
    assert not links(second.text, r"before=") and links(second.text, r"after=")
    default = await reader.get("/user/memories", params=params)
    assert len(links(default.text, r"^/user/memory\?")) == pages.DEFAULT_PAGE
    junk = await reader.get("/user/memories", params={**params, "before": "not-a-cursor"})
    assert junk.status_code == 400


async def test_awkward_user_ids_round_trip_through_links(
    reader: httpx.AsyncClient, store: MemoryStore, collection: str
) -> None:
    tag = unique("awk")
    for user in AWKWARD_USER_IDS:
        await store.add(
            collection,
            [MemoryRecord(content=f"{tag} memory of {user}", scope=MemoryScope(user_id=user))],
        )
    for user in AWKWARD_USER_IDS:
        index = await reader.get(
            "/", params={"after": user[:-1] + chr(ord(user[-1]) - 1), "limit": 5}
        )
        user_links = links(index.text, r"^/user\?user=")
        wanted = [h for h in user_links if httpx.URL(h).params.get("user") == user]
        assert wanted, (user, user_links)
        page = await reader.get(wanted[0])
        assert page.status_code == 200
        heading = re.search(r"<h1>(.*?)</h1>", page.text, re.S)
        assert heading and html.unescape(re.sub(r"<[^>]*>", "", heading.group(1))) == user
        memories_link = links(page.text, rf"^/user/memories\?.*collection={collection}")[0]
        memories = await reader.get(memories_link)
        assert str(markupsafe.escape(f"{tag} memory of {user}")) in memories.text


async def test_lookalike_ids_are_shown_escaped_and_linked_exactly(
    reader: httpx.AsyncClient, store: MemoryStore, collection: str
) -> None:
    """Three users who would look alike (plain, a zero-width space, a trailing space) are shown
    apart, as the command line prints them; the links still carry each exact id."""
    base = unique("look")
    shown = {base: base, base + "\u200b": base + "\\u200b", base + " ": base + "\\u0020"}
    session = "s\u00a0one  two "  # a no-break space, two spaces inside, one at the end
    session_shown = "s\\u00a0one  two\\u0020"
    for user in shown:
        await store.add(
            collection,
            [MemoryRecord(content="a note", scope=MemoryScope(user_id=user, session_id=session))],
            actor="seed\u200b",
        )
    index = await reader.get("/", params={"after": base[:-1], "limit": 3})
    listed = re.findall(
        r'<a href="/user\?user=[^"]*"><span class="id">(.*?)</span></a>', index.text
    )
    assert sorted(map(html.unescape, listed)) == sorted(shown.values())
    assert "\u200b" not in index.text
    for user, looks in shown.items():
        [link] = [
            h for h in links(index.text, r"^/user\?user=") if httpx.URL(h).params["user"] == user
        ]
        page = await reader.get(link)
        assert (
            re.search(r"<h1>(.*?)</h1>", page.text).group(1) == f'<span class="id">{looks}</span>'
        )
        assert f"<title>{looks} · pgmemory audit</title>" in page.text
        assert f'<span class="id">{session_shown}</span>' in page.text and session not in page.text
        [scope] = links(page.text, r"^/user/memories\?.*session=")
        assert httpx.URL(scope).params["session"] == session
        audit = await reader.get("/user/audit", params={"user": user})
        assert '<td class="mono"><span class="id">seed\\u200b</span></td>' in audit.text
    assert "\u200b" not in audit.text and "\u00a0" not in audit.text


def test_the_page_and_the_command_line_show_an_id_alike() -> None:
    """One rendering: the page's filter is the CLI's text, HTML-escaped, in a span."""
    from pgmemory.cli.common import cell, shown_id
    from pgmemory.ui.render import shown_id as page_id

    for user in ("alice", " <b>a&b</b>\u200b ", "x\\u0020", "a  b\t", *AWKWARD_USER_IDS):
        on_page = str(page_id(user))
        assert on_page == f'<span class="id">{markupsafe.escape(cell(shown_id(user)))}</span>'
        assert "<b>" not in on_page
    assert page_id(None) == page_id("") == ""


async def test_recall_pages_show_what_went_into_the_answer(
    reader: httpx.AsyncClient, seeded: Seeded
) -> None:
    listing = await reader.get("/user/recalls", params={"user": seeded.user})
    assert str(markupsafe.escape(seeded.recall_query)) in listing.text
    assert "text not kept" in listing.text
    recall_links = links(listing.text, r"^/user/recall\?")
    detail = await reader.get(recall_links[-1])  # the older recall: the hybrid one
    assert detail.status_code == 200
    assert "delete" in detail.text and str(seeded.deleted_id) in detail.text
    assert "I am allergic to peanuts" in detail.text
    memory_links = links(detail.text, r"^/user/memory\?")
    assert len(memory_links) == 3
    gone = await reader.get(next(h for h in memory_links if str(seeded.deleted_id) in h))
    assert "no longer stored" in gone.text and "insert" in gone.text
    other = await reader.get(
        "/user/recall", params={"user": unique("nobody"), "id": recall_links[-1].split("id=")[-1]}
    )
    assert other.status_code == 404


async def test_search_shows_scores_and_the_mode(
    reader: httpx.AsyncClient, store: MemoryStore, seeded: Seeded
) -> None:
    page = await reader.get(
        "/user/memories",
        params={
            "user": seeded.user,
            "collection": seeded.collection,
            "q": "peanuts",
            "mode": "text",
        },
    )
    assert page.status_code == 200 and "BM25" in page.text
    assert re.search(r'class="num score"[^>]*>\d+\.\d{4}<', page.text)
    assert "I am allergic to peanuts" in page.text
    # The operator's search is not the user's recall: the audit still holds the seed's two.
    recalls = await Admin(store).user_recalls(seeded.user)
    assert [r.provider for r in recalls.items] == ["agent", "agent"]


async def test_overview_facts_audit_and_session_pages(
    reader: httpx.AsyncClient, seeded: Seeded
) -> None:
    for path, params, expected in [
        ("/user", {"user": seeded.user}, seeded.session),
        ("/user/facts", {"user": seeded.user}, "Ana"),
        ("/user/audit", {"user": seeded.user}, "insert"),
        ("/user/session", {"user": seeded.user, "session": seeded.session}, "nothing with peanuts"),
        ("/", {}, "Users"),
    ]:
        page = await reader.get(path, params=params)
        assert page.status_code == 200, path
        assert expected in page.text, path
    assert (await reader.get("/user")).status_code == 400
    assert (
        await reader.get("/user/memory", params={"user": seeded.user, "id": "zzz"})
    ).status_code == 400


async def test_erasure_needs_confirmation_and_csrf_and_is_audited(
    store: MemoryStore, seeded: Seeded, token: str
) -> None:
    app = create_app(store, allow_writes=True)
    async with client_for(app, headers=bearer(token)) as client:
        confirm = await client.get("/user/erase", params={"user": seeded.user})
        assert confirm.status_code == 200 and "cannot be undone" in confirm.text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm.text).group(1)
        base = {"user": seeded.user, "csrf": csrf}
        assert (await client.post("/user/erase", data=base)).status_code == 400  # not confirmed
        assert (
            await client.post("/user/erase", data={**base, "csrf": "0" * 64, "confirm": "yes"})
        ).status_code == 403
        # A token for the whole user does not erase another target.
        other = {**base, "user": seeded.user + "x", "confirm": "yes"}
        assert (await client.post("/user/erase", data=other)).status_code == 403
        cross = await client.post(
            "/user/erase", data={**base, "confirm": "yes"}, headers={"Origin": "http://evil.test"}
        )
        assert cross.status_code == 403
        done = await client.post("/user/erase", data={**base, "confirm": "yes"})
        assert done.status_code == 200 and "Erased" in done.text
    assert (await Admin(store).user_memories(seeded.user, seeded.collection)).items == []
    # The audit keeps the deletions under the erasure's pseudonym, not the user id.
    assert (await Admin(store).user_memory_audit(seeded.user)).items == []
    async with store.engine.connect() as conn:
        pseudonym = (
            await conn.execute(
                text(
                    "SELECT new_value ->> 'pseudonym' FROM pgmemory_fact_audit WHERE user_id = '' "
                    "AND namespace = 'pgmemory:erasure' ORDER BY id DESC LIMIT 1"
                )
            )
        ).scalar_one()
        texts = await conn.execute(
            text(
                "SELECT count(*) FROM pgmemory_recall_audit WHERE user_id = :u AND query_text IS NOT NULL"
            ),
            {"u": pseudonym},
        )
        assert texts.scalar_one() == 0
    audit = await Admin(store).user_memory_audit(pseudonym)
    assert [(e.operation, e.actor) for e in audit.items[:3]] == [("delete", ACTOR)] * 3


async def test_erasing_one_scope_leaves_the_rest(
    store: MemoryStore, seeded: Seeded, token: str
) -> None:
    keep = unique("keep")
    await store.add(
        seeded.collection,
        [
            MemoryRecord(
                content="other session", scope=MemoryScope(user_id=seeded.user, session_id=keep)
            )
        ],
    )
    async with client_for(
        create_app(store, allow_writes=True),
        headers=bearer(token),
    ) as client:
        target = {"user": seeded.user, "collection": seeded.collection, "session": seeded.session}
        confirm = await client.get("/user/erase", params=target)
        assert "3 live memories" in confirm.text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm.text).group(1)
        done = await client.post("/user/erase", data={**target, "csrf": csrf, "confirm": "yes"})
        assert done.status_code == 200
    left = await Admin(store).user_memories(seeded.user, seeded.collection)
    assert [m.content for m in left.items] == ["other session"]


async def test_mounts_under_a_prefix(store: MemoryStore, seeded: Seeded, token: str) -> None:
    host = Starlette(routes=[Mount("/audit", app=create_app(store))])
    async with client_for(host, headers=bearer(token)) as client:
        index = await client.get("/audit/", params={"after": seeded.user[:-1]})
        assert index.status_code == 200
        [link] = [h for h in links(index.text, r"/user\?user=") if seeded.user in h][:1]
        assert link.startswith("/audit/user?")
        assert (await client.get(link)).status_code == 200


def test_cli_parser_hooks_into_a_host_parser_and_refuses_open_binds_without_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from pgmemory.ui import cli

    parser = argparse.ArgumentParser(prog="pgmemory")
    parser.add_argument("--url")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["--url", "postgresql://x/y", "ui", "--host", "0.0.0.0", "--port", "9", "--allow-writes"]
    )
    assert (args.command, args.host, args.port, args.allow_writes, args.url) == (
        "ui",
        "0.0.0.0",
        9,
        True,
        "postgresql://x/y",
    )
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    # Refused before any server or database is touched.
    nowhere = ["--url", "postgresql://nowhere.invalid/db"]
    assert cli.main(["--host", "0.0.0.0", "--insecure-no-token", *nowhere]) == 2
    assert "--insecure-no-token" in capsys.readouterr().err
    monkeypatch.setenv(TOKEN_ENV, "a-plain-text-token")
    assert cli.main(nowhere) == 2  # the retired setting: refused, never used
    assert "retired" in capsys.readouterr().err
    monkeypatch.delenv(TOKEN_ENV)
    assert cli.main(["--allowed-host", "https://x/", "--url", "postgresql://nowhere.invalid/db",
                     "--insecure-no-token"]) == 2  # fmt: skip
    assert "not a host name" in capsys.readouterr().err
