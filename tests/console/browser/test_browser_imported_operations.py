"""The Imported and Operations pages in headless Chromium: imported Claude Code and Codex sessions (projected by the
real journal-writer) listed and opened from the navigation, their attacker-controlled prompt and tool output shown
as text; the operator's Operations page with the consumers and billing's dead letters, which an analyst neither
sees in the navigation nor reaches by URL."""

from __future__ import annotations

import re
import uuid

from playwright.async_api import expect

from tests.console.browser.conftest import Tab, shoot
from tests.console.test_imported import HOSTILE_OUTPUT, HOSTILE_PROMPT, imports
from tests.console.test_operations import HOSTILE_REASON, dead_letters

__all__ = ["dead_letters", "imports"]  # fixtures of tests/console, used here


async def test_imported_work_from_the_navigation(tab: Tab, imports: dict[str, uuid.UUID]) -> None:
    page = tab.page
    await tab.sign_in("olivia")
    await page.get_by_role("navigation").get_by_role("link", name="Imported").click()
    await expect(page.get_by_role("heading", name="Imported work", level=1)).to_be_visible()
    rows = page.locator("table.imported tbody tr")
    await expect(rows).to_have_count(5)  # two Claude Code trees of two (a subagent each) and a Codex session
    acme = page.get_by_role("link", name="acme <i>refactor</i>")
    await expect(acme).to_have_attribute("href", f"/imported/{imports['acme']}")
    await shoot(page, "imported")

    await acme.click()
    await expect(page).to_have_url(re.compile(f"/imported/{imports['acme']}$"))
    await expect(page.locator("dl.facts")).to_contain_text("claude-code")
    await expect(page.get_by_text(HOSTILE_PROMPT)).to_be_visible()
    await expect(page.locator("ul.files").first).to_contain_text("/home/dev/web/app.py")
    await expect(page.get_by_role("heading", name="Subagent sessions")).to_be_visible()
    await expect(page.locator("#billed")).to_contain_text("1 call(s)")
    html = await page.content()
    assert "&lt;img src=x onerror=" in html and HOSTILE_OUTPUT not in html
    assert await page.locator("main img, main b, main script, main em").count() == 0
    await shoot(page, "imported-session", full_page=True)
    tab.assert_clean()


async def test_operations_for_operators_only(tab: Tab, dead_letters: int) -> None:
    page = tab.page
    await tab.sign_in("olivia")
    await page.get_by_role("navigation").get_by_role("link", name="Operations").click()
    await expect(page.get_by_role("heading", name="Operations", level=1)).to_be_visible()
    consumers = page.locator("table.consumers")
    for name in ("journal-writer", "billing", "graph-writer"):
        await expect(consumers.locator("tbody th", has_text=name).first).to_be_visible()
    await expect(page.get_by_text("profile_mismatch").first).to_be_visible()
    await expect(page.get_by_text(HOSTILE_REASON)).to_be_visible()
    await expect(page.get_by_text("cos dlq replay --all").first).to_be_visible()
    assert await page.locator("main script").count() == 0
    await shoot(page, "operations", full_page=True)
    tab.assert_clean()

    # An analyst: no link, and the page refused by URL.
    await page.get_by_role("button", name="Sign out").click()
    await tab.sign_in("alice")
    await expect(page.get_by_role("navigation").get_by_role("link", name="Operations")).to_have_count(0)
    response = await page.goto("/operations")
    assert response is not None and response.status == 403
    await expect(page.get_by_role("heading", level=1)).to_have_text("403 Forbidden")
    assert (await page.request.get("/api/operations")).status == 403
