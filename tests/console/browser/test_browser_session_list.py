"""The session lists in headless Chromium (issue 32): search finds imported work by a word of its prompt (small
fixtures, and the real corpus when it is there); the Sessions list sorted by cost from its column; the Imported
list with its cost column within a 1,400 px window; a parent row with its profile's tags; a malformed session id
answered by a page that says what an id is."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from playwright.async_api import Browser, expect

from commonos.accounting.pricing import Pricer
from commonos.importer.cli import SOURCES, import_files, nats_publisher
from commonos.proto import events as ev
from commonos.proto.messages import UserMessage
from commonos.runtime.settings import Settings
from tests.billing.support import billing
from tests.console.browser.conftest import Tab, open_tab, shoot
from tests.console.conftest import RunningConsole, Seeded, journal_writer, project
from tests.console.test_session_list import SINCE, T0, imported_work, prompted
from tests.factories import Clock, SessionBuilder
from tests.importer.transcripts import CORPUS, needs_corpus
from tests.support import wait_caught_up

__all__ = ["imported_work"]  # a fixture of tests/console, used here

#: The corpus's Claude Code project whose first prompt asks for a jupyter notebook.
JUPYTER_PROJECT = "-Users-chip-dev-ai-music"


async def test_search_finds_an_imported_session_by_a_word_of_its_prompt(
    tab: Tab, imported_work: dict[str, uuid.UUID]
) -> None:
    page = tab.page
    await tab.sign_in("olivia")
    search = page.get_by_label("Search messages")
    await search.fill("jupyter")
    await search.press("Enter")
    await expect(page).to_have_url(re.compile(r"[?&]q=jupyter"))
    rows = page.locator("table.sessions tbody tr")
    await expect(rows).to_have_count(2)
    link = page.get_by_role("link", name="create a jupyter notebook file")
    await expect(link).to_have_attribute("href", f"/imported/{imported_work['jupyter']}")
    await expect(rows.nth(1).locator(".snippet mark")).to_have_text(re.compile("^jupyter$", re.IGNORECASE))
    # A word of the assistant's reply.
    await search.fill("sync_budget_data")
    await search.press("Enter")
    await expect(rows).to_have_count(1)
    await expect(rows.first.get_by_role("link")).to_have_attribute("href", f"/imported/{imported_work['jupyter']}")
    await rows.first.get_by_role("link").click()
    await expect(page).to_have_url(re.compile(f"/imported/{imported_work['jupyter']}$"))
    tab.assert_clean()


async def test_the_list_sorts_by_cost_from_its_column(
    tab: Tab, console_db: Seeded, hostile: Any, imported_work: dict[str, uuid.UUID]
) -> None:
    page = tab.page
    await tab.sign_in("olivia", start=f"/sessions?since={SINCE}")
    table = page.locator("table.sessions")
    for header in ("Cost", "Tokens", "Model calls", "Duration", "Models"):
        await expect(table.get_by_role("columnheader", name=re.compile(f"^{header}"))).to_be_visible()
    await table.get_by_role("link", name="Cost").click()
    await expect(page).to_have_url(re.compile(r"sort=cost"))
    await expect(table.get_by_role("columnheader", name="Cost ↓")).to_have_attribute("aria-sort", "descending")
    costs = [
        float(text.split()[0].lstrip("$").replace(",", "") or 0)
        for text in await table.locator("tbody td.cost").all_inner_texts()
        if text.startswith("$")
    ]
    assert costs and costs == sorted(costs, reverse=True) and costs[0] > 0
    # The delegated session's calls count in its parent's row, so the parent ranks above it.
    parent, child = hostile
    order = [await a.get_attribute("href") for a in await table.locator("tbody td.title > a").all()]
    assert order.index(f"/sessions/{parent.session_id}") < order.index(f"/sessions/{child.session_id}")
    # Back to newest first through the "Sort by" field.
    await page.get_by_label("Sort by").select_option("time")
    await expect(page).not_to_have_url(re.compile(r"sort=cost"))
    await shoot(page, "sessions-by-cost")
    tab.assert_clean()


async def test_the_imported_list_has_a_cost_column_and_fits_a_1400px_window(
    browser: Browser, console: RunningConsole, console_db: Seeded, nats_url: str
) -> None:
    """A Claude Code session's title (its first prompt) and working folder can be long words without a space."""
    long_title = "Refactor_" + "the_whole_build_pipeline_" * 12
    tree, call = prompted("acme", long_title, long_title, "Done.", T0)
    root, *rest = tree.graph.sessions
    deep = "/home/dev/" + "/".join(f"a-very-long-folder-name-{n}" for n in range(12))
    graph = msgspec.structs.replace(tree.graph, sessions=[msgspec.structs.replace(root, working_dir=deep), *rest])
    await project(nats_url, console_db.dsn, [msgspec.structs.replace(tree, graph=graph), call])
    async with open_tab(browser, console) as tab:
        page = tab.page
        await page.set_viewport_size({"width": 1400, "height": 900})
        await tab.sign_in("olivia", start="/imported")
        table = page.locator("table.imported")
        await expect(table.get_by_role("columnheader", name="Cost")).to_be_visible()
        row = table.locator("tbody tr", has=page.get_by_role("link", name=long_title))
        await expect(row.locator("td.cost")).to_contain_text("$")
        # Its subagent's calls are billed with it.
        await expect(table.locator("tbody td.cost", has_text="in parent").first).to_be_visible()
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1400, f"the page is {width} px wide"
        await shoot(page, "imported-1400")
        tab.assert_clean()


