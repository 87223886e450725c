"""Chat and Approvals in headless Chromium, against the loop service of profile acme (scripted provider, reply
deltas on core NATS) and the journal-writer: a message sent from the Chat page starts a web session whose reply
and tool call appear as the turn runs; a risky call waits while an approver, in another browser, approves it
with one click on the Approvals page, and the waiting turn goes on; or it is approved or denied in the chat
itself, and its badge says so. The page offers only profiles a loop serves, keeps its conversation through a
reload and Back, and its socket's URL carries no token."""

from __future__ import annotations

import re
import uuid

from playwright.async_api import Browser, Page, expect

from commonos.loop.service import LoopService
from tests.console.browser.conftest import Tab, open_tab, shoot
from tests.console.chat_support import fetch_value, globex_loop, loop_service
from tests.console.conftest import Seeded

__all__ = ["globex_loop", "loop_service"]

REPLY = "Bring an umbrella: 18°C and light rain."

#: Records, in order, what the chat page adds to its log (each node's class) and every text the assistant's reply
#: shows while it grows: the reply is built from the turn's deltas alone (the final message carries no text).
RECORD = """() => {
  window.__chatAdded = [];
  window.__chatReply = [];
  const log = document.getElementById("chat-log");
  new MutationObserver((records) => {
    for (const r of records) {
      for (const node of r.addedNodes) {
        if (node.nodeType === 1 && node.parentNode === log) { window.__chatAdded.push(node.className); }
      }
    }
    for (const text of log.querySelectorAll(".message.assistant .text")) {
      const last = window.__chatReply[window.__chatReply.length - 1];
      if (text.textContent !== last) { window.__chatReply.push(text.textContent); }
    }
  }).observe(log, { childList: true, subtree: true, characterData: true });
}"""


async def open_chat(tab: Tab, name: str) -> Page:
    await tab.sign_in(name, start="/chat")
    page = tab.page
    await expect(page.get_by_role("heading", name="Chat", level=1)).to_be_visible()
    await expect(page.locator("#chat-state")).to_have_text("connected")
    await page.evaluate(RECORD)
    return page


async def test_chat_from_the_page_streams_the_reply_and_the_tool_call(
    tab: Tab, console_db: Seeded, loop_service: LoopService
) -> None:
    page = await open_chat(tab, "olivia")
    await page.get_by_label("Profile").select_option("acme")
    await page.get_by_label("Tags of a new session").fill("client:web-test")
    await page.get_by_label("Message").fill("weather in Charleston?")
    await page.get_by_role("button", name="Send").click()

    log = page.locator("#chat-log")
    await expect(log.locator(".message.user .text")).to_have_text("weather in Charleston?")
    tool = log.locator("details.chat-tool")
    await expect(tool.locator("summary")).to_contain_text("list_dir")
    await expect(tool.locator("summary")).to_contain_text("risk")
    await expect(log.locator(".message.assistant .text")).to_have_text(REPLY)
    await expect(log.locator(".chat-done .status")).to_have_text("completed")
    await expect(page.locator("#chat-state")).to_have_text("turn completed")
    await tool.locator("summary").click()
    await expect(tool.locator("pre").first).to_contain_text('"path": "."')

    # The tool call was announced (its delta) and shown before the reply; the reply grew only by deltas.
    added: list[str] = await page.evaluate("window.__chatAdded")
    assert added[0] == "message user", added
    order = [c for c in added if c in {"toolcall muted", "toolcall chat-tool", "message assistant", "chat-done"}]
    assert order == ["toolcall muted", "toolcall chat-tool", "message assistant", "chat-done"], added
    await expect(log.locator(".toolcall.muted")).to_have_text("calling list_dir…")
    texts: list[str] = await page.evaluate("window.__chatReply")
    assert texts and texts[-1] == REPLY and all(REPLY.startswith(t) for t in texts), texts
    await shoot(page, "chat")

    # A web session with its tag, one click away.
    session_id = (await page.locator("#chat-session").input_value()).strip()
    assert uuid.UUID(session_id)
    assert (
        await fetch_value(console_db.dsn, "SELECT source FROM sessions WHERE id = $1", uuid.UUID(session_id)) == "web"
    )
    await page.locator("#chat-session-link").click()
    await expect(page).to_have_url(re.compile(f"/sessions/{session_id}$"))
    await expect(page.locator("dl.facts")).to_contain_text("client:web-test")
    await expect(page.locator(".message.assistant .text")).to_have_text(REPLY)
    tab.assert_clean()


