"""`make console-docs`: the screenshots of docs/console.md (docs/img/console-*.png), from a scripted demo.

One command, nothing to set up beyond `make setup`, nothing of yours touched:

1. its own nats-server and PostgreSQL in a temporary folder;
2. a scripted demo, projected by the real journal-writer and billing: loop sessions of three clients over the last
   days (tool calls, an approved risky call, a delegated child session, model calls of two models), and the Claude
   Code and Codex transcripts of tests/fixtures/clients imported by `cos import`;
3. the loop of profile acme on the scripted provider (a chat that answers; a call that waits for approval);
4. the console, and Debian's Chromium driven by Playwright (as the browser tests do), 1280x800, signed in as an
   operator: each page opened by its URL, its `main` awaited, a screenshot written as a palette PNG (Pillow).

Pages are reached by URL and awaited by their `main` element only, and what the script types (the chat) is done
when the page still offers it: re-run it after a page changes and commit the pictures. `--out DIR` writes them
elsewhere; `--keep` keeps the servers' folder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import io
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg
from nats.aio.client import Client
from PIL import Image
from playwright.async_api import Page, async_playwright

from commonos.billing.schema import SCHEMA as BILLING_SCHEMA
from commonos.console.settings import ConsoleSettings
from commonos.journal_writer.graph_schema import SCHEMA as GRAPH_SCHEMA
from commonos.journal_writer.memory import SCHEMA as MEMORY_SCHEMA
from commonos.journal_writer.schema import SCHEMA as CORE_SCHEMA
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.runtime.embedded import NatsServer, PostgresCluster, free_port
from commonos.runtime.postgres import apply_schemas, connect
from commonos.runtime.settings import Settings
from tests.billing.support import billing
from tests.console.browser.conftest import VIEWPORT, chromium_path
from tests.console.conftest import PASSWORDS, RunningConsole, journal_writer, project, run_console, users_toml
from tests.factories import Clock, SessionBuilder
from tests.harness import cleanup, make_temp_root
from tests.loop.helpers import write_profile

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "img"
FIXTURES = REPO / "tests" / "fixtures" / "clients"
#: The transcripts imported: (vendor, folder under tests/fixtures/clients).
IMPORTS = (
    ("claude", "claude-code-2.1.332/subagent/claude"),
    ("claude", "claude-code-2.1.332/tools/claude"),
    ("claude", "claude-code-2.1.332/turns/claude"),
    ("codex", "codex-0.171.0/tools/codex"),
)
#: How long a page may take to show its main content, and the time given to what it loads after (htmx, SSE).
PAGE_TIMEOUT_MS = 20_000
SETTLE_MS = 600

CHAT_QUESTION = "What is the weather in Charleston: do I need an umbrella?"

LOOP_SCRIPT = """
[[conversations]]
match = "umbrella"

[[conversations.steps]]
text = "Let me look at the forecast."
tool_calls = [{ name = "list_dir", args = { path = "." } }]
usage = { input_tokens = 1840, output_tokens = 42 }

[[conversations.steps]]
text = "Yes: bring an umbrella. Light rain from 2 pm, 18 °C, clearing after 6."
usage = { input_tokens = 1990, output_tokens = 31 }

[[conversations]]
match = "deploy"

[[conversations.steps]]
text = "Deploying the site needs a shell command."
tool_calls = [{ name = "shell", args = { command = "make deploy SITE=acme.example" } }]
usage = { input_tokens = 2200, output_tokens = 60 }

[[conversations.steps]]
text = "Done."

[[conversations]]

[[conversations.steps]]
text = "Hello."
"""

LOOP_CONFIG = """
tags = ["client:acme", "team:web"]
provider = "scripted"
model = "scripted-demo"
system_prompt = "You are the acme site's assistant. Be brief."
max_steps = 6

[provider_options]
script = "script.toml"

