"""A session's page while its turn runs, in headless Chromium, on real NATS and PostgreSQL with the real
journal-writer and billing storing what is published (and, for the last test, the real loop running the turn):

* the live events merge into the turn they belong to: the header's status and counts change when they change,
  each tool call is one element whose state changes (requested, waiting, approved, completed);
* the turn timeline gains each model call, tool call, approval wait and delegated child turn once, its bars
  laid out on the turn's axis (SVG attributes: the content security policy blocks nothing), and ends
  `completed` without a reload; reloaded, it shows the same spans with their costs;
* leaving a live page leaves no task of the console pending ("Task was destroyed but it is pending!")."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import msgspec
import nats
from playwright.async_api import Page, expect
from prometheus_client import REGISTRY

from commonos.loop.service import LoopService
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.proto.requests import ApprovalRequest, approval_request_subject
from tests.billing.support import billing
from tests.console.browser.conftest import Tab, shoot
from tests.console.chat_support import loop_service
from tests.console.conftest import PASSWORDS, RunningConsole, Seeded, journal_writer
from tests.factories import Clock, SessionBuilder
from tests.support import publish_all, wait_for_position, wait_until

__all__ = ["loop_service"]

#: Set before the page's own scripts: counts the live stream's `ready` events (the server follows the session).
COUNT_READY = """
window.__cosLiveReady = 0;
const Native = window.EventSource;
window.EventSource = function (url, init) {
  const source = new Native(url, init);
  source.addEventListener("ready", () => { window.__cosLiveReady += 1; });
  return source;
};
window.EventSource.prototype = Native.prototype;
"""


async def open_live(tab: Tab, session_id: uuid.UUID) -> Page:
    page = tab.page
    await page.add_init_script(COUNT_READY)
    await tab.sign_in("olivia")
    await page.goto(f"/sessions/{session_id}")
    await page.wait_for_function("() => window.__cosLiveReady > 0")
    return page


@contextlib.asynccontextmanager
async def projecting(nats_url: str, dsn: str) -> AsyncIterator[None]:
    """The journal-writer and billing storing what the test publishes, as under `cos up`."""
    async with journal_writer(nats_url, dsn), billing(nats_url, dsn):
        yield


class Turn:
    """A turn of an existing session published event by event, as the loop publishes them."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        #: The stream positions the journal-writer (every event) and billing (model calls) are to reach.
        self.last_seq = 0
        self.last_model_call_seq = 0

    async def send(self, *builders: SessionBuilder) -> None:
        events = [e for b in builders for e in b.events]
        for b in builders:
            b.events.clear()
        acks = await publish_all(self.nats_url, events)
        self.last_seq = acks[-1].seq
        for event, ack in zip(events, acks, strict=True):
            if isinstance(event, ev.ModelCallCompleted):
                self.last_model_call_seq = ack.seq


def existing(console_db: Seeded, profile: str = "acme") -> SessionBuilder:
    """A builder continuing the first sample session of `profile` (its messages' seq go on after the sample's)."""
    session_id = console_db.sessions(profile)[0]
    seq = max(e.seq for e in console_db.events if isinstance(e, ev.MessageAppended) and e.session_id == session_id)
    clock = Clock(datetime.now(UTC).replace(microsecond=0))
    return SessionBuilder(profile, clock, ("client:acme",), session_id=session_id, seq=seq)


async def counts(page: Page) -> dict[str, int]:
    """The timeline's spans of each kind, and the tool-call elements of the conversation, by key."""
    seen: dict[str, int] = await page.evaluate(
        """() => {
          const out = {};
          for (const el of document.querySelectorAll("#timeline-turns .span")) {
            out["span " + el.dataset.key] = (out["span " + el.dataset.key] || 0) + 1;
          }
          for (const el of document.querySelectorAll("#conversation [data-key^='call:']")) {
            out[el.dataset.key] = (out[el.dataset.key] || 0) + 1;
          }
          return out;
        }"""
    )
    return seen


async def bars(page: Page, turn_id: uuid.UUID) -> list[dict[str, Any]]:
    """Each span of the turn's timeline: its key, its bar's SVG geometry and where the browser drew it."""
    laid: list[dict[str, Any]] = await page.evaluate(
        """(turn) => Array.from(document.querySelectorAll(`#tl-${turn} .span`)).map((el) => {
          const bar = el.querySelector(".span-bar");
          const box = bar.getBoundingClientRect();
          const track = el.querySelector(".span-track").getBoundingClientRect();
          return {key: el.dataset.key, x: Number(bar.getAttribute("x")), width: Number(bar.getAttribute("width")),
                  left: box.left - track.left, drawn: box.width, track: track.width};
        })""",
        str(turn_id),
    )
    return laid


