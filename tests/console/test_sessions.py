"""The Sessions page and a session's page, on data published through the real journal-writer and billing: the
list's keyset pages, filters and full-text search with safe snippets; a session's conversation, turn tree with a
delegated child inline, tool and model calls; attacker-controlled text rendered as text; an analyst refused
another profile's session by URL and by API; new events of a running turn arriving live over SSE."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import aiohttp
import msgspec
import pytest

from commonos.console.pages import sessions as sessions_page
from commonos.proto import events as ev
from commonos.proto.graph import (
    EntityType,
    Graph,
    InputKind,
    InputOrigin,
    Outcome,
    UserInput,
    VendorID,
)
from commonos.proto.graph import Session as GraphSession
from commonos.proto.messages import UserMessage
from tests.console.conftest import (
    HOSTILE_RESULT,
    SCRIPT,
    RunningConsole,
    Seeded,
    StartConsole,
    project,
)
from tests.factories import Clock, SessionBuilder
from tests.support import publish_all


def __getattr__(name: str) -> Any:
    """`hostile` lives in conftest.py now (every test of tests/console has it); kept for imports from here."""
    if name == "hostile":
        from tests.console import conftest

        return conftest.hostile
    raise AttributeError(name)


async def get_json(client: aiohttp.ClientSession, url: str, status: int = 200) -> Any:
    async with client.get(url) as r:
        assert r.status == status, (url, r.status, await r.text())
        return await r.json()


async def test_the_list_pages_by_keyset_and_filters(
    console: RunningConsole, console_db: Seeded, hostile: tuple[SessionBuilder, SessionBuilder]
) -> None:
    client, _ = await console.signed_in("olivia")
    everything = await get_json(client, "/api/sessions")
    rows = everything["sessions"]
    assert len(rows) == 5 and everything["next_cursor"] is None
    created = [r["created_at"] for r in rows]
    assert created == sorted(created, reverse=True)
    # Pages of two: every session once, in the same order.
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await get_json(client, "/api/sessions?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        seen += [r["id"] for r in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [r["id"] for r in rows]

    def ids(data: Any) -> set[str]:
        return {r["id"] for r in data["sessions"]}

    parent, child = hostile
    assert ids(await get_json(client, "/api/sessions?profile=globex")) == {
        str(s) for s in console_db.sessions("globex")
    }
    assert ids(await get_json(client, "/api/sessions?tag=team:red")) == {str(parent.session_id)}
    assert ids(await get_json(client, "/api/sessions?source=delegate")) == {str(child.session_id)}
    assert len((await get_json(client, "/api/sessions?status=completed"))["sessions"]) == 5
    assert (await get_json(client, "/api/sessions?status=running"))["sessions"] == []
    # A time range: only the hostile pair is after the sample data's hour.
    since = (parent.events[0].occurred_at - timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    assert ids(await get_json(client, f"/api/sessions?since={since}")) == {
        str(parent.session_id),
        str(child.session_id),
    }
    assert ids(await get_json(client, f"/api/sessions?until={since}")) == {
        str(s)
        for p in ("acme", "globex")
        for s in console_db.sessions(p)
        if s not in (parent.session_id, child.session_id)
    }
    assert (await get_json(client, "/api/sessions?vendor=codex"))["sessions"] == []
    # A form's blank fields are no filter.
    blank = await get_json(client, "/api/sessions?q=&profile=&source=&status=&tag=&kind=all&vendor=&since=&until=")
    assert [r["id"] for r in blank["sessions"]] == [r["id"] for r in rows]
    async with client.get("/api/sessions?since=yesterday") as r:
        assert r.status == 422
    # PostgreSQL's text cannot hold a NUL: refused before any query.
    for url in ("/api/sessions?q=a%00b", "/sessions?tag=x%00", "/api/sessions?status=%00"):
        async with client.get(url) as r:
            assert r.status == 422, url
    async with client.get("/api/sessions?cursor=garbage") as r:
        assert r.status == 422
    async with client.get("/api/sessions?since=2026-11-01T00:00:00") as r:
        assert r.status == 422
    # A time that is no time in UTC (year 1 east of Greenwich): refused, not a server error.
    async with client.get("/api/sessions?until=0001-01-01T00:00:00%2B01:00") as r:
        assert r.status == 422, await r.text()
        assert "outside the years 1 to 9999" in await r.text()

    # The HTML page shows the same rows, with htmx for the filters and a link to the next page.
    async with client.get("/sessions?limit=2") as r:
        html = await r.text()
        assert r.status == 200
        assert 'hx-get="/sessions"' in html and "Older →" in html and "cursor=" in html
        assert "Hostile &lt;b&gt;title&lt;/b&gt;" in html


async def test_the_status_filter_is_the_latest_turns(
    console: RunningConsole, console_db: Seeded, nats_url: str
) -> None:
    """A session is listed under the status of its latest turn only: one that failed and then completed is not a
    failed session, one that completed and then failed is; each status of TurnStatus finds its own."""
    clock = Clock()
    sessions: dict[str, SessionBuilder] = {}
    for name, statuses in {
        "recovered": (ev.TurnStatus.FAILED, ev.TurnStatus.COMPLETED),
        "failed": (ev.TurnStatus.COMPLETED, ev.TurnStatus.FAILED),
        "cancelled": (ev.TurnStatus.FAILED, ev.TurnStatus.CANCELLED),
        "interrupted": (ev.TurnStatus.INTERRUPTED,),
        "running": (ev.TurnStatus.FAILED, None),
    }.items():
        b = SessionBuilder("acme", clock, tags=("client:acme",)).create(title=name)
        for status in statuses:
            turn = b.start_turn()
            if status is not None:
                b.finish(turn, status, error="boom" if status == ev.TurnStatus.FAILED else None)
        sessions[name] = b
    await project(nats_url, console_db.dsn, [e for b in sessions.values() for e in b.events])
    client, _ = await console.signed_in("olivia")

    async def listed(status: str) -> set[str]:
        return {r["title"] for r in (await get_json(client, f"/api/sessions?status={status}"))["sessions"]}

    assert await listed("failed") == {"failed"}
    assert await listed("cancelled") == {"cancelled"}
    assert await listed("interrupted") == {"interrupted"}
    assert await listed("running") == {"running"}
    assert "recovered" in await listed("completed")
    assert not {"failed", "cancelled", "interrupted", "running"} & await listed("completed")


@pytest.mark.parametrize("few_hits", [2000, 1], ids=["from-the-matches", "from-the-newest-sessions"])
async def test_search_finds_a_message_with_a_safe_snippet(
    console: RunningConsole,
    hostile: tuple[SessionBuilder, SessionBuilder],
    few_hits: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both ways of searching (a few matches: from the GIN index; many: the newest sessions checked each)."""
    monkeypatch.setattr(sessions_page, "FEW_HITS", few_hits)
    parent, child = hostile
    client, _ = await console.signed_in("olivia")
    found = await get_json(client, "/api/sessions?q=xylophone")
    assert [r["id"] for r in found["sessions"]] == [str(child.session_id), str(parent.session_id)]
    child_row, parent_row = found["sessions"]
    # PostgreSQL leaves markup out of a headline; what is left is escaped, then the matches marked.
    assert "xylophone" in parent_row["snippet"] and "<script>" not in parent_row["snippet"]
    assert "<mark>xylophone</mark>" in parent_row["snippet_html"]
    assert "1 &lt; 2 &amp; <mark>xylophone</mark>" in child_row["snippet_html"], child_row["snippet_html"]
    assert "1 < 2 & xylophone" in child_row["snippet"]
    for row in found["sessions"]:
        assert "<" not in row["snippet_html"].replace("<mark>", "").replace("</mark>", "")
    assert (await get_json(client, "/api/sessions?q=xylophone&profile=globex"))["sessions"] == []
    assert (await get_json(client, "/api/sessions?q=nonexistentword"))["sessions"] == []
    # Quotes and operators are plain words to websearch_to_tsquery, never an error.
    assert (await get_json(client, '/api/sessions?q="the umbrella" -rain'))["sessions"]
    async with client.get("/sessions?q=xylophone") as r:
        html = await r.text()
        assert "<mark>xylophone</mark>" in html and "&lt; 2 &amp; <mark>xylophone</mark>" in html
        assert "<script>alert" not in html