[approval]
timeout_s = 600
tools = { shell = "ask" }
"""


def say(line: str) -> None:
    print(f"console-docs: {line}", file=sys.stderr, flush=True)


# --- the demo's data ----------------------------------------------------------------------------------------


def demo_start(now: datetime) -> datetime:
    """Where the demo's history starts: three days ago, but within this month (the Costs page's default range)."""
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return max(now - timedelta(days=3), month + timedelta(minutes=1))


def weather_session(clock: Clock) -> tuple[list[ev.Event], uuid.UUID]:
    """acme's umbrella question: a forecast lookup, an approved risky call and a delegated child session."""
    parent = SessionBuilder("acme", clock, ("client:acme", "project:site")).create(
        source="web", title="Do I need an umbrella in Charleston today?"
    )
    turn = parent.start_turn(snapshot={"system_prompt": "You are the acme site's assistant.", "memory": []})
    parent.message(turn, UserMessage(text="Do I need an umbrella in Charleston today? Then post it on the site."))
    clock.tick(1_900)
    parent.model_call(turn, model="claude-sonnet-4-5", input_tokens=2_400, output_tokens=180)
    parent.message(
        turn,
        AssistantMessage(
            text="Let me check the forecast.",
            tool_calls=(ToolCall(id="w1", name="http_get", args={"url": "https://forecast.example/charleston"}),),
        ),
    )
    clock.tick(600)
    forecast = '{"today": "light rain from 14:00", "high_c": 18, "low_c": 12}'
    parent.tool_call(turn, "w1", "http_get", {"url": "https://forecast.example/charleston"}, forecast)
    parent.message(turn, ToolResultMessage(call_id="w1", content=forecast))
    clock.tick(1_400)
    parent.model_call(turn, model="claude-sonnet-4-5", input_tokens=2_700, output_tokens=120)
    parent.message(
        turn,
        AssistantMessage(tool_calls=(ToolCall(id="d1", name="delegate", args={"goal": "Write the site's banner"}),)),
    )
    child = SessionBuilder("acme", clock, ("client:acme", "project:site")).create(
        source="delegate", title="Write the site's banner", parent_session_id=parent.session_id
    )
    child_turn = child.start_turn(parent_turn_id=turn, depth=1)
    child.message(child_turn, UserMessage(text="Write the site's banner: rain from 2 pm."))
    clock.tick(1_100)
    child.model_call(child_turn, model="claude-haiku-4-5", input_tokens=900, output_tokens=60)
    command = "publish-banner 'Rain from 2 pm: bring an umbrella'"
    child.message(child_turn, AssistantMessage(tool_calls=(ToolCall(id="s1", name="shell", args={"cmd": command}),)))
    clock.tick(4_000)  # waiting for the approval
    child.tool_call(
        child_turn,
        "s1",
        "shell",
        {"cmd": command},
        "banner published",
        risk=ev.Risk.HIGH,
        approval=ev.ApprovalStatus.APPROVED,
    )
    child.message(child_turn, ToolResultMessage(call_id="s1", content="banner published"))
    clock.tick(700)
    child.model_call(child_turn, model="claude-haiku-4-5", input_tokens=1_000, output_tokens=20)
    child.message(child_turn, AssistantMessage(text="Banner published."))
    child.finish(child_turn)
    parent.tool_call(turn, "d1", "delegate", {"goal": "Write the site's banner"}, "Banner published.")
    parent.message(turn, ToolResultMessage(call_id="d1", content="Banner published."))
    clock.tick(1_200)
    parent.model_call(turn, model="claude-sonnet-4-5", input_tokens=3_100, output_tokens=90)
    parent.message(
        turn,
        AssistantMessage(text="Yes, bring an umbrella: light rain from 2 pm, 18 °C. The site's banner says so."),
    )
    parent.finish(turn)
    return parent.events + child.events, parent.session_id


