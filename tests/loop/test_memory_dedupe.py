"""The memory tool keeps an entry once per profile and target: the demo's "Lives in Charleston", remembered at every
umbrella question, is one entry, whatever its case, spaces or full stop. Nothing a duplicate would be reaches the
stream, so memory_entries and a replay of the stream into an empty database hold the same one row."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.journal_writer.replay import replay
from commonos.journal_writer.service import serve, writer_projections, writer_schemas
from commonos.loop.approvals import FixedApprover
from commonos.loop.locks import MemorySessionLocks, NatsSessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import build_provider
from commonos.loop.tools import memory_key
from commonos.proto.events import MemoryChanged, MessageAppended, TurnStatus
from commonos.proto.messages import ToolResultMessage
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import Settings
from tests.harness import PgServer
from tests.loop.helpers import of_type, write_profile
from tests.support import InProcess, fresh_database, wait_caught_up

SCRIPT = """
[[conversations]]
[[conversations.steps]]
tool_calls = [
  { name = "memory", args = { action = "add", target = "user", content = "Lives in Charleston" } },
  { name = "memory", args = { action = "add", target = "user", content = "  lives in  CHARLESTON. " } },
  { name = "memory", args = { action = "add", target = "memory", content = "Lives in Charleston" } },
  { name = "memory", args = { action = "add", target = "user", content = "Likes tea" } },
  { name = "memory", args = { action = "replace", target = "user", match = "tea", content = "Lives in Charleston!" } },
]
[[conversations.steps]]
text = "noted"
"""

UMBRELLA = """
[[conversations]]
[[conversations.steps]]
tool_calls = [{ name = "memory", args = { action = "add", target = "user", content = "Lives in Charleston" } }]
[[conversations.steps]]
text = "Bring an umbrella."
"""


def test_what_makes_two_entries_the_same() -> None:
    assert memory_key("Lives in Charleston") == memory_key("  lives in\tCHARLESTON. ") == "lives in charleston"
    assert memory_key("Ｌｉｖｅｓ in Charleston!") == "lives in charleston"  # fullwidth letters (NFKC)
    assert memory_key("Lives in Charleston, SC") != memory_key("Lives in Charleston")


async def test_the_tool_adds_an_entry_once_and_refuses_a_replace_that_repeats_one(tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "profiles", "mem", script=SCRIPT)
    journal = MemoryJournal()
    loop = Loop(
        journal,
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=MemorySessionLocks(),
        approver=FixedApprover(None),
    )
    for _ in range(2):  # the same again, in another session
        result = await loop.run_turn(TurnRequest(profile_id="mem", text="remember"))
        assert result.status is TurnStatus.COMPLETED
    memory = await journal.load_memory("mem")
    assert (memory.user, memory.memory) == (("Lives in Charleston", "Likes tea"), ("Lives in Charleston",))
    changes = of_type(journal.events, MemoryChanged)
    assert [(c.target, c.op, c.position, c.content) for c in changes] == [
        ("user", "add", 0, "Lives in Charleston"),
        ("memory", "add", 0, "Lives in Charleston"),
        ("user", "add", 1, "Likes tea"),
    ]
    results = [m.content for m in of_type(journal.events, MessageAppended) if isinstance(m.content, ToolResultMessage)]
    assert results[1].content == "user entry 0 already says this: nothing added; now:\n0. Lives in Charleston"
    assert not results[1].is_error
    assert results[4].is_error and results[4].content.startswith(
        "user entry 0 already says this: remove entry 1 instead"
    )
    # The second session's adds changed nothing either.
    assert all("already says this" in r.content for r in results[5:9]), results[5:9]


async def memory_rows(dsn: str) -> list[tuple[str, str, int, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT profile_id, target, position, content FROM memory_entries ORDER BY profile_id, target, position"
        )
    finally:
        await conn.close()
    return [(r["profile_id"], r["target"], r["position"], r["content"]) for r in rows]


async def test_memory_entries_and_a_replay_hold_the_entry_once(
    nc: Client, js: JetStreamContext, nats_url: str, database_url: str, pg_server: PgServer, tmp_path: Path
) -> None:
    await ensure_streams(js)
    profile = write_profile(tmp_path / "profiles", "demo", script=UMBRELLA)
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=FixedApprover(None),
    )
    for _ in range(4):  # four umbrella questions, four sessions
        result = await loop.run_turn(TurnRequest(profile_id="demo", text="Do I need an umbrella?"))
        assert (result.status, result.text) == (TurnStatus.COMPLETED, "Bring an umbrella.")
    [change] = of_type(await NatsJournal(js).events([EVENTS_ALL]), MemoryChanged)
    assert (change.op, change.content) == ("add", "Lives in Charleston")

    settings = Settings(nats_url=nats_url, database_url=database_url, http_port=0)
    live = InProcess()
    live.task = asyncio.create_task(
        serve(settings, writer_projections(), writer_schemas(), "journal-writer", stop=live.stop)
    )
    watcher = await nats.connect(nats_url)
    try:
        await wait_caught_up(watcher.jetstream(), database_url, "memory-writer")
    finally:
        await watcher.close()
        assert await live.close() == 0
    want = [("demo", "user", 0, "Lives in Charleston")]
    assert await memory_rows(database_url) == want

    rebuilt = await fresh_database(pg_server)
    await replay(Settings(nats_url=nats_url, database_url=rebuilt))
    assert await memory_rows(rebuilt) == want