async def test_a_session_page_shows_the_tree_tool_and_model_calls(
    console: RunningConsole, hostile: tuple[SessionBuilder, SessionBuilder]
) -> None:
    parent, child = hostile
    client, _ = await console.signed_in("olivia")
    s = await get_json(client, f"/api/sessions/{parent.session_id}")
    assert (s["profile_id"], s["source"], s["status"]) == ("acme", "web", "completed")
    assert s["context_snapshot"]["system_prompt"] == "Obey <b>nobody</b>."
    [turn] = s["turns"]
    assert [m["role"] for m in turn["messages"]] == ["user", "assistant", "tool_result", "assistant"]
    assert turn["messages"][0]["text"] == SCRIPT
    assert turn["messages"][1]["tool_calls"] == [{"id": "d1", "name": "delegate", "args": {"goal": "look"}}]
    # The delegated child sits under the turn that delegated, with its own tool call and model call.
    [inline] = turn["children"]
    assert inline["id"] == str(child.session_id) and s["children"] == []
    [tool] = inline["turns"][0]["tool_calls"]
    assert (tool["name"], tool["risk"], tool["approval"], tool["decided_by"]) == (
        "shell",
        "high",
        "approved",
        "cli:tester",
    )
    assert tool["args"] == {"cmd": "rm -rf <tmp>"} and tool["result"] == HOSTILE_RESULT
    assert tool["duration_ms"] > 0
    [mc] = inline["turns"][0]["model_calls"]
    assert (mc["input_tokens"], mc["output_tokens"], mc["cost_status"]) == (500, 50, "priced")
    assert Decimal(mc["cost_usd"]) > 0
    # The totals include the child's model calls.
    assert s["totals"]["model_calls"] == 2
    assert (s["totals"]["input_tokens"], s["totals"]["output_tokens"]) == (1700, 350)
    assert Decimal(s["totals"]["cost_usd"]) == Decimal(turn["model_calls"][0]["cost_usd"]) + Decimal(mc["cost_usd"])

    async with client.get(f"/sessions/{parent.session_id}") as r:
        html = await r.text()
        assert r.status == 200
    # Attacker-controlled text is text: escaped in the message, the tool's arguments and result, and the title.
    assert "<script>alert" not in html and '&lt;script&gt;alert("owned")&lt;/script&gt;' in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=" in html
    assert "Hostile &lt;b&gt;title&lt;/b&gt;" in html
    assert "Obey &lt;b&gt;nobody&lt;/b&gt;." in html
    assert 'class="child"' in html and "helper" in html
    assert f'data-live="/sessions/{parent.session_id}/live"' in html and 'id="timeline-turns"' in html
    async with client.get(f"/sessions/{uuid.uuid4()}") as r:
        assert r.status == 404
    async with client.get("/sessions/not-a-uuid") as r:
        assert r.status == 404 and "a session id is a UUID" in await r.text()


