"""Text PostgreSQL cannot store (U+0000) that the loop cannot refuse — tool output, a model's arguments
and answers — is stored escaped (`commonos.proto.text`): every row of the turn is there, nothing is
dead-lettered, and the original reads back exactly."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.journal_writer.service import serve, writer_projections, writer_schemas
from commonos.loop.approvals import FixedApprover
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import load_profile
from commonos.loop.providers import build_provider
from commonos.proto import events as ev
from commonos.proto.requests import ApprovalAnswer
from commonos.proto.subjects import EVENTS_ALL
from commonos.proto.text import unescape_nul, unescape_nul_json
from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import Settings
from tests.loop.helpers import of_type
from tests.support import wait_caught_up, wait_for_position

pytestmark = pytest.mark.slow

NUL_ARG = "nul\x00 ␀ ␛ \\u0000"
#: Every kind of text a model or a tool hands the loop, each with NUL (and the two symbols the escaping uses).
SCRIPT: dict[str, Any] = {
    "conversations": [
        {
            "match": "binary",
            "steps": [
                {
                    "text": "looking\x00␀",
                    "tool_calls": [
                        {
                            "id": "c\x001",
                            "name": "shell",
                            "args": {"command": r"printf 'a\000b\342\220\200c'", "k\x00": NUL_ARG},
                        },
                        {"name": "write_file", "args": {"path": "x.bin", "content": "a\x00b"}},
                        {"name": "memory", "args": {"action": "add", "content": "note\x00␀"}},
                        {"name": "delegate", "args": {"goal": "sub\x00goal ␛"}},
                        {"name": "no\x00such tool", "args": {"\x00": ["\x00", {"deep\x00": "\x00"}]}},
                    ],
                },
                {"text": "done\x00 ␀ ␛"},
            ],
        },
        {"match": "sub", "steps": [{"text": "child\x00answer"}]},
    ]
}
CONFIG = """
provider = "scripted"
model = "scripted-test"
max_delegation_depth = 1

[provider_options]
script = "script.json"

[approval]
timeout_s = 5
tools = { shell = "ask", write_file = "auto" }
"""


@contextlib.asynccontextmanager
async def writers(nats_url: str, dsn: str) -> AsyncIterator[None]:
    """The journal-writer process's consumers (core, graph, memory), in this process."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        serve(
            Settings(nats_url=nats_url, database_url=dsn, http_port=0),
            writer_projections(),
            writer_schemas(),
            "journal-writer",
            stop=stop,
        )
    )
    try:
        yield
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


async def rows(dsn: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


def builtins(value: Any) -> Any:
    """`value` as JSON reads back."""
    return json.loads(msgspec.json.encode(value))


async def test_a_turn_with_nul_everywhere_is_stored_whole(
    nc: Client, js: JetStreamContext, nats_url: str, database_url: str, tmp_path: Path
) -> None:
    await ensure_streams(js)
    folder = tmp_path / "profiles" / "demo"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(CONFIG)
    (folder / "script.json").write_text(json.dumps(SCRIPT))
    profile = load_profile(folder)
    loop = Loop(
        NatsJournal(js),
        {"demo": profile},
        {"demo": build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=FixedApprover(ApprovalAnswer(status=ev.ApprovalStatus.APPROVED, decided_by="cli:ann␀")),
    )
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="binary output, please"))
    assert (result.status, result.text) == (ev.TurnStatus.COMPLETED, "done\x00 ␀ ␛")
    events = await NatsJournal(js).events([EVENTS_ALL])
    [shell] = [t for t in of_type(events, ev.ToolCallRecorded) if t.name == "shell"]
    assert shell.result == "exit code 0\na\x00b␀c" and shell.args["k\x00"] == NUL_ARG
    last = (await js.stream_info("COS_EVENTS")).state.last_seq

    async with writers(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", last, timeout_s=30)
        await wait_caught_up(js, database_url, "memory-writer", timeout_s=30)
    assert await list_dead_letters(js) == []

    sessions = {r["id"]: r for r in await rows(database_url, "SELECT id, source, title FROM sessions")}
    assert {(s.session_id, s.source, s.title) for s in of_type(events, ev.SessionCreated)} == {
        (i, r["source"], unescape_nul(r["title"])) for i, r in sessions.items()
    }
    child = next(s for s in of_type(events, ev.SessionCreated) if s.parent_session_id is not None)
    assert sessions[child.session_id]["title"] == "sub␀goal ␛␛"

    messages = await rows(database_url, "SELECT id, content::text AS content FROM messages")
    appended = {m.message_id: m for m in of_type(events, ev.MessageAppended)}
    assert len(messages) == len(appended) == 10
    for row in messages:
        stored = json.loads(row["content"])
        assert unescape_nul_json(stored) == builtins(appended[row["id"]].content)

    calls = await rows(database_url, "SELECT id, call_id, name, args::text AS args, result FROM tool_calls")
    recorded = {t.tool_call_id: t for t in of_type(events, ev.ToolCallRecorded)}
    assert len(calls) == len(recorded) == 5
    for row in calls:
        event = recorded[row["id"]]
        assert (unescape_nul(row["call_id"]), unescape_nul(row["name"]), unescape_nul(row["result"])) == (
            event.call_id,
            event.name,
            event.result,
        )
        assert unescape_nul_json(json.loads(row["args"])) == builtins(event.args)
        assert "\x00" not in row["result"] and "\\u0000" not in row["args"].replace("\\\\", "")

    approvals = await rows(database_url, "SELECT tool_call_id, status, decided_by FROM approvals ORDER BY decided_by")
    assert [(a["tool_call_id"], a["status"], a["decided_by"]) for a in approvals] == [
        (shell.tool_call_id, "approved", "cli:ann␛␀"),
        (next(iter(t.tool_call_id for t in recorded.values() if t.name == "write_file")), "approved", "policy"),
    ]
    turns = await rows(database_url, "SELECT status FROM turns")
    assert [t["status"] for t in turns] == ["completed", "completed"]
    [memory] = await rows(database_url, "SELECT content FROM memory_entries")
    assert unescape_nul(memory["content"]) == "note\x00␀"