def simple_session(
    clock: Clock, profile: str, tags: tuple[str, ...], title: str, exchanges: list[tuple[str, str, str]]
) -> list[ev.Event]:
    """A session of one turn per (question, tool, answer): a model call, a tool call, another, the answer."""
    s = SessionBuilder(profile, clock, tags).create(source="cli", title=title)
    for n, (question, tool, answer) in enumerate(exchanges):
        turn = s.start_turn(snapshot={"system_prompt": "Be brief.", "memory": []} if n == 0 else None)
        s.message(turn, UserMessage(text=question))
        clock.tick(1_500)
        s.model_call(turn, model="gpt-4.1", provider="openai", input_tokens=1_500 + 400 * n, output_tokens=90)
        args: dict[str, object] = {"path": f"reports/{tool}.csv"}
        s.message(turn, AssistantMessage(tool_calls=(ToolCall(id=f"t{n}", name="read_file", args=args),)))
        clock.tick(300)
        s.tool_call(turn, f"t{n}", "read_file", args, f"{tool}: 14 rows")
        s.message(turn, ToolResultMessage(call_id=f"t{n}", content=f"{tool}: 14 rows"))
        clock.tick(2_100)
        s.model_call(turn, model="gpt-4.1", provider="openai", input_tokens=2_000 + 400 * n, output_tokens=260)
        s.message(turn, AssistantMessage(text=answer))
        s.finish(turn)
        clock.tick(90_000)
    return s.events


def demo_events(now: datetime) -> tuple[list[ev.Event], uuid.UUID]:
    """The demo's loop sessions, spread from `demo_start(now)` to now; and the umbrella session's id."""
    start = demo_start(now)
    step = (now - start) / 6
    clock = Clock(start)
    events = simple_session(
        clock,
        "globex",
        ("client:globex", "team:finance"),
        "Summarise last week's invoices",
        [
            ("Summarise last week's invoices.", "invoices", "Twelve invoices, 48,200 USD; two are overdue."),
            ("Which two are overdue?", "overdue", "Invoices 1043 and 1047, both from Initrode."),
        ],
    )
    clock.now = start + step
    events += simple_session(
        clock,
        "acme",
        ("client:acme", "team:web"),
        "Why is the nightly backup slow?",
        [("Why is the nightly backup slow?", "backup-times", "The database dump grew 3x since the 1st.")],
    )
    clock.now = start + 2 * step
    events += simple_session(
        clock,
        "initech",
        ("client:initech",),
        "Draft the release notes for 2.4",
        [
            ("Draft the release notes for 2.4.", "changes", "Draft ready: 9 changes, 2 of them breaking."),
            ("Shorter, please.", "changes", "2.4: faster search, new export; the v1 API is gone."),
        ],
    )
    clock.now = start + 3 * step
    events += simple_session(
        clock,
        "globex",
        ("client:globex", "team:finance"),
        "Budget for the Q1 campaign",
        [("What is left of the Q1 campaign's budget?", "budget", "31% left: 6,200 USD of 20,000.")],
    )
    clock.now = start + 4 * step
    weather, umbrella = weather_session(clock)
    return events + weather, umbrella


def cos(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "commonos.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cos {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr}")


async def imports(nats_url: str, dsn: str) -> None:
    """`cos import` of the fixtures' transcripts, then the journal-writer and billing until they stored them."""
    async with journal_writer(nats_url, dsn), billing(nats_url, dsn):
        for vendor, folder in IMPORTS:
            await asyncio.to_thread(
                cos, "import", vendor, str(FIXTURES / folder), "--profile", "acme", "--no-progress",
                env={"COS_NATS_URL": nats_url},
            )  # fmt: skip
        await settled(nats_url, ("journal-writer", "graph-writer", "billing"))


async def settled(nats_url: str, consumers: tuple[str, ...], timeout_s: float = 120.0) -> None:
    """Until each of `consumers` has applied everything in the stream."""
    import nats
    import nats.js.errors

    from commonos.proto.subjects import EVENTS_STREAM

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout_s
        for name in consumers:
            while True:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    info = await js.consumer_info(EVENTS_STREAM, name)
                    if info.num_pending == 0 and info.num_ack_pending == 0:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not catch up with the stream within {timeout_s:.0f} s")
                await asyncio.sleep(0.2)
    finally:
        await nc.close()


# --- the loop, for the chat and a waiting approval ------------------------------------------------------------