async def test_an_analyst_sees_only_its_profiles(
    console: RunningConsole, console_db: Seeded, hostile: tuple[SessionBuilder, SessionBuilder]
) -> None:
    client, _ = await console.signed_in("alice")
    listed = await get_json(client, "/api/sessions")
    assert {r["profile_id"] for r in listed["sessions"]} == {"acme"}
    assert (await get_json(client, "/api/sessions?profile=globex"))["sessions"] == []
    [globex] = console_db.sessions("globex")
    globex_words = (
        next(
            e.content.text
            for e in console_db.events
            if isinstance(e, ev.MessageAppended) and e.profile_id == "globex" and isinstance(e.content, UserMessage)
        )
        .split()[0]
        .strip(".")
        .lower()
    )
    found = await get_json(client, f"/api/sessions?q={globex_words}")
    assert str(globex) not in {r["id"] for r in found["sessions"]}
    # By API and by URL: no such session, as if it did not exist.
    await get_json(client, f"/api/sessions/{globex}", status=404)
    async with client.get(f"/sessions/{globex}") as r:
        assert r.status == 404
        assert "globex" not in await r.text()
    async with client.get(f"/api/sessions/{globex}/events") as r:
        assert r.status == 404
    # Its own profile's sessions it sees whole.
    [acme, *_] = console_db.sessions("acme")
    assert (await get_json(client, f"/api/sessions/{acme}"))["profile_id"] == "acme"
    # The operator sees globex's.
    operator, _ = await console.signed_in("olivia")
    assert (await get_json(operator, f"/api/sessions/{globex}"))["profile_id"] == "globex"


