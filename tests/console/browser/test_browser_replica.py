"""The chat page in headless Chromium while the console's read replica lags (a real streaming replica whose replay
is paused: tests/conftest.py `replicated_pg`): the page shows its own turn as it runs (the user's message, the tool
call, the reply, the final status), because the turn comes from NATS, not from a table; the session it started
opens from its link though the replica does not have it (the primary is asked), while the sessions list, read from
the replica, does not show it yet; and the chat page opened again on that session continues it."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

from commonos.loop.service import LoopService
from commonos.runtime.settings import Settings
from tests.console.browser.conftest import Tab, shoot
from tests.console.browser.test_browser_chat import REPLY, open_chat
from tests.console.chat_support import loop_service
from tests.console.conftest import RunningConsole, Seeded, StartConsole
from tests.harness import Replicated

__all__ = ["loop_service"]


@pytest.fixture
def database_url(replica_database: tuple[str, str]) -> str:
    return replica_database[0]


@pytest.fixture
async def console(
    start_console: StartConsole,
    console_db: Seeded,
    nats_url: str,
    replica_database: tuple[str, str],
    replicated_pg: Replicated,
) -> RunningConsole:
    """The console reading the replica (COS_DATABASE_READ_URL), once the replica has console_db's data."""
    await replicated_pg.caught_up()
    common = Settings(nats_url=nats_url, database_url=console_db.dsn, database_read_url=replica_database[1])
    return await start_console(analyst_role=console_db.analyst_role, common=common)


async def test_the_chat_page_shows_its_own_turn_while_the_replica_lags(
    tab: Tab, console_db: Seeded, loop_service: LoopService, replicated_pg: Replicated
) -> None:
    await replicated_pg.pause()
    page = await open_chat(tab, "olivia")
    await page.get_by_label("Profile").select_option("acme")
    await page.get_by_label("Tags of a new session").fill("client:web-test")
    await page.get_by_label("Message").fill("weather in Charleston?")
    await page.get_by_role("button", name="Send").click()

    log = page.locator("#chat-log")
    await expect(log.locator(".message.user .text")).to_have_text("weather in Charleston?")
    await expect(log.locator("details.chat-tool summary")).to_contain_text("list_dir")
    await expect(log.locator(".message.assistant .text")).to_have_text(REPLY)
    await expect(log.locator(".chat-done .status")).to_have_text("completed")
    await expect(page.locator("#chat-state")).to_have_text("turn completed")
    session = await page.locator("#chat-session").input_value()
    assert re.fullmatch(r"[0-9a-f-]{36}", session), session
    await shoot(page, "chat-replica-paused")

    # The replica does not have the session yet: the list (read from it) does not show it ...
    await page.goto("/sessions")
    await expect(page.get_by_role("heading", name="Sessions", level=1)).to_be_visible()
    assert await page.locator(f'a[href="/sessions/{session}"]').count() == 0
    # ... and its page opens all the same, from the primary.
    await page.goto(f"/sessions/{session}")
    await expect(page.locator("main")).to_contain_text("weather in Charleston?")
    await expect(page.locator("main")).to_contain_text(REPLY)

    # The chat page opened again on it (a new socket) shows the conversation and continues it: both read the
    # primary.
    await page.goto(f"/chat?session={session}&profile=acme")
    await expect(page.locator("#chat-state")).to_have_text("connected")
    await expect(log.locator(".message.assistant .text")).to_have_text(REPLY)
    await page.get_by_label("Message").fill("and now?")
    await page.get_by_role("button", name="Send").click()
    await expect(log.locator(".message.user .text")).to_have_text(["weather in Charleston?", "and now?"])
    await expect(log.locator(".chat-done .status")).to_have_text("completed")
    await expect(log.locator(".chat-error")).to_have_count(0)
    assert await page.locator("#chat-session").input_value() == session

    assert (await replicated_pg.on_standby("SELECT pg_get_wal_replay_pause_state()")) == "paused"
    tab.assert_clean()