@contextlib.asynccontextmanager
async def loop_of_acme(nats_url: str, dsn: str, folder: Path) -> AsyncIterator[None]:
    """The loop service of profile acme on the scripted provider, and the journal-writer storing its turns."""
    import nats

    from commonos.loop.approvals import NatsApprover
    from commonos.loop.deltas import DeltaPublisher
    from commonos.loop.locks import NatsSessionLocks
    from commonos.loop.loop import Loop
    from commonos.loop.nats_journal import NatsJournal
    from commonos.loop.providers import build_provider
    from commonos.loop.service import LoopService
    from commonos.runtime.nats import ensure_streams

    nc: Client = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        profile = write_profile(folder, "acme", config=LOOP_CONFIG, script=LOOP_SCRIPT)
        loop = Loop(
            NatsJournal(js),
            {profile.id: profile},
            {profile.id: build_provider(profile)},
            locks=NatsSessionLocks(js),
            approver=NatsApprover(nc),
            deltas=DeltaPublisher(nc).for_turn,
        )
        service = LoopService(nc, loop, handle_signals=False, grace_s=0.1)
        async with journal_writer(nats_url, dsn), billing(nats_url, dsn):
            await service.start()
            serving = asyncio.create_task(service.serve())
            try:
                yield
            finally:
                service.stop_event.set()
                await serving
                await service.shutdown()
    finally:
        await nc.close()


# --- the pictures -----------------------------------------------------------------------------------------------