@contextlib.asynccontextmanager
async def sse(client: aiohttp.ClientSession, url: str) -> AsyncIterator[asyncio.Queue[tuple[str, str]]]:
    """The (event, data) pairs of a server-sent event stream, as they arrive."""
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    async def read() -> None:
        async with client.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as r:
            assert r.status == 200, await r.text()
            assert r.headers["Content-Type"].startswith("text/event-stream")
            name, data = "message", list[str]()
            async for raw in r.content:
                line = raw.decode().rstrip("\r\n")
                if line == "":
                    if data:
                        await queue.put((name, "\n".join(data)))
                    name, data = "message", []
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))

    task = asyncio.create_task(read())
    try:
        yield queue
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def next_event(queue: asyncio.Queue[tuple[str, str]], name: str, timeout_s: float = 10.0) -> str:
    async with asyncio.timeout(timeout_s):
        while True:
            got, data = await queue.get()
            if got == name:
                return data


async def test_a_running_turn_appears_live(console: RunningConsole, console_db: Seeded, nats_url: str) -> None:
    [session_id, *_] = console_db.sessions("acme")
    created = next(e for e in console_db.events if isinstance(e, ev.SessionCreated) and e.session_id == session_id)
    builder = SessionBuilder("acme", Clock(), session_id=session_id, seq=30)
    assert created.session_id == builder.session_id
    client, _ = await console.signed_in("olivia")
    async with (
        sse(client, f"/sessions/{session_id}/live") as html,
        sse(client, f"/api/sessions/{session_id}/events") as raw,
    ):
        assert await next_event(html, "ready") and await next_event(raw, "ready")
        turn = builder.start_turn()
        builder.message(turn, UserMessage(text="<script>live()</script> what now"))
        builder.tool_call(turn, "c9", "read_file", {"path": "/etc/<x>"}, "file body", risk=ev.Risk.HIGH)
        await publish_all(nats_url, builder.events)
        # Each event is a list of changes to the page, merged into its turn: the turn (its article and its
        # timeline), the header's status, the message, the tool call in place of its request.
        started = await next_ops(html)
        assert {(o["op"], o.get("id")) for o in started} >= {
            ("put", f"turn-{turn}"),
            ("put", f"tl-{turn}"),
            ("status", "session-status"),
        }
        assert next(o for o in started if o.get("id") == "session-status")["status"] == "running"
        [message] = [o for o in await next_ops(html) if o.get("key") == "msg:31"]
        assert message["into"] == f"turn-{turn}"
        assert "&lt;script&gt;live()&lt;/script&gt; what now" in message["html"] and "<script>" not in message["html"]
        tool = await next_ops(html)
        [call] = [o for o in tool if o.get("key") == "call:c9"]
        assert call["into"] == f"turn-{turn}"
        assert "read_file" in call["html"] and "risk high" in call["html"] and "/etc/&lt;x&gt;" in call["html"]
        [span] = [o for o in tool if o.get("key") == "tool:c9"]
        assert span["into"] == f"tl-{turn}-spans" and 'data-kind="tool"' in span["html"]
        assert json.loads(await next_event(raw, "turn_started"))["turn_id"] == str(turn)
        appended = json.loads(await next_event(raw, "message_appended"))
        assert appended["content"]["text"] == "<script>live()</script> what now"

        builder.events.clear()
        builder.finish(turn)
        await publish_all(nats_url, builder.events)
        finished = await next_ops(html)
        assert {o["id"]: o["status"] for o in finished if o["op"] == "status"} == {
            f"turn-status-{turn}": "completed",
            f"tl-status-{turn}": "completed",
            "session-status": "completed",
        }
        assert json.loads(await next_event(raw, "turn_finished"))["status"] == "completed"