async def test_approve_a_risky_call_from_the_approvals_page_while_the_turn_waits(
    tab: Tab, browser: Browser, console_db: Seeded, loop_service: LoopService
) -> None:
    async with open_tab(browser, tab.console) as approver:
        # The approver's page is open before the call waits: the row arrives live.
        await approver.sign_in("abel", start="/approvals")
        decide = approver.page
        await expect(decide.get_by_role("heading", name="Approvals", level=1)).to_be_visible()
        await expect(decide.locator("#no-approvals")).to_be_visible()

        page = await open_chat(tab, "olivia")
        await page.get_by_label("Profile").select_option("acme")
        await page.get_by_label("Message").fill("wait for it")
        await page.get_by_role("button", name="Send").click()
        waiting = page.locator("#chat-log .chat-approval")
        await expect(waiting).to_contain_text("shell")
        await expect(waiting).to_contain_text("waiting for approval")
        await expect(waiting.locator("pre")).to_contain_text("echo waited")
        await expect(page.locator("#chat-send")).to_be_disabled()

        row = decide.locator("table.approvals tbody tr")
        await expect(row).to_have_count(1)
        await expect(row).to_contain_text("shell")
        await expect(row).to_contain_text("echo waited")
        await expect(row).to_contain_text("acme")
        await shoot(decide, "approvals")
        await shoot(page, "chat-waiting")
        # Still waiting: no tool ran, the turn has not finished.
        assert await page.locator("#chat-log details.chat-tool").count() == 0
        assert await page.locator("#chat-log .chat-done").count() == 0

        async with decide.expect_response(lambda r: r.url.endswith("/approve")) as decided:
            await row.get_by_role("button", name="Approve").click()
        answer = await decided.value
        assert answer.status == 200 and "as web:abel" in await answer.text()
        # The list empties (the answer's fragment, or the live refresh that follows the loop's decision).
        await expect(decide.locator("#no-approvals")).to_be_visible()

        log = page.locator("#chat-log")
        await expect(log).to_contain_text("approved by web:abel")
        # The badge no longer says it waits: it says who decided, and the buttons are gone.
        await expect(waiting.locator(".status")).to_have_text("approved by web:abel")
        await expect(waiting.locator(".status")).to_have_class("status approved")
        await expect(log).not_to_contain_text("waiting for approval")
        await expect(waiting.get_by_role("button")).to_have_count(0)
        tool = log.locator("details.chat-tool")
        await expect(tool.locator("summary")).to_contain_text("shell")
        await expect(tool.locator(".status.approved")).to_have_text("approved")
        await expect(tool.locator("pre").nth(1)).to_contain_text("waited")
        await expect(log.locator(".chat-done .status")).to_have_text("completed")
        await expect(log.locator(".message.assistant .text").last).to_have_text("waited")
        await shoot(page, "chat-approved")
        decided_by = await fetch_value(console_db.dsn, "SELECT decided_by FROM approvals WHERE status = 'approved'")
        assert decided_by == "web:abel"
        approver.assert_clean()
    tab.assert_clean()


async def test_the_chat_starts_on_a_profile_a_loop_serves_and_its_socket_url_has_no_token(
    tab: Tab, console_db: Seeded, globex_loop: LoopService
) -> None:
    """acme is first on the list but no loop serves it (as an imported profile, claude-code, has none): the page
    starts on globex, and the first "hello" is answered, not "unavailable"."""
    sockets: list[str] = []
    tab.page.on("websocket", lambda ws: sockets.append(ws.url))
    page = await open_chat(tab, "olivia")
    profile = page.get_by_label("Profile")
    await expect(profile).to_have_value("globex")
    acme = profile.locator("option", has_text="acme")
    await expect(acme).to_have_text("acme (no loop serves it)")
    await expect(acme).to_be_disabled()
    await page.get_by_label("Message").fill("hello")
    await page.get_by_role("button", name="Send").click()
    log = page.locator("#chat-log")
    await expect(log.locator(".chat-done .status")).to_have_text("completed")
    await expect(log.locator(".message.assistant .text")).to_have_text("hello")
    await expect(log).not_to_contain_text("unavailable")

    token = await page.locator("#chat-form").get_attribute("data-csrf")
    assert token and len(sockets) == 1, sockets
    assert "csrf" not in sockets[0] and token not in sockets[0] and sockets[0].endswith("/api/chat/ws"), sockets
    tab.assert_clean()


async def test_approve_and_deny_in_the_chat_itself(tab: Tab, console_db: Seeded, loop_service: LoopService) -> None:
    page = await open_chat(tab, "olivia")
    await page.get_by_label("Profile").select_option("acme")
    log = page.locator("#chat-log")
    for decision, shown in (("Approve", "approved"), ("Deny", "denied")):
        await page.get_by_role("button", name="New session").click()
        await page.get_by_label("Message").fill("wait for it")
        await page.get_by_role("button", name="Send").click()
        waiting = log.locator(".chat-approval")
        await expect(waiting.locator(".status")).to_contain_text("waiting for approval until")
        await expect(waiting.locator("pre")).to_contain_text("echo waited")
        if decision == "Approve":
            await shoot(page, "chat-decide-here")
        async with page.expect_response(lambda r: "/api/approvals/" in r.url) as answered:
            await waiting.get_by_role("button", name=decision).click()
        answer = await answered.value
        assert answer.status == 200, await answer.text()
        await expect(waiting.locator(".status")).to_have_text(f"{shown} by web:olivia")
        await expect(waiting.locator(".status")).to_have_class(f"status {shown}")
        await expect(waiting.get_by_role("button")).to_have_count(0)
        await expect(log).not_to_contain_text("waiting for approval")
        tool = log.locator("details.chat-tool")
        await expect(tool.locator(f".status.{shown}")).to_have_text(shown)
        await expect(log.locator(".chat-done .status")).to_have_text("completed")
        session = uuid.UUID((await page.locator("#chat-session").input_value()).strip())
        sql = (
            "SELECT a.status || ' ' || a.decided_by FROM approvals a JOIN turns t ON t.id = a.turn_id "
            "WHERE t.session_id = $1"
        )
        assert await fetch_value(console_db.dsn, sql, session) == f"{shown} web:olivia"
    tab.assert_clean()