async def test_a_running_turn_merges_into_its_turn_and_the_header_follows(
    tab: Tab, console_db: Seeded, nats_url: str
) -> None:
    """The defect: events were appended under "Live" below the turn, the header kept `running` and its model
    calls after the turn completed, and a tool call showed three times (requested, recorded, result)."""
    s = existing(console_db)
    turn = Turn(nats_url)
    page = await open_live(tab, s.session_id)
    turns = page.locator("#conversation > article.turn")
    before = await turns.count()
    header = page.locator("dl.facts dt:text-is('Model calls') + dd")
    calls_before = int((await header.inner_text()).split("·")[0])
    async with projecting(nats_url, console_db.dsn):
        t = s.start_turn()
        s.message(t, UserMessage(text="Which files changed?"))
        await turn.send(s)
        await expect(turns).to_have_count(before + 1)
        article = page.locator(f"#turn-{t}")
        await expect(article.locator(".message.user .text")).to_have_text("Which files changed?")
        await expect(page.locator("#session-status")).to_have_text("running")
        await expect(article.locator(f"#turn-status-{t}")).to_have_text("running")

        s.clock.tick(700)
        s.model_call(t, input_tokens=1500, output_tokens=40)
        s.message(t, AssistantMessage(tool_calls=(ToolCall(id="g1", name="git_status", args={"path": "."}),)))
        await turn.send(s)
        await expect(header).to_contain_text(re.compile(rf"^{calls_before + 1} ·"))
        call = article.locator("[data-key='call:g1']")
        await expect(call).to_have_count(1)
        await expect(call).to_contain_text("requested")

        s.clock.tick(300)
        s.tool_call(t, "g1", "git_status", {"path": "."}, "M README.md")
        s.message(t, ToolResultMessage(call_id="g1", content="M README.md"))
        await turn.send(s)
        # One element for the call, now with its result; no second copy for the record or the result.
        await expect(call.locator("summary")).to_contain_text("git_status")
        await expect(call).to_have_count(1)
        await call.locator("summary").click()
        await expect(call.locator("pre").nth(1)).to_have_text("M README.md")
        await expect(article.locator(".message.tool")).to_have_count(0)
        await expect(article.locator("details.toolcall")).to_have_count(1)

        s.clock.tick(500)
        s.model_call(t, input_tokens=1600, output_tokens=25)
        s.message(t, AssistantMessage(text="README.md changed."))
        s.finish(t)
        await turn.send(s)
        await expect(page.locator("#session-status")).to_have_text("completed")
        await expect(page.locator(f"#turn-status-{t}")).to_have_text("completed")
        await expect(header).to_contain_text(re.compile(rf"^{calls_before + 2} ·"))
        await expect(article.locator(".message.assistant .text").last).to_have_text("README.md changed.")
        await expect(turns).to_have_count(before + 1)
        assert await page.locator(".live, #live-log").count() == 0
        await shoot(page, "session-live-merged", full_page=True)
        await wait_for_position(console_db.dsn, "journal-writer", turn.last_seq)

    # Reloaded, the page says the same.
    await page.reload()
    await expect(page.locator("#session-status")).to_have_text("completed")
    await expect(header).to_contain_text(re.compile(rf"^{calls_before + 2} ·"))
    await expect(page.locator(f"#turn-{t} [data-key='call:g1']")).to_have_count(1)
    tab.assert_clean()


