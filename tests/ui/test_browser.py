"""The audit page in a real headless browser (Debian's chromium driven by playwright), served by
uvicorn on a free loopback port: navigation, erasure with confirmation, inert markup.

Screenshots go to the test's temporary folder; with PGMEMORY_UI_SCREENSHOTS=1 they are also
written to docs/screenshots/ (to refresh the committed ones).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import uvicorn
from sqlalchemy import text

from pgmemory.admin import Admin
from pgmemory.embedders import CachedEmbedder
from pgmemory.settings import Settings
from pgmemory.store.records import MemoryRecord, MemoryScope
from pgmemory.store.store import MemoryStore
from pgmemory.ui import create_app
from tests.conftest import unique
from tests.ui.conftest import SCRIPT_MEMORY, Seeded

playwright_api = pytest.importorskip("playwright.async_api")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium")

if CHROMIUM is None:
    if os.geteuid() == 0:
        pytest.fail(
            "chromium is missing: `make .venv/.installed` installs Debian's chromium as root "
            "(or run `apt-get install chromium`)",
            pytrace=False,
        )
    pytestmark = pytest.mark.skip(
        reason="Debian's chromium is not installed and this user cannot install it "
        "(as root, `make .venv/.installed` does): the browser tests need it"
    )


class _Server(threading.Thread):
    """The app under uvicorn on its own event loop and store, in a thread."""

    def __init__(self, database_url: str, embedder: CachedEmbedder) -> None:
        super().__init__(daemon=True)
        self.database_url = database_url
        self.embedder = embedder
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server: uvicorn.Server | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.token = ""  # issued for the page once the store is open

    def run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by the fixture
            self.error = exc
            self.ready.set()

    async def _serve(self) -> None:
        settings = Settings(_env_file=None)  # type: ignore[call-arg]
        async with MemoryStore(
            self.database_url, settings=settings, embedder=self.embedder
        ) as store:
            self.token = (await Admin(store).issue_token(unique("browser"))).token
            app = create_app(store, allow_writes=True)
            config = uvicorn.Config(app, access_log=False, lifespan="off", log_level="warning")
            self.server = uvicorn.Server(config)
            serving = asyncio.create_task(self.server.serve(sockets=[self.sock]))
            while not self.server.started and not serving.done():
                await asyncio.sleep(0.02)
            self.ready.set()
            await serving


@pytest.fixture(scope="module")
def ui_server(database_url: str, embedder: CachedEmbedder) -> Iterator[_Server]:
    server = _Server(database_url, embedder)
    server.start()
    assert server.ready.wait(60), "the UI server did not start"
    if server.error is not None:
        raise server.error
    yield server
    if server.server is not None:
        server.server.should_exit = True
    server.join(15)


@pytest.fixture
async def page(ui_server: _Server, tmp_path: Path) -> AsyncIterator[object]:
    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = await browser.new_context(viewport={"width": 1200, "height": 820})
            tab = await context.new_page()
            tab.dialogs = []  # type: ignore[attr-defined]

            async def on_dialog(dialog: object) -> None:
                tab.dialogs.append(dialog.message)  # type: ignore[attr-defined]
                await dialog.dismiss()  # type: ignore[attr-defined]

            tab.on("dialog", on_dialog)
            yield tab
        finally:
            await browser.close()


async def shoot(tab: object, name: str, tmp_path: Path) -> None:
    """Screenshot the visible page (kept small: 1x scale, viewport only)."""
    await tab.screenshot(path=str(tmp_path / f"{name}.png"))  # type: ignore[attr-defined]
    if os.environ.get("PGMEMORY_UI_SCREENSHOTS") == "1":
        target = ROOT / "docs" / "screenshots"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / f"{name}.png", target / f"{name}.png")


async def test_index_to_user_to_recall_to_the_memories_it_returned(
    page: object, ui_server: _Server, store: MemoryStore, seeded: Seeded, tmp_path: Path
) -> None:
    tab = page
    expect = playwright_api.expect
    # Two more users whose ids need percent-encoding, listed right after the seeded one.
    awkward = [f"{seeded.user}/李雷 😀", f"{seeded.user}?x=1&y=%2F"]
    for i, user in enumerate(awkward):
        await store.add(
            seeded.collection,
            [MemoryRecord(content=f"note {i} of an awkward id", scope=MemoryScope(user_id=user))],
        )
    # Sign in with ?token=: the token leaves the address at once, a cookie keeps the session.
    await tab.goto(f"{ui_server.url}/?after={seeded.user[:-1]}&token={ui_server.token}")
    assert "token=" not in tab.url
    await expect(tab.get_by_role("heading", name="Users")).to_be_visible()
    await shoot(tab, "index", tmp_path)
    for user in awkward:  # each id round-trips through its link
        await tab.get_by_role("link", name=user, exact=True).click()
        await expect(tab.get_by_role("heading", name=user, exact=True)).to_be_visible()
        await tab.go_back()

    await tab.get_by_role("link", name=seeded.user, exact=True).click()
    await expect(tab.get_by_role("heading", name=seeded.user)).to_be_visible()
    await tab.get_by_role("link", name="Memories", exact=True).click()
    # The markup memory is shown as text, and nothing of it ran.
    await expect(tab.get_by_text(SCRIPT_MEMORY)).to_be_visible()
    assert await tab.locator("main script, main img").count() == 0
    await shoot(tab, "memories", tmp_path)

    await tab.get_by_role("link", name="Recalls", exact=True).click()
    await expect(tab.get_by_text(seeded.recall_query)).to_be_visible()
    recall = tab.locator(".card.recall", has_text=seeded.recall_query)
    await recall.get_by_role("link", name=re.compile(r"^Recall #\d+$")).click()
    await expect(tab.locator(".badge.gone")).to_have_count(1)  # deleted since: marked, no text
    await expect(tab.locator(".badge.gone")).to_contain_text("delete")
    rows = tab.locator(".card.recall table tr")
    assert await rows.count() == 4  # header + the 3 memories returned
    await shoot(tab, "recall", tmp_path)
    recall_heading = await tab.locator(".card.recall h3 a").inner_text()

    # Follow a returned memory that is still stored: its page lists this recall.
    kept = tab.locator(".card.recall td.content a").filter(has_not=tab.locator(".mono"))
    content = await kept.first.inner_text()
    await kept.first.click()
    await expect(tab.locator("#memory-content")).to_have_text(content)
    await expect(tab.get_by_role("link", name=recall_heading.lower())).to_be_visible()
    assert tab.dialogs == []  # type: ignore[attr-defined]


async def test_erase_a_user_with_confirmation(
    page: object, ui_server: _Server, store: MemoryStore, seeded: Seeded, tmp_path: Path
) -> None:
    tab = page
    expect = playwright_api.expect
    await tab.goto(f"{ui_server.url}/login")
    await tab.get_by_placeholder("token").fill(ui_server.token)
    await tab.get_by_role("button", name="Sign in").click()
    await expect(tab.get_by_role("heading", name="Users")).to_be_visible()

    await tab.goto(f"{ui_server.url}/?after={seeded.user[:-1]}")
    await tab.get_by_role("link", name=seeded.user, exact=True).click()
    await tab.get_by_role("link", name="Erase…").click()
    await expect(tab.get_by_text("Erase everything about this user?")).to_be_visible()
    await shoot(tab, "erase", tmp_path)
    # Unconfirmed, the browser will not even send the form.
    await tab.get_by_role("button", name="Erase").click()
    await expect(tab.get_by_text("Erase everything about this user?")).to_be_visible()
    await tab.get_by_label("I understand: erase it.").check()
    await tab.get_by_role("button", name="Erase").click()
    await expect(tab.get_by_text("Erased.")).to_be_visible()
    await expect(tab.get_by_text("memories: 3")).to_be_visible()

    await tab.get_by_role("link", name="Memories", exact=True).click()
    await expect(
        tab.get_by_text("No memories here.").or_(tab.get_by_text("There is no collection yet."))
    ).to_be_visible()
    await tab.get_by_role("link", name="Write/delete audit").click()
    # The audit no longer names the user: its rows now carry the erasure's pseudonym.
    await expect(tab.locator("tr", has_text="pgmemory-ui")).to_have_count(0)
    assert (await Admin(store).user_memories(seeded.user, seeded.collection)).items == []
    async with store.engine.connect() as conn:
        pseudonym = (
            await conn.execute(
                text(
                    "SELECT new_value ->> 'pseudonym' FROM pgmemory_fact_audit WHERE user_id = '' "
                    "AND namespace = 'pgmemory:erasure' ORDER BY id DESC LIMIT 1"
                )
            )
        ).scalar_one()
    # The pseudonym is no user of the directory, but the jump form opens it.
    await tab.goto(f"{ui_server.url}/?after={quote(pseudonym[:-1])}")
    await expect(tab.get_by_role("link", name=pseudonym, exact=True)).to_have_count(0)
    await tab.get_by_label("Go to user").fill(pseudonym)
    await tab.get_by_role("button", name="Open").click()
    await expect(tab.get_by_role("heading", name=pseudonym, exact=True)).to_be_visible()
    await tab.get_by_role("link", name="Write/delete audit").click()
    erased_rows = tab.locator("tr", has_text="pgmemory-ui").filter(has_text="delete")
    await expect(erased_rows).to_have_count(3)
    assert tab.dialogs == []  # type: ignore[attr-defined]
