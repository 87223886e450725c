"""The console in a real headless Chromium: Debian's `chromium` (installed by scripts/setup) driven by Playwright
with `executable_path`, never a browser Playwright downloads. A missing browser fails these tests, never skips them.

* `browser`: one Chromium per test module (headless; `--no-sandbox` when running as root, as in a container).
* `tab`: a page of a fresh browser context (its own cookies) on the console of the test (tests/console/conftest.py),
  1280x800, every dialog, page error and console error recorded (`Tab.dialogs`, `Tab.errors`,
  `Tab.console_errors`) so that a test can say that no script of the page's content ran and the content security
  policy blocked nothing (`Tab.assert_clean()`).
* `open_tab(browser, console)`: another such tab, for a second person at once.
* `shoot(page, name)`: a screenshot in COS_SCREENSHOTS_DIR, or by default in <tmp>/cos-console-screenshots
  (outside the repository).

COS_CHROMIUM names another Chromium binary. COS_README_SCREENSHOT=docs/console.png writes the README's picture
(test_browser_sessions.py, a session one click from the list, 1280x800; then `pngquant` it).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.async_api import Browser, Dialog, Page, async_playwright, expect

from tests.console.conftest import PASSWORDS, RunningConsole

VIEWPORT = {"width": 1280, "height": 800}

#: Playwright's own waits (an element appearing, a navigation): generous for a shared two-core machine.
expect.set_options(timeout=15_000)


def chromium_path() -> str:
    wanted = os.environ.get("COS_CHROMIUM") or "chromium"
    found = shutil.which(wanted)
    if found is None:
        pytest.fail(
            f"no Chromium: {wanted!r} is not on PATH. The console's browser tests drive Debian's chromium "
            "(scripts/setup installs it: apt-get install chromium chromium-driver), or set COS_CHROMIUM to "
            "a Chromium binary. Playwright's own browser download is not used.",
            pytrace=False,
        )
    return found


def screenshots_dir() -> Path:
    configured = os.environ.get("COS_SCREENSHOTS_DIR")
    path = Path(configured) if configured else Path(tempfile.gettempdir()) / "cos-console-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def shoot(page: Page, name: str, *, full_page: bool = False) -> Path:
    """A PNG of what `page` shows now, as <screenshots dir>/<name>.png."""
    path = screenshots_dir() / f"{name}.png"
    await page.screenshot(path=str(path), full_page=full_page, animations="disabled")
    return path


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    executable = chromium_path()
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, headless=True, args=args)
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class Tab:
    """A browser tab on the console, with what happened in it besides the page itself."""

    page: Page
    console: RunningConsole
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: The browser console's errors (a request refused, the content security policy blocking something).
    console_errors: list[str] = field(default_factory=list)

    @property
    def csp_violations(self) -> list[str]:
        return [e for e in self.console_errors if "Content Security Policy" in e]

    def assert_clean(self) -> None:
        """No script error, no dialog, nothing the content security policy had to block."""
        assert self.errors == [], self.errors
        assert self.dialogs == [], self.dialogs
        assert self.csp_violations == [], self.csp_violations

    async def sign_in(self, name: str, password: str | None = None, *, start: str = "/sessions") -> None:
        """Through the sign-in form, as a person would: `start` redirects to /login and back once signed in."""
        await self.page.goto(start)
        await expect(self.page).to_have_url(re.compile(r"/login\?next="))
        await self.page.get_by_label("Name").fill(name)
        await self.page.get_by_label("Password").fill(password if password is not None else PASSWORDS[name])
        await self.page.get_by_role("button", name="Sign in").click()
        if password is None:
            await expect(self.page.locator("header .who")).to_contain_text(name)


@contextlib.asynccontextmanager
async def open_tab(browser: Browser, console: RunningConsole) -> AsyncIterator[Tab]:
    """A tab of a browser context of its own (another person's cookies), closed on leaving."""
    context = await browser.new_context(base_url=console.url, viewport=VIEWPORT)  # type: ignore[arg-type]
    page = await context.new_page()
    opened = Tab(page, console)

    async def on_dialog(dialog: Dialog) -> None:
        opened.dialogs.append(f"{dialog.type}: {dialog.message}")
        await dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda exc: opened.errors.append(str(exc)))
    page.on("console", lambda m: opened.console_errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
    try:
        yield opened
    finally:
        await context.close()


@pytest.fixture
async def tab(browser: Browser, console: RunningConsole) -> AsyncIterator[Tab]:
    async with open_tab(browser, console) as opened:
        yield opened