async def test_the_timeline_grows_in_place_while_the_turn_runs(tab: Tab, console_db: Seeded, nats_url: str) -> None:
    s = existing(console_db)
    turn = Turn(nats_url)
    page = await open_live(tab, s.session_id)
    nc = await nats.connect(nats_url)
    try:
        async with projecting(nats_url, console_db.dsn):
            t = s.start_turn()
            s.message(t, UserMessage(text="Tidy the build folder, then ask a helper to check it."))
            await turn.send(s)
            section = page.locator(f"#tl-{t}")
            await expect(section).to_have_count(1)
            await expect(page.locator(f"#tl-status-{t}")).to_have_text("running")

            s.clock.tick(1200)
            s.model_call(t, input_tokens=2000, output_tokens=60)
            s.message(t, AssistantMessage(tool_calls=(ToolCall(id="r1", name="shell", args={"cmd": "rm -r build"}),)))
            await turn.send(s)
            await expect(section.locator(".span-model")).to_have_count(1)
            tool = section.locator("[data-key='tool:r1']")
            await expect(tool).to_have_count(1)
            await expect(tool.locator(".status")).to_have_text("requested")

            # The loop asks a person (core NATS, not stored): the wait shows at once, under its call.
            asked_at = datetime.now(UTC)
            request = ApprovalRequest(
                approval_id=uuid.uuid4(),
                profile_id="acme",
                session_id=s.session_id,
                turn_id=t,
                call_id="r1",
                tool="shell",
                args={"cmd": "rm -r build"},
                expires_at=asked_at + timedelta(minutes=2),
            )
            await nc.publish(approval_request_subject("acme"), msgspec.json.encode(request))
            wait = section.locator("[data-key='approval:r1']")
            await expect(wait).to_have_count(1)
            await expect(wait.locator(".status")).to_have_text("waiting")
            await expect(tool.locator(".status")).to_have_text("waiting")
            await expect(page.locator(f"#turn-{t} [data-key='call:r1']")).to_contain_text("waiting for approval")

            s.clock.tick(2500)
            s.tool_call(
                t, "r1", "shell", {"cmd": "rm -r build"}, "removed 14 files", approval=ev.ApprovalStatus.APPROVED
            )
            s.message(t, ToolResultMessage(call_id="r1", content="removed 14 files"))
            s.message(t, AssistantMessage(tool_calls=(ToolCall(id="d1", name="delegate", args={"goal": "check"}),)))
            await turn.send(s)
            await expect(wait.locator(".status")).to_have_text("approved")
            await expect(tool.locator(".status")).to_have_text("completed")

            # A delegated child turn: its own session, its parent turn this one.
            child = SessionBuilder("acme", s.clock, ("client:acme",)).create(
                source="delegate", title="Check the build folder", parent_session_id=s.session_id
            )
            ct = child.start_turn(parent_turn_id=t, depth=1)
            child.message(ct, UserMessage(text="check"))
            await turn.send(child)
            child_span = section.locator(f"[data-key='child:{ct}']")
            await expect(child_span).to_have_count(1)
            await expect(child_span.locator(".status")).to_have_text("running")
            s.clock.tick(900)
            child.model_call(ct, input_tokens=300, output_tokens=20)
            child.message(ct, AssistantMessage(text="It is empty."))
            child.finish(ct)
            s.tool_call(t, "d1", "delegate", {"goal": "check"}, "It is empty.")
            s.message(t, ToolResultMessage(call_id="d1", content="It is empty."))
            s.clock.tick(800)
            s.model_call(t, input_tokens=2400, output_tokens=30)
            s.message(t, AssistantMessage(text="Done: the build folder is empty."))
            await turn.send(child, s)
            await expect(child_span.locator(".status")).to_have_text("completed")
            await expect(section.locator(".span-model")).to_have_count(2)
            await expect(section.locator(".span-tool")).to_have_count(2)
            await expect(page.locator(f"#tl-status-{t}")).to_have_text("running")

            s.finish(t)
            await turn.send(s)
            await expect(page.locator(f"#tl-status-{t}")).to_have_text("completed")
            await expect(section.locator(".tl-models")).to_have_text("2")
            await expect(section.locator(".tl-tools")).to_have_text("2")
            await expect(section.locator(".tl-in")).to_have_text("4400")
            seen = await counts(page)
            mine = {k: v for k, v in seen.items() if k.startswith("span ") or k in ("call:r1", "call:d1")}
            # Each call once: no span, no conversation element twice.
            assert all(v == 1 for v in mine.values()), seen
            assert sum(1 for k in mine if k.startswith("span model:")) >= 2
            # The bars: on the axis, in the order things happened, drawn where their attributes say.
            laid = await bars(page, t)
            keys = [b["key"] for b in laid]
            assert keys.index("tool:r1") < keys.index("approval:r1") < keys.index(f"child:{ct}"), keys
            by_key = {b["key"]: b for b in laid}
            assert by_key["tool:r1"]["x"] < by_key[f"child:{ct}"]["x"], laid
            for b in laid:
                assert 0 <= b["x"] <= 1000 and b["width"] >= 4 and b["x"] + b["width"] <= 1000, b
                assert abs(b["left"] - b["x"] / 1000 * b["track"]) < 2, b
                assert b["drawn"] > 0, b
            await expect(section.locator(".span-model").first).to_contain_text("being priced")
            await section.locator("[data-key='tool:r1'] summary").click()
            await expect(section.locator("[data-key='tool:r1'] .span-detail")).to_contain_text("removed 14 files")
            await shoot(page, "session-timeline-live", full_page=True)
            await wait_for_position(console_db.dsn, "journal-writer", turn.last_seq)
            await wait_for_position(console_db.dsn, "billing", turn.last_model_call_seq, table="billing_positions")
    finally:
        await nc.close()

    # Reloaded from the tables: the same spans, now with their costs.
    await page.reload()
    section = page.locator(f"#tl-{t}")
    await expect(page.locator(f"#tl-status-{t}")).to_have_text("completed")
    await expect(section.locator(".span-model")).to_have_count(2)
    await expect(section.locator(".span-tool")).to_have_count(2)
    await expect(section.locator("[data-key='approval:r1']")).to_have_count(1)
    await expect(section.locator(f"[data-key='child:{ct}']")).to_have_count(1)
    await expect(section.locator(".span-model .span-cost").first).to_contain_text("$")
    await shoot(page, "session-timeline", full_page=True)
    tab.assert_clean()


