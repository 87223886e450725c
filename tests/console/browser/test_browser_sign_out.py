"""After signing out, Back shows nothing of what was read: every signed-in page and JSON answer is sent with
`Cache-Control: no-store`, so the browser asks again (and is sent to sign in) instead of showing its copy. In
headless Chromium, on a session published through the real journal-writer."""

from __future__ import annotations

import re

from playwright.async_api import expect

from tests.console.browser.conftest import Tab
from tests.console.conftest import LOOK, SCRIPT
from tests.factories import SessionBuilder


async def test_back_after_signing_out_shows_nothing(tab: Tab, hostile: tuple[SessionBuilder, SessionBuilder]) -> None:
    parent, child = hostile
    page = tab.page
    await tab.sign_in("olivia")
    await page.goto(f"/sessions/{child.session_id}")
    await expect(page.get_by_text(LOOK)).to_be_visible()
    await page.goto(f"/sessions/{parent.session_id}")
    await expect(page.locator(".message.user .text").first).to_have_text(SCRIPT)

    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(re.compile(r"/login$"))
    await page.go_back()
    # The session's page is asked for again, signed out: the sign-in form, nothing of the session.
    await expect(page).to_have_url(re.compile(r"/login\?next=%2Fsessions%2F"))
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert "xylophone" not in await page.content()
    await page.go_back()
    await expect(page).to_have_url(re.compile(r"/login\?next=%2Fsessions%2F"))
    assert "xylophone" not in await page.content() and LOOK not in await page.content()
    tab.assert_clean()


async def test_pages_and_answers_are_not_stored(tab: Tab, hostile: tuple[SessionBuilder, SessionBuilder]) -> None:
    parent, _ = hostile
    page = tab.page
    await tab.sign_in("olivia")
    for url in (
        "/sessions",
        f"/sessions/{parent.session_id}",
        f"/api/sessions/{parent.session_id}",
        "/api/sessions?q=xylophone",
        "/api/me",
        "/sessions/00000000-0000-0000-0000-000000000000",  # an error page too
        "/login",
    ):
        response = await page.request.get(url)
        assert "no-store" in response.headers.get("cache-control", ""), (url, response.headers)
    # The static files, the same for everyone and versioned by their URLs, may be cached.
    static = await page.request.get("/static/console.css")
    assert static.status == 200 and "no-store" not in static.headers.get("cache-control", "")
