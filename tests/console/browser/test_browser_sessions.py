"""Signing in, the Sessions page and a session's page in headless Chromium, on data published through the real
journal-writer and billing: a wrong password refused, search highlighting a message, attacker-controlled text
(a `<script>` message, markup in a tool's result, in a title and in live events) shown as text with nothing run,
and an analyst refused another profile's session by URL and by API while seeing its own."""

from __future__ import annotations

import os
import re
import shutil
import uuid

from playwright.async_api import expect

from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from tests.console.browser.conftest import Tab, shoot
from tests.console.conftest import HOSTILE_RESULT, LOOK, SCRIPT, Seeded, project
from tests.factories import Clock, SessionBuilder
from tests.support import publish_all

#: Set on every page before its own scripts: wraps EventSource so that a test knows when a live stream follows
#: its session (the server's `ready` event comes once its NATS subscription is made), and the sentinel that any
#: script smuggled in through content would have to change.
INSTRUMENT = """
window.__cosPwned = 0;
window.__cosLiveReady = 0;
const Native = window.EventSource;
window.EventSource = function (url, init) {
  const source = new Native(url, init);
  source.addEventListener("ready", () => { window.__cosLiveReady += 1; });
  return source;
};
window.EventSource.prototype = Native.prototype;
"""

LIVE_SCRIPT = "<script>window.__cosPwned = 1; alert('live')</script> a live <b>question</b>"
LIVE_RESULT = '<img src=x onerror="window.__cosPwned = 2"> live result'


async def test_sign_in_and_a_wrong_password(tab: Tab) -> None:
    page = tab.page
    await page.goto("/sessions")
    await expect(page).to_have_url(re.compile(r"/login\?next=%2Fsessions$"))
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await shoot(page, "login")

    await page.get_by_label("Name").fill("olivia")
    await page.get_by_label("Password").fill("not-her-password")
    async with page.expect_response(lambda r: r.url.endswith("/login") and r.request.method == "POST") as refused:
        await page.get_by_role("button", name="Sign in").click()
    assert (await refused.value).status == 401
    await expect(page.get_by_role("alert")).to_have_text("Wrong name or password.")
    await expect(page.get_by_label("Name")).to_have_value("olivia")
    await shoot(page, "login-refused")
    assert (await page.request.get("/api/me")).status == 401

    # The right password: back to the page first asked for, signed in.
    await page.get_by_label("Password").fill("operator-password")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page).to_have_url(re.compile(r"/sessions$"))
    await expect(page.locator("header .who")).to_contain_text("olivia")
    await expect(page.locator("header .role")).to_have_text("operator")
    await expect(page.locator("table.sessions tbody tr")).to_have_count(3)
    me = await page.request.get("/api/me")
    assert me.status == 200 and (await me.json())["name"] == "olivia"
    cookies = await page.context.cookies()
    assert cookies and all(c["httpOnly"] and c["sameSite"] == "Lax" for c in cookies)
    await shoot(page, "sessions")

    # Signing out ends it.
    await page.get_by_role("button", name="Sign out").click()
    await expect(page).to_have_url(re.compile(r"/login$"))
    assert (await page.request.get("/api/me")).status == 401