async def test_the_conversation_survives_a_reload_and_back(
    tab: Tab, console_db: Seeded, loop_service: LoopService
) -> None:
    page = await open_chat(tab, "olivia")
    await page.get_by_label("Profile").select_option("acme")
    await page.get_by_label("Message").fill("weather in Charleston?")
    await page.get_by_role("button", name="Send").click()
    log = page.locator("#chat-log")
    await expect(log.locator(".chat-done .status")).to_have_text("completed")
    session = (await page.locator("#chat-session").input_value()).strip()
    await expect(page).to_have_url(re.compile(rf"/chat\?session={session}$"))
    sid = uuid.UUID(session)
    await fetch_value(console_db.dsn, "SELECT 1 FROM turns WHERE session_id = $1 AND status = 'completed'", sid)

    async def conversation_shown() -> None:
        await expect(page.locator("#chat-state")).to_have_text("connected")
        await expect(page.locator("#chat-session")).to_have_value(session)
        await expect(log.locator(".message.user .text")).to_have_text("weather in Charleston?")
        await expect(log.locator("details.chat-tool summary")).to_contain_text("list_dir")
        await expect(log.locator(".message.assistant .text")).to_have_text(REPLY)

    await page.reload()
    await conversation_shown()
    # Away to the Approvals page in the same tab, and Back.
    await page.locator("header nav").get_by_role("link", name="Approvals").click()
    await expect(page.get_by_role("heading", name="Approvals", level=1)).to_be_visible()
    await page.go_back()
    await expect(page).to_have_url(re.compile(rf"/chat\?session={session}$"))
    await conversation_shown()
    # And it goes on in the same session.
    await page.get_by_label("Message").fill("and now?")
    await page.get_by_role("button", name="Send").click()
    await expect(log.locator(".chat-done .status")).to_have_text("completed")
    await expect(page.locator("#chat-session")).to_have_value(session)
    await expect(log.locator(".message.user .text")).to_have_text(["weather in Charleston?", "and now?"])

    # A call waiting for approval is still there after a reload, and decided there.
    await page.get_by_role("button", name="New session").click()
    await expect(page).to_have_url(re.compile(r"/chat$"))
    await page.get_by_label("Message").fill("wait for it")
    await page.get_by_role("button", name="Send").click()
    await expect(log.locator(".chat-approval .status")).to_contain_text("waiting for approval")
    waiting_session = uuid.UUID((await page.locator("#chat-session").input_value()).strip())
    await fetch_value(console_db.dsn, "SELECT 1 FROM messages WHERE session_id = $1 AND seq = 2", waiting_session)
    await page.reload()
    await expect(page.locator("#chat-session")).to_have_value(str(waiting_session))
    await expect(log.locator(".message.user .text")).to_have_text("wait for it")
    await expect(log.locator(".chat-running")).to_contain_text("still running")
    waiting = log.locator(".chat-approval")
    await expect(waiting.locator(".status")).to_contain_text("waiting for approval")
    await expect(page.locator("#chat-state")).to_contain_text("following turn")
    await waiting.get_by_role("button", name="Approve").click()
    await expect(waiting.locator(".status")).to_have_text("approved by web:olivia")
    # The page follows the turn it was shown again during: the call runs, the reply comes, the turn ends.
    await expect(log.locator("details.chat-tool summary")).to_contain_text("shell")
    await expect(log.locator(".message.assistant .text").last).to_have_text("waited")
    await expect(log.locator(".chat-done .status")).to_have_text("completed")
    await expect(log.locator(".chat-running")).to_have_count(0)
    await expect(page.locator("#chat-send")).to_be_enabled()
    sql = "SELECT status FROM turns WHERE session_id = $1 AND status <> 'running'"
    assert await fetch_value(console_db.dsn, sql, waiting_session) == "completed"
    await page.reload()
    await expect(log.locator(".message.assistant .text").last).to_have_text("waited")
    await expect(log.locator("details.chat-tool .status.approved")).to_have_text("approved")
    await expect(log.locator(".chat-approval")).to_have_count(0)
    tab.assert_clean()