async def test_the_timeline_of_a_turn_the_loop_runs(
    tab: Tab, console: RunningConsole, console_db: Seeded, loop_service: LoopService, nats_url: str
) -> None:
    """A real turn (the scripted loop: a risky shell call a person approves): the timeline gains its model calls,
    its tool call and the approval wait once each and ends `completed`, without a reload."""
    # A session whose first message plays the script's "wait" conversation, its first turn ended before any
    # answer: the next turn's first model call asks for the shell.
    s = SessionBuilder("acme", Clock(datetime.now(UTC)), ("client:acme",)).create(source="web")
    first = s.start_turn()
    s.message(first, UserMessage(text="wait for it"))
    s.finish(first, ev.TurnStatus.INTERRUPTED, "stopped before the model answered")
    acks = await publish_all(nats_url, s.events)
    await wait_for_position(console_db.dsn, "journal-writer", acks[-1].seq)
    session_id = s.session_id
    page = await open_live(tab, session_id)
    client = aiohttp.ClientSession(base_url=console.url, cookie_jar=aiohttp.CookieJar(unsafe=True))
    try:
        async with client.post("/api/login", json={"name": "olivia", "password": PASSWORDS["olivia"]}) as r:
            csrf = (await r.json())["csrf_token"]
        headers = {"X-CSRF-Token": csrf}

        async def send_chat() -> tuple[int, str]:
            body = {"text": "go on", "profile_id": "acme", "session_id": str(session_id)}
            async with client.post("/api/chat", json=body, headers=headers) as r:
                return r.status, await r.text()

        chat = asyncio.create_task(send_chat())
        # The new turn's timeline is the last: its call waits for a person.
        running = page.locator("#timeline-turns .turn-timeline").last
        await expect(running.locator("[data-key^='tool:'] .status")).to_have_text("waiting")
        await expect(running.locator("[data-key^='approval:'] .status")).to_have_text("waiting")
        await expect(running.locator(".span-model")).to_have_count(1)
        pending: list[dict[str, Any]] = []

        async def listed() -> bool:
            async with client.get("/api/approvals") as r:
                pending[:] = (await r.json())["approvals"]
            return bool(pending)

        for _ in range(100):
            if await listed():
                break
            await asyncio.sleep(0.1)
        assert pending, "the approval never waited"
        async with client.post(f"/api/approvals/{pending[0]['approval_id']}/approve", headers=headers) as r:
            assert r.status == 200, await r.text()
        status, text = await chat
        assert status == 200, text

        await expect(running.locator(".status").first).to_have_text("completed")
        await expect(running.locator(".span-model")).to_have_count(2)
        await expect(running.locator(".span-tool")).to_have_count(1)
        await expect(running.locator(".span-approval")).to_have_count(1)
        await expect(running.locator(".span-approval .status")).to_have_text("approved")
        await expect(running.locator(".span-tool .status")).to_have_text("completed")
        await expect(page.locator("#session-status")).to_have_text("completed")
        seen = await counts(page)
        assert all(v == 1 for k, v in seen.items() if k.startswith("span ")), seen
        await shoot(page, "session-timeline-loop", full_page=True)
    finally:
        await client.close()
    tab.assert_clean()


@contextlib.contextmanager
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    """What the event loop's exception handler is given meanwhile (a task destroyed while pending among them)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    seen: list[dict[str, Any]] = []

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        seen.append(context)
        lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
    try:
        yield seen
    finally:
        loop.set_exception_handler(previous)


def watchers() -> float:
    return REGISTRY.get_sample_value("cos_console_live_watchers") or 0.0


async def test_leaving_a_live_page_leaves_no_task_pending(tab: Tab, console_db: Seeded) -> None:
    """The defect: five "Task was destroyed but it is pending!" in the console's log when a browser left."""
    session_id = console_db.sessions("acme")[0]
    page = tab.page
    await page.add_init_script(COUNT_READY)
    await tab.sign_in("olivia")
    with loop_errors() as errors:
        for _ in range(3):
            before = watchers()

            def following(before: float = before) -> bool:
                return watchers() > before

            await page.goto(f"/sessions/{session_id}")
            await page.wait_for_function("() => window.__cosLiveReady > 0")
            await wait_until(following, what="the page following live")
            await page.goto("/sessions")
            await expect(page.locator("table.sessions")).to_be_visible()
            # The console has seen the browser leave: the stream ended.
            await wait_until(lambda: not following(), what="the stream ending")
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0.05)
    left = [c for c in errors if "task" in c or "future" in c]
    assert left == [], [c.get("message") for c in left]