async def test_search_finds_a_message_and_highlights_it(
    tab: Tab, hostile: tuple[SessionBuilder, SessionBuilder]
) -> None:
    _, child = hostile
    page = tab.page
    await tab.sign_in("olivia")
    await expect(page.locator("table.sessions tbody tr")).to_have_count(5)
    await page.get_by_label("Search messages").fill("xylophone")
    await page.get_by_label("Search messages").press("Enter")
    # htmx swaps the results in place and pushes the query into the address bar.
    await expect(page).to_have_url(re.compile(r"[?&]q=xylophone"))
    rows = page.locator("table.sessions tbody tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0).get_by_role("link")).to_have_attribute("href", f"/sessions/{child.session_id}")
    await expect(rows.nth(1).get_by_role("link")).to_have_text("Hostile <b>title</b>")
    marks = page.locator(".snippet mark")
    await expect(marks).to_have_count(2)
    for mark in await marks.all():
        await expect(mark).to_have_text(re.compile("^xylophone$", re.IGNORECASE))
        assert await mark.evaluate("m => getComputedStyle(m).backgroundColor") != "rgba(0, 0, 0, 0)"
    # The child's snippet is the message's text with its < and & as characters.
    await expect(rows.nth(0).locator(".snippet")).to_contain_text("1 < 2 & xylophone")

    await page.get_by_label("Search messages").fill("nonexistentword")
    await page.get_by_label("Search messages").press("Enter")
    await expect(page.locator("#results")).to_contain_text("No sessions with a message matching “nonexistentword”")
    await expect(page.locator("table.sessions")).to_have_count(0)
    # Back in history: the previous results again (htmx restores them).
    await page.go_back()
    await expect(page).to_have_url(re.compile(r"q=xylophone"))
    await expect(page.locator(".snippet mark")).to_have_count(2)
    # Last: a screenshot's own styles would be in what htmx keeps for history.
    await shoot(page, "sessions-search")
    tab.assert_clean()


async def test_a_script_in_a_message_renders_as_text(
    tab: Tab, hostile: tuple[SessionBuilder, SessionBuilder], nats_url: str
) -> None:
    parent, _ = hostile
    page = tab.page
    await page.add_init_script(INSTRUMENT)
    await tab.sign_in("olivia")
    await page.goto(f"/sessions/{parent.session_id}")
    await expect(page.get_by_role("heading", level=1)).to_contain_text("Hostile <b>title</b>")
    # The user's message is the very text typed, script tag and all.
    await expect(page.locator(".message.user .text").first).to_have_text(SCRIPT)
    await expect(page.get_by_text(LOOK)).to_be_visible()
    # The delegated child's risky tool call: its result is text, no <img> was made of it.
    await page.locator("details.toolcall", has_text="shell").locator("summary").click()
    await expect(page.locator("details.toolcall pre", has_text="xylophone result")).to_have_text(HOSTILE_RESULT)
    await expect(page.locator("details.toolcall", has_text="shell")).to_contain_text("approved by cli:tester")
    assert await page.locator("main img, main b, main script").count() == 0
    await page.wait_for_function("window.__cosLiveReady > 0")
    await shoot(page, "session", full_page=True)

    # The same text arriving live (the server's fragments put in the page by static/session.js) is text too.
    parent.events.clear()
    turn = parent.start_turn()
    parent.message(turn, UserMessage(text=LIVE_SCRIPT))
    parent.tool_call(turn, "x1", "fetch_url", {"url": "<script>"}, LIVE_RESULT, risk=ev.Risk.HIGH)
    parent.message(turn, ToolResultMessage(call_id="x1", content=LIVE_RESULT))
    await publish_all(nats_url, parent.events)
    log = page.locator(f"#turn-{turn}")
    await expect(log.locator(".message.user .text")).to_have_text(LIVE_SCRIPT)
    await expect(log.locator("details.toolcall")).to_contain_text("fetch_url")
    await expect(log.locator("details.toolcall pre").nth(1)).to_have_text(LIVE_RESULT)
    await expect(page.locator(f"#tl-{turn} [data-key='tool:x1']")).to_contain_text("fetch_url")
    await expect(page.locator("#session-status")).to_have_text("running")
    assert await page.locator("main img, main b, main script").count() == 0
    await shoot(page, "session-live", full_page=True)

    assert await page.evaluate("window.__cosPwned") == 0
    tab.assert_clean()


async def test_tool_arguments_show_their_own_characters(
    tab: Tab, hostile: tuple[SessionBuilder, SessionBuilder]
) -> None:
    _, child = hostile
    page = tab.page
    await tab.sign_in("olivia")
    await page.goto(f"/sessions/{child.session_id}")
    shell = page.locator("details.toolcall", has_text="shell")
    await expect(shell.locator("summary")).to_contain_text("risk high")
    await expect(shell.locator("pre").first).to_contain_text('"cmd": "rm -rf <tmp>"', timeout=2_000)


async def test_an_analyst_sees_its_profiles_sessions_only(tab: Tab, console_db: Seeded) -> None:
    page = tab.page
    [globex] = console_db.sessions("globex")
    acme = console_db.sessions("acme")
    await tab.sign_in("alice")
    await expect(page.locator("header .role")).to_have_text("analyst")
    rows = page.locator("table.sessions tbody tr")
    await expect(rows).to_have_count(len(acme))
    for row in await rows.all():
        await expect(row.locator("td").nth(2)).to_have_text("acme")
    assert f"/sessions/{globex}" not in await page.content()
    await shoot(page, "sessions-analyst")

    # Its own profile's session, whole.
    await page.locator(f'a[href="/sessions/{acme[0]}"]').click()
    await expect(page).to_have_url(re.compile(f"/sessions/{acme[0]}$"))
    await expect(page.locator("dl.facts")).to_contain_text("acme")
    assert (await page.request.get(f"/api/sessions/{acme[0]}")).status == 200

    # Another profile's: by URL and by API, as if it did not exist.
    response = await page.goto(f"/sessions/{globex}")
    assert response is not None and response.status == 404
    await expect(page.get_by_role("heading", level=1)).to_have_text("404 Not found")
    assert "globex" not in await page.content()
    await shoot(page, "session-not-found")
    api = await page.request.get(f"/api/sessions/{globex}")
    assert api.status == 404, await api.text()
    assert (await page.request.get(f"/api/sessions/{uuid.uuid4()}")).status == 404
    assert (await page.request.get(f"/api/sessions/{globex}/events")).status == 404
    listed = await (await page.request.get("/api/sessions?profile=globex")).json()
    assert listed["sessions"] == []


def report_session(clock: Clock) -> tuple[SessionBuilder, SessionBuilder]:
    """A session as a person would run one: a query tool, a delegated child with a risky call approved, model
    calls in both."""
    parent = SessionBuilder("acme", clock, ("client:acme", "project:reports")).create(
        source="web", title="Weekly orders report for Acme"
    )
    turn = parent.start_turn()
    parent.message(turn, UserMessage(text="Summarise last week's orders for Acme and flag anything unusual."))
    parent.model_call(turn, input_tokens=2400, output_tokens=180)
    query: dict[str, object] = {"sql": "SELECT day, count(*), sum(total) FROM orders WHERE week = 47 GROUP BY day"}
    parent.message(turn, AssistantMessage(tool_calls=(ToolCall(id="q1", name="sql_query", args=query),)))
    parent.tool_call(turn, "q1", "sql_query", query, "7 rows: 412 orders, $38,120 in total; Thursday 9 orders")
    parent.message(turn, ToolResultMessage(call_id="q1", content="7 rows: 412 orders, $38,120 in total"))
    goal: dict[str, object] = {"goal": "Find why Thursday had 9 orders"}
    parent.message(turn, AssistantMessage(tool_calls=(ToolCall(id="d1", name="delegate", args=goal),)))
    child = SessionBuilder("acme", clock, ("client:acme", "project:reports")).create(
        source="delegate", title="Thursday's orders", parent_session_id=parent.session_id
    )
    child_turn = child.start_turn(parent_turn_id=turn, depth=1)
    child.message(child_turn, UserMessage(text="Find why Thursday had 9 orders"))
    child.model_call(child_turn, input_tokens=900, output_tokens=120)
    logs: dict[str, object] = {"command": "grep -c 'checkout failed' /var/log/shop/2026-11-19.log"}
    child.message(child_turn, AssistantMessage(tool_calls=(ToolCall(id="s1", name="shell", args=logs),)))
    child.tool_call(child_turn, "s1", "shell", logs, "1873", risk=ev.Risk.HIGH, approval=ev.ApprovalStatus.APPROVED)
    child.message(child_turn, ToolResultMessage(call_id="s1", content="1873"))
    child.message(child_turn, AssistantMessage(text="Checkout failed 1,873 times on Thursday: the payment outage."))
    child.finish(child_turn)
    parent.tool_call(turn, "d1", "delegate", goal, "Checkout failed 1,873 times on Thursday")
    parent.message(turn, ToolResultMessage(call_id="d1", content="Checkout failed 1,873 times on Thursday"))
    parent.model_call(turn, input_tokens=3100, output_tokens=260)
    parent.message(
        turn,
        AssistantMessage(
            text="412 orders ($38,120), up 6% on the week before. Unusual: Thursday had 9 orders because "
            "checkout failed 1,873 times during the payment provider's outage."
        ),
    )
    parent.finish(turn)
    return parent, child


async def test_a_session_one_click_from_the_list(tab: Tab, console_db: Seeded, nats_url: str) -> None:
    """From the list to a session: the conversation, the tool calls with their arguments and results, the
    delegated session inline with its approved risky call, the model calls with tokens and cost.

    Its screenshot is also the README's when COS_README_SCREENSHOT names where to write it."""
    clock = Clock()
    clock.tick(3_600_000)
    parent, child = report_session(clock)
    await project(nats_url, console_db.dsn, parent.events + child.events)
    page = tab.page
    await tab.sign_in("olivia")
    await page.get_by_role("link", name="Weekly orders report for Acme").click()
    await expect(page).to_have_url(re.compile(f"/sessions/{parent.session_id}$"))
    await expect(page.locator("dl.facts")).to_contain_text("project:reports")
    await expect(page.locator("dl.facts")).to_contain_text("3 · 6400 in / 560 out")
    query = page.locator("details.toolcall", has_text="sql_query")
    await query.locator("summary").click()
    await expect(query.locator("pre").first).to_contain_text("SELECT day, count(*)")
    await expect(query.locator("pre").nth(1)).to_contain_text("412 orders")
    child_block = page.locator(".child", has_text="Thursday's orders")
    await expect(child_block).to_be_visible()
    shell = child_block.locator("details.toolcall", has_text="shell")
    await expect(shell.locator("summary")).to_contain_text("risk high")
    await expect(shell.locator("summary")).to_contain_text("approved by cli:tester")
    calls = page.locator("details.modelcall").first
    await calls.locator("summary").click()
    await expect(calls.locator("tbody tr")).to_have_count(2)
    await expect(calls.locator("tbody tr").first).to_contain_text("anthropic/claude-sonnet-4-5")
    await expect(calls.locator("tbody tr").first).to_contain_text("priced")
    await page.evaluate("window.scrollTo(0, 0)")
    path = await shoot(page, "readme")
    await shoot(page, "session-tree", full_page=True)
    if target := os.environ.get("COS_README_SCREENSHOT"):
        shutil.copyfile(path, target)
    tab.assert_clean()