def optimized(png: bytes) -> bytes:
    """The screenshot as a 256-colour palette PNG: a tenth of the size, the same to the eye for a page of text."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=256, dither=Image.Dither.NONE).save(out, format="PNG", optimize=True)
    return out.getvalue()


@dataclasses.dataclass
class Camera:
    page: Page
    out: Path
    taken: list[Path] = dataclasses.field(default_factory=list)

    async def open(self, path: str) -> None:
        await self.page.goto(path, wait_until="load", timeout=PAGE_TIMEOUT_MS)
        await self.page.locator("main").first.wait_for(state="visible", timeout=PAGE_TIMEOUT_MS)
        await self.page.wait_for_timeout(SETTLE_MS)

    async def shoot(self, name: str, path: str | None = None) -> None:
        if path is not None:
            await self.open(path)
        png = await self.page.screenshot(animations="disabled")
        target = self.out / f"console-{name}.png"
        target.write_bytes(optimized(png))
        self.taken.append(target)
        say(f"{target.relative_to(REPO) if target.is_relative_to(REPO) else target} ({target.stat().st_size:,} bytes)")


async def best_effort(what: str, step: Callable[[], Awaitable[None]]) -> None:
    """A step that makes a picture better (typing into the chat); the picture is taken even when it fails."""
    try:
        await step()
    except Exception as exc:
        say(f"{what} did not work on this version of the page ({type(exc).__name__}: {exc}); picture taken as it is")


async def chat(camera: Camera) -> None:
    page = camera.page
    await camera.open("/chat")

    async def ask() -> None:
        form = page.locator("main form").first
        with contextlib.suppress(Exception):  # a page without a choice of profile, or acme already chosen
            await form.locator("select").first.select_option("acme", timeout=2_000)
        await form.locator("textarea, input[type=text]").first.fill(CHAT_QUESTION)
        await form.locator("button[type=submit], button:not([type])").first.click()
        await page.get_by_text("bring an umbrella", exact=False).last.wait_for(timeout=PAGE_TIMEOUT_MS)
        await page.wait_for_timeout(SETTLE_MS)

    await best_effort("asking the chat", ask)
    await camera.shoot("chat")


async def wait_for_approval(client: aiohttp.ClientSession, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with client.get("/api/approvals") as r:
            if r.status == 200 and (await r.json()).get("approvals"):
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no approval waited within {timeout_s:.0f} s")


async def first_imported(dsn: str) -> str:
    conn = await connect(dsn)
    try:
        found = await conn.fetchval(
            "SELECT s.id FROM graph.sessions s WHERE s.parent_session_id IS NULL "
            "ORDER BY (SELECT count(*) FROM graph.sessions c WHERE c.parent_session_id = s.id) DESC, s.started_at "
            "LIMIT 1"
        )
    finally:
        await conn.close()
    return str(found)


async def pictures(console: RunningConsole, dsn: str, umbrella: uuid.UUID, out: Path) -> list[Path]:
    async with async_playwright() as playwright:
        args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        browser = await playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=args)
        try:
            context = await browser.new_context(base_url=console.url, viewport=VIEWPORT)  # type: ignore[arg-type]
            page = await context.new_page()
            camera = Camera(page, out)
            await camera.shoot("sign-in", "/login?next=%2Fsessions")
            await page.get_by_label("Name").fill("olivia")
            await page.get_by_label("Password").fill(PASSWORDS["olivia"])
            await page.get_by_role("button", name="Sign in").click()
            await page.wait_for_url("**/sessions**", timeout=PAGE_TIMEOUT_MS)
            await camera.shoot("sessions", "/sessions")
            await camera.shoot("session", f"/sessions/{umbrella}")
            await chat(camera)

            # A call waiting for a decision, for the Approvals page (denied afterwards).
            client = await console.client()
            async with client.post("/api/login", json={"name": "olivia", "password": PASSWORDS["olivia"]}) as r:
                token = (await r.json())["csrf_token"]

            async def deploy() -> None:
                async with client.post(
                    "/api/chat",
                    json={"text": "deploy the site", "profile_id": "acme"},
                    headers={"X-CSRF-Token": token},
                    timeout=aiohttp.ClientTimeout(total=120),
                ) as r:
                    await r.read()

            waiting = asyncio.create_task(deploy())
            await wait_for_approval(client)
            await camera.shoot("approvals", "/approvals")
            await camera.shoot("costs", "/costs")
            await camera.shoot("imported", "/imported")
            await camera.shoot("imported-session", f"/imported/{await first_imported(dsn)}")
            await camera.shoot("operations", "/operations")
            async with client.get("/api/approvals") as r:
                waiting_now = (await r.json())["approvals"]
            for approval in waiting_now:
                async with client.post(
                    f"/api/approvals/{approval['approval_id']}/deny", headers={"X-CSRF-Token": token}
                ) as r:
                    await r.read()
            await waiting
            await context.close()
            return camera.taken
        finally:
            await browser.close()


# --- the whole run --------------------------------------------------------------------------------------------


async def run(out: Path, keep: bool) -> list[Path]:
    root = make_temp_root("cos-console-docs-")
    nats_server = NatsServer(root / "nats")
    pg = PostgresCluster(root / "pg", durable=False)
    say(f"servers in {root}")
    try:
        nats_server.start()
        pg.start()
        dsn = pg.url
        conn = await asyncpg.connect(dsn)
        try:
            await apply_schemas(conn, [CORE_SCHEMA, MEMORY_SCHEMA, BILLING_SCHEMA, GRAPH_SCHEMA])
        finally:
            await conn.close()
        events, umbrella = demo_events(datetime.now(UTC) - timedelta(minutes=5))
        say(f"publishing the demo: {len(events)} events")
        await project(nats_server.url, dsn, events)
        say("importing Claude Code and Codex transcripts")
        await imports(nats_server.url, dsn)
        users = root / "console-users.toml"
        users.write_text(users_toml("console_nobody"))
        settings = ConsoleSettings(
            common=Settings(nats_url=nats_server.url, database_url=dsn),
            host="127.0.0.1",
            port=free_port(),
            users_file=users,
            secret="console-docs-" + uuid.uuid4().hex,
            secure_cookies=False,
        )
        async with loop_of_acme(nats_server.url, dsn, root / "profiles"), run_console(settings) as console:
            say(f"console at {console.url}; taking the pictures")
            return await pictures(console, dsn, umbrella, out)
    finally:
        pg.stop()
        nats_server.stop()
        if not keep:
            cleanup(root)


def main() -> int:
    parser = argparse.ArgumentParser(prog="make console-docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the pictures go (default {OUT})")
    parser.add_argument("--keep", action="store_true", help="keep the servers' temporary folder")
    args = parser.parse_args()
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    taken = asyncio.run(run(args.out.resolve(), args.keep))
    total = sum(p.stat().st_size for p in taken)
    say(f"{len(taken)} pictures, {total / 1024:,.0f} KiB in all, in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
