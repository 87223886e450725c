"""Content as a person reads it, in headless Chromium on data published through the real journal-writer: a
message's Markdown rendered while its markup (`<img onerror>`) and a `javascript:` link run nothing, JSON
arguments that fold, a long result folded; a real Claude Code transcript (../shared/corpus) whose slash command is
a chip, not raw tags, whose page stays a readable height, its outcome labelled; and the Operations page saying
which number is a projection's lag and which is not."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from playwright.async_api import expect

from commonos.importer.claude import read_claude_file
from commonos.importer.events import events_for
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from tests.console.browser.conftest import Tab, shoot
from tests.console.browser.test_browser_sessions import INSTRUMENT
from tests.console.conftest import Seeded, project
from tests.console.test_imported import imports
from tests.factories import Clock, SessionBuilder
from tests.importer.transcripts import CORPUS, needs_corpus

__all__ = ["imports"]  # a fixture of tests/console, used here

#: Markup and a script link inside Markdown: the image's handler and the link would each set the sentinel.
HOSTILE_MARKDOWN = (
    'Compare **both** plans: <img src=x onerror="window.__cosPwned = 1; alert(1)"> '
    "and [open the report](javascript:window.__cosPwned=2;alert(2)) or [the docs](https://example.com/docs)."
)
REPLY = "## Findings\n\n| plan | cost |\n|:--|--:|\n| A | $3 |\n| B | $5 |\n\n- plan **A** is cheaper\n- `B` is faster"
BIG_ARGS: dict[str, object] = {
    "query": "orders by day",
    "rows": [{"day": f"2026-11-{d:02}", "orders": d * 7} for d in range(1, 21)],
}
LONG_RESULT = "\n".join(f"row {n}: {n * 7} orders" for n in range(1, 61))


def content_session(clock: Clock) -> SessionBuilder:
    s = SessionBuilder("acme", clock, ("client:acme",)).create(source="web", title="Plans compared")
    turn = s.start_turn()
    s.message(turn, UserMessage(text=HOSTILE_MARKDOWN))
    s.message(turn, AssistantMessage(tool_calls=(ToolCall(id="q1", name="sql_query", args=BIG_ARGS),)))
    s.tool_call(turn, "q1", "sql_query", BIG_ARGS, LONG_RESULT)
    s.message(turn, ToolResultMessage(call_id="q1", content=LONG_RESULT))
    s.message(turn, AssistantMessage(text=REPLY))
    s.finish(turn)
    return s


async def test_markdown_is_rendered_and_its_markup_runs_nothing(tab: Tab, console_db: Seeded, nats_url: str) -> None:
    clock = Clock()
    clock.tick(3_600_000)
    session = content_session(clock)
    await project(nats_url, console_db.dsn, session.events)
    page = tab.page
    await page.add_init_script(INSTRUMENT)
    await tab.sign_in("olivia")
    await page.goto(f"/sessions/{session.session_id}")
    user = page.locator(".message.user .text").first
    # The markup is shown as the text it is; the Markdown around it is rendered.
    await expect(user).to_contain_text('<img src=x onerror="window.__cosPwned = 1; alert(1)">')
    await expect(user.locator("strong")).to_have_text("both")
    await expect(user).to_contain_text("[open the report](javascript:")
    assert await page.locator("main img, main script, main [onerror]").count() == 0
    assert await page.locator('main a[href*="javascript" i]').count() == 0
    await expect(page.get_by_role("link", name="open the report")).to_have_count(0)
    docs = page.get_by_role("link", name="the docs")
    await expect(docs).to_have_attribute("href", "https://example.com/docs")
    await expect(docs).to_have_attribute("rel", "noopener noreferrer nofollow")
    # Clicking where the link would have been runs nothing either.
    await user.get_by_text("open the report").click()

    reply = page.locator(".message.assistant .text", has_text="Findings")
    await expect(reply.get_by_role("heading", name="Findings")).to_be_visible()
    await expect(reply.locator("table td")).to_have_count(4)
    await expect(reply.locator("li strong")).to_have_text("A")
    await expect(page.get_by_role("heading", level=1)).to_have_count(1)

    # The arguments: a tree whose long array starts folded and opens on a click.
    call = page.locator("details.toolcall", has_text="sql_query")
    await call.locator("summary").first.click()
    rows = call.locator("details.json-node").nth(1)  # the object's, then its "rows" array's
    await expect(rows.locator("summary").first).to_contain_text('"rows"')
    await expect(rows).not_to_have_attribute("open", "")
    await expect(call.get_by_text('"2026-11-20"')).to_be_hidden()
    await rows.locator("summary").first.click()
    await expect(call.get_by_text('"2026-11-20"')).to_be_visible()
    # The result: its first line, the rest folded until asked for.
    folded = call.locator("details.fold")
    await expect(folded.locator("summary")).to_contain_text("row 1: 7 orders")
    await expect(folded.locator("summary")).to_contain_text("show all 60 lines")
    await expect(call.get_by_text("row 60: 420 orders")).to_be_hidden()
    await folded.locator("summary").click()
    await expect(call.get_by_text("row 60: 420 orders")).to_be_visible()
    await shoot(page, "session-content", full_page=True)

    assert await page.evaluate("window.__cosPwned") == 0
    tab.assert_clean()


#: A Claude Code session of the corpus that starts with a slash command (`/orchestrator ...`), with long replies.
COMMAND_SESSION = CORPUS / "claude" / "projects" / "sample-project" / "fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"
#: The corpus's Claude Code session with the most replies (88), many of them long Markdown: its page was the tallest.
LONGEST = CORPUS / "claude" / "projects" / "-Users-bholt-dev-evergreen" / "354b2588-2a5c-43d7-b678-e95a4a87bd2a.jsonl"
#: A page a person can scroll through: a long session's page stays within this height (1280 px wide).
MAX_PAGE_HEIGHT_PX = 20_000


async def import_transcript(path: Path, nats_url: str, dsn: str) -> uuid.UUID:
    imported = read_claude_file(path, profile="acme")[0]
    await project(nats_url, dsn, events_for(imported))
    root = imported.graph.root()
    assert root is not None
    return uuid.UUID(root.id)


@needs_corpus
async def test_a_real_claude_code_session_reads_well(tab: Tab, console_db: Seeded, nats_url: str) -> None:
    assert COMMAND_SESSION.is_file() and LONGEST.is_file()
    command = await import_transcript(COMMAND_SESSION, nats_url, console_db.dsn)
    longest = await import_transcript(LONGEST, nats_url, console_db.dsn)
    page = tab.page
    await page.add_init_script(INSTRUMENT)
    await tab.sign_in("olivia")

    await page.goto(f"/imported/{command}")
    text = await page.locator("main").inner_text()
    assert "<command-" not in text and "</command-" not in text
    chip = page.locator(".command-chip").first
    await expect(chip).to_contain_text("/orchestrator")
    await expect(chip).to_contain_text("create TODO app by Next.js")
    await expect(chip).to_have_attribute("title", re.compile("orchestrator is running"))
    # The outcome says it is the outcome, and what its value means.
    outcome = page.locator("#outcome .status")
    await expect(outcome).to_have_text(re.compile(r"^outcome: \w+$"))
    await expect(outcome).to_have_attribute("title", re.compile(".{20,}"))
    if (await outcome.inner_text()) == "outcome: unknown":
        await expect(page.locator("#outcome")).to_contain_text("the transcript does not say how the session ended")
    # Replies are Markdown, rendered: no raw ** or ## left where the model used them.
    replies = page.locator(".message.assistant .text")
    assert await replies.count() > 0
    assert await page.locator(".message.assistant :is(strong, h4, h5, h6, code, li)").count() > 0
    for reply in (await replies.all())[:20]:
        assert not re.search(r"^#{1,6} |\*\*\w", await reply.inner_text(), re.MULTILINE), await reply.inner_text()
    await shoot(page, "imported-command", full_page=True)

    for session in (command, longest):
        await page.goto(f"/imported/{session}")
        height = await page.evaluate("document.documentElement.scrollHeight")
        assert height <= MAX_PAGE_HEIGHT_PX, (session, height)
    await shoot(page, "imported-longest", full_page=True)
    assert await page.evaluate("window.__cosPwned") == 0
    tab.assert_clean()


async def test_operations_says_which_number_is_lag(tab: Tab, imports: dict[str, uuid.UUID]) -> None:
    """The graph's position is followed by model calls it never reads: many later events, nothing to apply."""
    page = tab.page
    await tab.sign_in("olivia")
    await page.goto("/operations")
    table = page.locator("table.positions")
    headers = table.locator("thead th")
    await expect(headers.nth(3)).to_have_text("Still to apply (lag)")
    await expect(headers.nth(4)).to_have_text("Later events, any kind")
    await expect(headers.nth(4)).to_have_attribute("title", re.compile("every kind"))
    graph = table.locator("tbody tr", has=page.locator("td", has_text="graph.positions"))
    await expect(graph.locator("td.pending")).to_have_text("0 (caught up)")
    assert int((await graph.locator("td.later").inner_text()).replace(",", "")) >= 2
    await expect(page.locator(".positions-help")).to_contain_text("is not lag")
    ops = await (await page.request.get("/api/operations")).json()
    [position] = [p for p in ops["positions"] if p["table"] == "graph.positions"]
    assert position["pending"] == 0 and position["behind"] >= 2
    tab.assert_clean()