async def next_ops(queue: asyncio.Queue[tuple[str, str]]) -> list[dict[str, Any]]:
    """The operations of the next `update` of a session page's live stream."""
    ops: list[dict[str, Any]] = json.loads(await next_event(queue, "update"))
    return ops


async def test_pages_need_a_database(start_console: StartConsole, nats_url: str) -> None:
    """Without COS_DATABASE_URL the console still signs people in, and says what is missing."""
    from commonos.runtime.settings import Settings

    bare = await start_console(common=Settings(nats_url=nats_url))
    client, _ = await bare.signed_in("olivia")
    async with client.get("/api/sessions") as r:
        assert r.status == 503


def imported(profile: str, clock: Clock, vendor: str, title: str) -> ev.TranscriptImported:
    """A transcript import whose graph is one session (with its vendor id) and one input."""
    root = str(uuid.uuid4())
    started = clock.tick()
    graph = Graph(
        sessions=[
            GraphSession(
                id=root,
                parent_session_id=None,
                spawned_by_tool_use_id=None,
                started_at=started,
                title=title,
                outcome=Outcome.COMMITTED,
            )
        ],
        user_inputs=[
            UserInput(
                id=str(uuid.uuid4()),
                session_id=root,
                ordinal=0,
                text=title,
                interrupted=False,
                kind=InputKind.PROMPT,
                origin=InputOrigin.HUMAN,
                metadata=msgspec.Raw(b"{}"),
            )
        ],
        vendor_ids=[
            VendorID(
                our_id=root,
                our_type=EntityType.SESSION,
                session_id=root,
                vendor=vendor,
                vendor_id_kind="session_id",
                vendor_id=f"{vendor}-{root}",
            )
        ],
    )
    return ev.TranscriptImported(
        occurred_at=clock.tick(),
        profile_id=profile,
        session_id=uuid.UUID(root),
        vendor=vendor,
        graph=graph,
    )


async def test_imported_sessions_are_listed_with_their_vendor(
    console: RunningConsole, console_db: Seeded, nats_url: str
) -> None:
    clock = Clock()
    clock.tick(7_200_000)
    claude = imported("acme", clock, "claude-code", "fix the <build>")
    codex = imported("globex", clock, "codex", "write docs")
    await project(nats_url, console_db.dsn, [claude, codex])
    client, _ = await console.signed_in("olivia")
    rows = (await get_json(client, "/api/sessions"))["sessions"]
    assert [(r["kind"], r["vendor"], r["status"]) for r in rows[:2]] == [
        ("imported", "codex", "committed"),
        ("imported", "claude-code", "committed"),
    ]
    assert rows[1]["url"] == f"/imported/{claude.session_id}" and rows[1]["title"] == "fix the <build>"
    assert len(rows) == 5  # with the three of the loop
    by_vendor = (await get_json(client, "/api/sessions?vendor=claude-code"))["sessions"]
    assert [r["id"] for r in by_vendor] == [str(claude.session_id)]
    assert all(r["kind"] == "loop" for r in (await get_json(client, "/api/sessions?kind=loop"))["sessions"])
    assert [r["kind"] for r in (await get_json(client, "/api/sessions?kind=imported"))["sessions"]] == ["imported"] * 2
    assert (await get_json(client, "/api/sessions?status=committed&profile=globex"))["sessions"][0]["vendor"] == "codex"
    # Keyset pages run across both kinds.
    page = await get_json(client, "/api/sessions?limit=3")
    rest = await get_json(client, f"/api/sessions?limit=3&cursor={page['next_cursor']}")
    assert [r["id"] for r in page["sessions"] + rest["sessions"]] == [r["id"] for r in rows]
    async with client.get("/sessions?kind=imported") as r:
        html = await r.text()
        assert f'href="/imported/{claude.session_id}"' in html and "fix the &lt;build&gt;" in html
    # An analyst of acme: acme's import only (row-level security on graph.sessions).
    analyst, _ = await console.signed_in("alice")
    seen = (await get_json(analyst, "/api/sessions?kind=imported"))["sessions"]
    assert [r["id"] for r in seen] == [str(claude.session_id)]
