"""The Imported page on session graphs projected by the real journal-writer (and the billed calls by billing): the
list with its counts and keyset pages, a Claude Code session's inputs, model invocations, assistant text, tool uses
and results, file touches and subagent session, with attacker-controlled text escaped; an analyst sees its
profiles' imports only, by list, URL and API (the graph tables' row-level security)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import msgspec
import pytest

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
from commonos.proto.graph.model import (
    AssistantMessage,
    FileTouch,
    Hunk,
    ModelInvocation,
    ToolResult,
    ToolStatus,
    ToolUse,
    ToolVerb,
    TouchKind,
)
from tests.console.conftest import RunningConsole, Seeded, project

HOSTILE_PROMPT = '<script>alert("prompt")</script> fix the <b>build</b>'
HOSTILE_OUTPUT = '<img src=x onerror="alert(1)"> patched'
T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def _id() -> str:
    return str(uuid.uuid4())


def claude_session(profile: str, title: str, at: datetime) -> tuple[ev.TranscriptImported, ev.ModelCallCompleted]:
    """A Claude Code tree: two inputs; the first edits a file (result, touch with a hunk) and spawns a subagent
    (its own input and invocation); plus the billed call of the tree."""
    root, child = _id(), _id()
    in0, in1, child_in = _id(), _id(), _id()
    m0, m1, child_m = _id(), _id(), _id()
    edit, task = _id(), _id()
    raw = msgspec.Raw
    graph = Graph(
        sessions=[
            GraphSession(
                id=root,
                parent_session_id=None,
                spawned_by_tool_use_id=None,
                started_at=at,
                ended_at=at + timedelta(minutes=5),
                title=title,
                working_dir="/home/dev/web",
                git_branch="main",
                outcome=Outcome.COMMITTED,
            ),
            GraphSession(
                id=child,
                parent_session_id=root,
                spawned_by_tool_use_id=task,
                started_at=at + timedelta(seconds=30),
                title="subagent: look around",
                outcome=Outcome.UNKNOWN,
            ),
        ],
        user_inputs=[
            UserInput(
                id=in0,
                session_id=root,
                ordinal=0,
                text=HOSTILE_PROMPT,
                triggered_at=at,
                interrupted=False,
                kind=InputKind.PROMPT,
                origin=InputOrigin.HUMAN,
                metadata=raw(b"{}"),
            ),
            UserInput(
                id=in1,
                session_id=root,
                ordinal=1,
                text="/compact",
                triggered_at=at + timedelta(minutes=2),
                interrupted=True,
                kind=InputKind.SLASH_COMMAND,
                origin=InputOrigin.HUMAN,
                metadata=raw(b"{}"),
            ),
            UserInput(
                id=child_in,
                session_id=child,
                ordinal=0,
                text="look around",
                interrupted=False,
                kind=InputKind.PROMPT,
                origin=InputOrigin.AGENT,
                metadata=raw(b"{}"),
            ),
        ],
        model_invocations=[
            ModelInvocation(
                id=m0,
                session_id=root,
                user_input_id=in0,
                parent_model_invocation_id=None,
                model="claude-sonnet-4-5",
                input_tokens=1200,
                output_tokens=300,
                cache_read_tokens=5000,
                cache_write_tokens=100,
                total_tokens=6600,
                stop_reason="tool_use",
                started_at=at,
            ),
            ModelInvocation(
                id=m1,
                session_id=root,
                user_input_id=in1,
                parent_model_invocation_id=None,
                model="claude-sonnet-4-5",
                input_tokens=10,
                output_tokens=5,
                cache_read_tokens=0,
                cache_write_tokens=0,
                total_tokens=15,
                started_at=at + timedelta(minutes=2),
            ),
            ModelInvocation(
                id=child_m,
                session_id=child,
                user_input_id=child_in,
                parent_model_invocation_id=None,
                model="claude-haiku-4-5",
                input_tokens=70,
                output_tokens=7,
                cache_read_tokens=0,
                cache_write_tokens=0,
                total_tokens=77,
                started_at=at + timedelta(seconds=31),
            ),
        ],
        assistant_messages=[
            AssistantMessage(
                id=_id(),
                session_id=root,
                user_input_id=in0,
                model_invocation_id=m0,
                text="I will <em>edit</em> app.py",
                timestamp=at + timedelta(seconds=1),
            ),
        ],
        tool_uses=[
            ToolUse(
                id=edit,
                session_id=root,
                user_input_id=in0,
                model_invocation_id=m0,
                name="Edit",
                verb=ToolVerb.EDIT,
                input=raw(b'{"file_path": "/home/dev/web/app.py", "old": "<a>", "new": "<b>"}'),
                status=ToolStatus.OK,
                metadata=raw(b"{}"),
                timestamp=at + timedelta(seconds=2),
            ),
            ToolUse(
                id=task,
                session_id=root,
                user_input_id=in0,
                model_invocation_id=m0,
                name="Task",
                verb=ToolVerb.SPAWN_SUBAGENT,
                input=raw(b'{"prompt": "look around"}'),
                status=ToolStatus.OK,
                metadata=raw(b"{}"),
                timestamp=at + timedelta(seconds=3),
            ),
        ],
        tool_results=[
            ToolResult(
                id=_id(),
                tool_use_id=edit,
                session_id=root,
                user_input_id=in0,
                status=ToolStatus.OK,
                output_text=HOSTILE_OUTPUT,
                timestamp=at + timedelta(seconds=2),
            ),
            ToolResult(
                id=_id(),
                tool_use_id=task,
                session_id=root,
                user_input_id=in0,
                status=ToolStatus.OK,
                output_text="looked",
                timestamp=at + timedelta(seconds=40),
            ),
        ],
        file_touches=[
            FileTouch(
                id=_id(),
                tool_use_id=edit,
                user_input_id=in0,
                session_id=root,
                path="/home/dev/web/app.py",
                kind=TouchKind.EDIT,
                start_line=10,
                end_line=12,
                hunks=[Hunk(old_start=10, old_lines=1, new_start=10, new_lines=3)],
            ),
        ],
        vendor_ids=[
            VendorID(
                our_id=root,
                our_type=EntityType.SESSION,
                session_id=root,
                vendor="claude-code",
                vendor_id_kind="session_id",
                vendor_id=f"cc-{root}",
            ),
        ],
    )
    imported = ev.TranscriptImported(
        occurred_at=at,
        profile_id=profile,
        session_id=uuid.UUID(root),
        vendor="claude-code",
        graph=graph,
    )
    billed = ev.ModelCallCompleted(
        profile_id=profile,
        session_id=uuid.UUID(root),
        provider="anthropic",
        model="claude-sonnet-4-5",
        input_tokens=1200,
        output_tokens=300,
        tags=("vendor:claude-code",),
        occurred_at=at,
    )
    return imported, billed


def codex_session(profile: str, at: datetime) -> ev.TranscriptImported:
    root, in0 = _id(), _id()
    graph = Graph(
        sessions=[
            GraphSession(
                id=root,
                parent_session_id=None,
                spawned_by_tool_use_id=None,
                started_at=at,
                title="codex work",
                outcome=Outcome.ABANDONED,
            )
        ],
        user_inputs=[
            UserInput(
                id=in0,
                session_id=root,
                ordinal=0,
                text="globex secret prompt",
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
                vendor="codex",
                vendor_id_kind="session_id",
                vendor_id=f"cx-{root}",
            )
        ],
    )
    return ev.TranscriptImported(
        occurred_at=at,
        profile_id=profile,
        session_id=uuid.UUID(root),
        vendor="codex",
        graph=graph,
    )


@pytest.fixture
async def imports(console_db: Seeded, nats_url: str) -> dict[str, uuid.UUID]:
    acme, acme_call = claude_session("acme", "acme <i>refactor</i>", T0)
    older, older_call = claude_session("acme", "acme older", T0 - timedelta(days=1))
    globex = codex_session("globex", T0 + timedelta(minutes=1))
    await project(nats_url, console_db.dsn, [acme, older, globex, acme_call, older_call])
    return {"acme": acme.session_id, "older": older.session_id, "globex": globex.session_id}


async def get_json(client: aiohttp.ClientSession, url: str) -> Any:
    async with client.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_the_list_with_counts_filters_and_keyset_pages(
    console: RunningConsole, imports: dict[str, uuid.UUID]
) -> None:
    client, _ = await console.signed_in("olivia")
    page = await get_json(client, "/api/imported")
    top = [s for s in page["sessions"] if s["parent_session_id"] is None]
    assert [s["id"] for s in top] == [str(imports["globex"]), str(imports["acme"]), str(imports["older"])]
    acme = next(s for s in page["sessions"] if s["id"] == str(imports["acme"]))
    assert acme["vendor"] == "claude-code" and acme["outcome"] == "committed" and acme["profile_id"] == "acme"
    assert (acme["inputs"], acme["model_invocations"], acme["tool_uses"], acme["files_touched"]) == (2, 2, 2, 1)
    assert (acme["input_tokens"], acme["output_tokens"]) == (1210, 305)
    assert acme["working_dir"] == "/home/dev/web" and acme["url"] == f"/imported/{imports['acme']}"
    # Filters.
    codex = await get_json(client, "/api/imported?vendor=codex")
    assert [s["id"] for s in codex["sessions"]] == [str(imports["globex"])]
    committed = await get_json(client, "/api/imported?outcome=committed&profile=acme")
    assert {s["id"] for s in committed["sessions"]} == {str(imports["acme"]), str(imports["older"])}
    # Keyset pages cover every session once (two trees of two, one of one).
    seen: list[str] = []
    url = "/api/imported?limit=2"
    while True:
        page = await get_json(client, url)
        seen += [s["id"] for s in page["sessions"]]
        if page["next_cursor"] is None:
            break
        url = f"/api/imported?limit=2&cursor={page['next_cursor']}"
    assert len(seen) == len(set(seen)) == 5
    async with client.get("/api/imported?cursor=nonsense") as r:
        assert r.status == 422
    async with client.get("/imported?vendor=claude-code") as r:
        assert r.status == 200
        html = await r.text()
    assert "acme &lt;i&gt;refactor&lt;/i&gt;" in html and "<i>refactor" not in html and "codex work" not in html


async def test_a_session_with_inputs_invocations_tools_and_files(
    console: RunningConsole, imports: dict[str, uuid.UUID]
) -> None:
    client, _ = await console.signed_in("olivia")
    s = await get_json(client, f"/api/imported/{imports['acme']}")
    assert s["vendor"] == "claude-code" and s["vendor_ids"][0]["value"] == f"cc-{imports['acme']}"
    assert [i["ordinal"] for i in s["inputs"]] == [0, 1]
    first, second = s["inputs"]
    assert first["text"] == HOSTILE_PROMPT and second["interrupted"] and second["kind"] == "slash_command"
    [inv] = first["model_invocations"]
    assert (inv["model"], inv["input_tokens"], inv["output_tokens"], inv["cache_read_tokens"]) == (
        "claude-sonnet-4-5",
        1200,
        300,
        5000,
    )
    assert first["assistant_messages"][0]["text"] == "I will <em>edit</em> app.py"
    edit, task = first["tool_uses"]
    assert edit["name"] == "Edit" and edit["verb"] == "edit" and edit["input"]["file_path"] == "/home/dev/web/app.py"
    assert edit["result"]["status"] == "ok" and edit["result"]["output_text"] == HOSTILE_OUTPUT
    assert edit["files"] == [
        {
            "path": "/home/dev/web/app.py",
            "kind": "edit",
            "start_line": 10,
            "end_line": 12,
            "hunks": 1,
            "tool_use_id": edit["id"],
        }
    ]
    [child] = s["children"]
    assert task["spawned_session_id"] == child["id"] and child["spawned_by_tool_use_id"] == task["id"]
    assert s["totals"] == {
        "model_invocations": 2,
        "input_tokens": 1210,
        "output_tokens": 305,
        "cache_read_tokens": 5000,
        "cache_write_tokens": 100,
    }
    assert s["billed"]["calls"] == 1 and s["billed"]["unpriced_calls"] == 0 and float(s["billed"]["usd"]) > 0
    assert [f["path"] for f in s["files"]] == ["/home/dev/web/app.py"]
    # The subagent session on its own: its input and invocation, its parent, no bill of its own.
    sub = await get_json(client, f"/api/imported/{child['id']}")
    assert sub["parent_session_id"] == str(imports["acme"]) and sub["billed"] is None
    assert sub["inputs"][0]["model_invocations"][0]["model"] == "claude-haiku-4-5"

    async with client.get(f"/imported/{imports['acme']}") as r:
        assert r.status == 200
        html = await r.text()
    assert "<script>alert" not in html and '&lt;script&gt;alert("prompt")&lt;/script&gt;' in html
    assert "<img src=x" not in html and "&lt;img src=x" in html and "<em>edit" not in html
    assert "/home/dev/web/app.py" in html and "1 hunk(s)" in html and f"/imported/{child['id']}" in html
    async with client.get(f"/api/imported/{uuid.uuid4()}") as r:
        assert r.status == 404
    async with client.get(f"/imported/{uuid.uuid4()}") as r:
        assert r.status == 404


async def test_an_analyst_sees_its_profiles_imports_only(
    console: RunningConsole, imports: dict[str, uuid.UUID]
) -> None:
    client, _ = await console.signed_in("alice")
    page = await get_json(client, "/api/imported")
    assert {s["profile_id"] for s in page["sessions"]} == {"acme"}
    assert str(imports["globex"]) not in {s["id"] for s in page["sessions"]}
    # By URL and by API: as if it did not exist.
    for url in (f"/api/imported/{imports['globex']}", f"/imported/{imports['globex']}"):
        async with client.get(url) as r:
            assert r.status == 404, url
    async with client.get("/imported?vendor=codex") as r:
        assert "globex secret prompt" not in await r.text()
    # Its own profile's import it sees whole.
    s = await get_json(client, f"/api/imported/{imports['acme']}")
    assert len(s["inputs"]) == 2 and s["inputs"][0]["tool_uses"][0]["files"] and s["billed"]["calls"] == 1
    # The operator sees globex's.
    operator, _ = await console.signed_in("olivia")
    assert (await get_json(operator, f"/api/imported/{imports['globex']}"))["profile_id"] == "globex"