async def test_a_parent_row_shows_its_profile_tags(tab: Tab, console_db: Seeded, nats_url: str) -> None:
    clock = Clock()
    clock.tick(7_200_000)
    parent = SessionBuilder("acme", clock, ("project:site",)).create(source="cli", title="the parent")
    turn = parent.start_turn()
    parent.message(turn, UserMessage(text="delegate this"))
    child = SessionBuilder("acme", clock, ("area:ops", "project:site")).create(
        source="subagent", title="the child", parent_session_id=parent.session_id
    )
    child.start_turn(parent_turn_id=turn, depth=1)
    profile = ev.ProfileUpserted(profile_id="acme", tags=("area:ops",), occurred_at=clock.tick())
    await project(nats_url, console_db.dsn, [profile, *parent.events, *child.events])
    page = tab.page
    await tab.sign_in("olivia")
    for title in ("the parent", "the child"):
        row = page.locator("table.sessions tbody tr", has=page.get_by_role("link", name=title, exact=True))
        await expect(row.locator(".tag")).to_have_text(["area:ops", "project:site"])
    tab.assert_clean()


async def test_a_malformed_session_id_says_what_an_id_is(tab: Tab, console_db: Seeded) -> None:
    page = tab.page
    await tab.sign_in("olivia")
    response = await page.goto("/sessions/nope")
    assert response is not None and response.status == 404
    await expect(page.get_by_role("heading", level=1)).to_have_text("404 Not found")
    await expect(page.locator("main")).to_contain_text("no session “nope”: a session id is a UUID")
    assert "Input should be" not in await page.content()
    api = await page.request.get("/api/sessions/nope")
    assert api.status == 404 and "a session id is a UUID" in (await api.json())["detail"]
    tab.assert_clean()


@needs_corpus
async def test_search_finds_an_imported_corpus_session(
    tab: Tab, console_db: Seeded, nats_url: str, tmp_path: Path
) -> None:
    """The corpus's session that asks for a jupyter notebook, imported as `cos import claude` does."""
    source = CORPUS / "claude" / "projects" / JUPYTER_PROJECT
    if not source.is_dir():
        pytest.skip(f"no {JUPYTER_PROJECT} in the corpus")
    home = tmp_path / "claude" / "projects"
    shutil.copytree(source, home / JUPYTER_PROJECT)
    settings = Settings(nats_url=nats_url)
    async with nats_publisher(settings) as (publish, max_payload):
        run = await import_files(
            SOURCES["claude"], tmp_path / "claude", Pricer(), publish=publish, max_payload=max_payload, settle_s=0
        )
    assert run.published.events > 0
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        async with journal_writer(nats_url, console_db.dsn), billing(nats_url, console_db.dsn):
            await wait_caught_up(js, console_db.dsn, "graph-writer", table="graph.positions")
            await wait_caught_up(js, console_db.dsn, "billing", table="billing_positions")
    finally:
        await nc.close()
    page = tab.page
    await tab.sign_in("olivia")
    await page.get_by_label("Search messages").fill("jupyter")
    await page.get_by_label("Search messages").press("Enter")
    rows = page.locator("table.sessions tbody tr")
    await expect(rows.first).to_be_visible()
    link = rows.first.locator("td.title > a")
    await expect(link).to_have_attribute("href", re.compile(r"^/imported/"))
    await expect(rows.first.locator(".snippet mark").first).to_have_text(re.compile("^jupyter$", re.IGNORECASE))
    # Its cost is what billing billed for it.
    await expect(rows.first.locator("td.cost")).to_contain_text("$")
    await shoot(page, "sessions-search-imported")
    tab.assert_clean()
