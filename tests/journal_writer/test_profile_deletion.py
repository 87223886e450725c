"""Deleting a profile (`profile_deleted`) in every projection of the journal-writer: the core cascades, the
session graph and the Memory plugin drop the profile's rows, each remembers the deletion, events of the
profile arriving later are `profile_deleted` dead letters, a `profile_upserted` after it re-creates the
profile afresh, and `cos replay` rebuilds the same tables from the stream."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import asyncpg
import msgspec
import nats
import pytest

from commonos.journal_writer.graph_schema import GRAPH_TABLES
from commonos.journal_writer.replay import replay
from commonos.journal_writer.service import serve, writer_projections, writer_schemas
from commonos.proto import events as ev
from commonos.proto.graph import Graph, InputKind, InputOrigin, Outcome, Session, UserInput
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.runtime.dlq import DeadLetter, list_dead_letters
from commonos.runtime.settings import Settings
from tests.factories import Clock, SessionBuilder, conversation
from tests.harness import PgServer
from tests.support import (
    CORE_TABLES,
    InProcess,
    fresh_database,
    journal_writer,
    publish_all,
    table_checksums,
    wait_caught_up,
)

pytestmark = pytest.mark.slow

#: Every table a deletion touches, the deletion records included (memory_changes_applied is left out of
#: checksums: its applied_at says when a row was written, which a rebuild changes by design).
ALL_TABLES = (
    *CORE_TABLES,
    "profile_deletions",
    *GRAPH_TABLES,
    "graph.profile_deletions",
    "memory_entries",
    "memory_profile_deletions",
)


async def _fetch(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


@asynccontextmanager
async def _writer(nats_url: str, dsn: str, batch_size: int = 500) -> AsyncIterator[None]:
    """The whole journal-writer (core, session graph, memory), until each consumer has caught up."""
    settings = Settings(nats_url=nats_url, database_url=dsn, http_port=0, batch_size=batch_size)
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, writer_projections(), writer_schemas(), "journal-writer", stop=running.stop)
    )
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await wait_caught_up(js, dsn, "journal-writer")
        await wait_caught_up(js, dsn, "graph-writer", table="graph.positions")
        await wait_caught_up(js, dsn, "memory-writer")
        yield
    finally:
        await nc.close()
        assert await running.close() == 0


async def _project(nats_url: str, dsn: str, events: Sequence[ev.Event], batch_size: int = 500) -> None:
    await publish_all(nats_url, events)
    async with _writer(nats_url, dsn, batch_size):
        pass


async def _letters(nats_url: str) -> list[DeadLetter]:
    nc = await nats.connect(nats_url)
    try:
        return await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()


def _deleted(profile: str, clock: Clock, by: str = "cli:alice") -> ev.ProfileDeleted:
    return ev.ProfileDeleted(profile_id=profile, deleted_by=by, occurred_at=clock.tick())


def _upserted(profile: str, clock: Clock, *tags: str) -> ev.ProfileUpserted:
    return ev.ProfileUpserted(profile_id=profile, tags=tags, occurred_at=clock.tick())


def _memory(profile: str, clock: Clock, content: str, position: int = 0) -> ev.MemoryChanged:
    return ev.MemoryChanged(
        profile_id=profile,
        session_id=uuid.uuid4(),
        target=ev.MemoryTarget.MEMORY,
        op=ev.MemoryOp.ADD,
        position=position,
        content=content,
        occurred_at=clock.tick(),
    )


def _transcript(profile: str, clock: Clock, title: str) -> ev.TranscriptImported:
    root = str(uuid.uuid4())
    graph = Graph(
        sessions=[Session(id=root, parent_session_id=None, spawned_by_tool_use_id=None, outcome=Outcome.UNKNOWN)],
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
    )
    return ev.TranscriptImported(
        occurred_at=clock.tick(),
        profile_id=profile,
        session_id=uuid.UUID(root),
        vendor="claude-code",
        graph=graph,
    )


def _full_session(profile: str, clock: Clock) -> SessionBuilder:
    """A session with a turn, messages, a tool call that needed approval, and its end."""
    s = SessionBuilder(profile, clock, ("client:acme",)).create(title="work")
    turn = s.start_turn(snapshot={"system_prompt": "Be brief."})
    s.message(turn, UserMessage(text="list the files"))
    s.message(turn, AssistantMessage(tool_calls=(ToolCall(id="c1", name="shell", args={"cmd": "ls"}),)))
    s.tool_call(turn, "c1", "shell", {"cmd": "ls"}, "a b", risk=ev.Risk.HIGH, approval=ev.ApprovalStatus.APPROVED)
    s.message(turn, ToolResultMessage(call_id="c1", content="a b"))
    s.finish(turn)
    return s


async def _counts(dsn: str, profile: str) -> dict[str, int]:
    out = {}
    for table in ("profiles", "sessions", "turns", "messages", "tool_calls", "approvals", "memory_entries"):
        column = "id" if table == "profiles" else "profile_id"
        [row] = await _fetch(dsn, f"SELECT count(*) AS n FROM {table} WHERE {column} = $1", profile)
        out[table] = int(row["n"])
    [row] = await _fetch(dsn, "SELECT count(*) AS n FROM graph.sessions WHERE profile_id = $1", profile)
    out["graph.sessions"] = int(row["n"])
    [row] = await _fetch(dsn, "SELECT count(*) AS n FROM graph.user_inputs")
    out["graph.user_inputs (all)"] = int(row["n"])
    return out


async def test_deleting_a_profile_drops_its_rows_in_every_projection_and_later_events_are_dead_letters(
    nats_url: str, database_url: str
) -> None:
    clock = Clock()
    acme, globex = _full_session("acme", clock), _full_session("globex", clock)
    before = [
        _upserted("acme", clock, "client:acme"),
        _upserted("globex", clock, "client:globex"),
        *acme.events,
        *globex.events,
        _memory("acme", clock, "acme likes tea"),
        _memory("globex", clock, "globex likes coffee"),
        _transcript("acme", clock, "imported by acme"),
    ]
    deletion = _deleted("acme", clock)
    # What a loop that did not know yet, and an importer, publish after the deletion.
    acme.start_turn()
    late_session = SessionBuilder("acme", clock).create()
    late = [acme.events[-1], *late_session.events, _memory("acme", clock, "after"), _transcript("acme", clock, "x")]
    await _project(nats_url, database_url, [*before, deletion, *late])

    assert await _counts(database_url, "acme") == {
        "profiles": 0,
        "sessions": 0,
        "turns": 0,
        "messages": 0,
        "tool_calls": 0,
        "approvals": 0,
        "memory_entries": 0,
        "graph.sessions": 0,
        "graph.user_inputs (all)": 0,
    }
    kept = await _counts(database_url, "globex")
    assert kept == {
        "profiles": 1,
        "sessions": 1,
        "turns": 1,
        "messages": 3,
        "tool_calls": 1,
        "approvals": 1,
        "memory_entries": 1,
        "graph.sessions": 0,
        "graph.user_inputs (all)": 0,
    }
    for table in ("profile_deletions", "graph.profile_deletions", "memory_profile_deletions"):
        [row] = await _fetch(database_url, f"SELECT * FROM {table}")
        assert (row["profile_id"], row["deleted_by"], row["event_id"], row["recreated_at"]) == (
            "acme",
            "cli:alice",
            deletion.event_id,
            None,
        ), table
        assert row["deleted_at"] == deletion.occurred_at

    letters = {(d.consumer, d.subject.rsplit(".", 1)[-1]): d.reason for d in await _letters(nats_url)}
    assert sorted(letters) == [
        ("graph-writer", "transcript_imported"),
        ("journal-writer", "session_created"),
        ("journal-writer", "turn_started"),
        ("memory-writer", "memory_changed"),
    ]
    for reason in letters.values():
        assert reason.startswith("profile_deleted: "), reason
        assert "of profile 'acme': the profile was deleted at 2026-11-01T09:00" in reason and "by cli:alice" in reason


async def test_a_profile_upserted_after_the_deletion_recreates_the_profile_afresh(
    nats_url: str, database_url: str
) -> None:
    clock = Clock()
    old = _full_session("acme", clock)
    first = [_upserted("acme", clock, "client:acme"), *old.events, _memory("acme", clock, "old entry")]
    deletion = _deleted("acme", clock)
    recreated = _upserted("acme", clock, "client:acme", "team:new")
    new = SessionBuilder("acme", clock).create(title="fresh")
    turn = new.start_turn()
    new.message(turn, UserMessage(text="hello again"))
    new.finish(turn)
    # An event of the old session, sent again after the re-creation: its session is gone.
    old.start_turn()
    await _project(
        nats_url,
        database_url,
        [*first, deletion, recreated, *new.events, _memory("acme", clock, "new entry"), old.events[-1]],
    )

    [profile] = await _fetch(database_url, "SELECT * FROM profiles")
    assert (profile["id"], profile["tags"], profile["created_at"]) == (
        "acme",
        ["client:acme", "team:new"],
        recreated.occurred_at,
    )
    sessions = await _fetch(database_url, "SELECT id, title FROM sessions")
    assert [(s["id"], s["title"]) for s in sessions] == [(new.session_id, "fresh")]
    assert [r["content"] for r in await _fetch(database_url, "SELECT content FROM memory_entries")] == ["new entry"]
    for table in ("profile_deletions", "graph.profile_deletions", "memory_profile_deletions"):
        [row] = await _fetch(database_url, f"SELECT * FROM {table}")
        assert (row["event_id"], row["recreated_at"]) == (deletion.event_id, recreated.occurred_at), table

    [letter] = await _letters(nats_url)
    assert letter.consumer == "journal-writer" and letter.subject.endswith(f"{old.session_id}.turn_started")
    assert letter.reason.startswith("rejected by PostgreSQL: ForeignKeyViolationError"), letter.reason


async def test_an_unknown_profile_deleted_stays_deleted_and_a_second_deletion_changes_nothing(
    nats_url: str, database_url: str
) -> None:
    """Deleting a profile a projection holds nothing of is no dead letter: the deletion is recorded, so that
    what arrives later is refused. Deleting a deleted profile again changes nothing: the first deletion stands."""
    clock = Clock()
    first = _deleted("ghost", clock, by="cli:alice")
    second = _deleted("ghost", clock, by="cli:bob")
    later = SessionBuilder("ghost", clock).create()
    await _project(nats_url, database_url, [first, second, *later.events])

    assert await _fetch(database_url, "SELECT * FROM profiles") == []
    [row] = await _fetch(database_url, "SELECT * FROM profile_deletions")
    assert (row["deleted_by"], row["event_id"], row["deleted_at"]) == ("cli:alice", first.event_id, first.occurred_at)
    [letter] = await _letters(nats_url)
    assert letter.consumer == "journal-writer" and letter.reason.startswith("profile_deleted: session_created")


async def test_a_deletion_about_a_session_is_an_invariant_dead_letter_in_every_projection(
    nats_url: str, database_url: str
) -> None:
    clock = Clock()
    s = _full_session("acme", clock)
    bad = ev.ProfileDeleted(
        profile_id="acme", session_id=s.session_id, deleted_by="cli:alice", occurred_at=clock.tick()
    )
    await _project(nats_url, database_url, [_upserted("acme", clock), *s.events, bad])

    assert (await _counts(database_url, "acme"))["messages"] == 3
    letters = sorted((d.consumer, d.reason.split(":", 1)[0]) for d in await _letters(nats_url))
    # The core reads every event and dead-letters it; the plugin projections read the profile-level subjects
    # only (`cos.events.*.<no session>.*`), where a deletion about a session never is: none of them acts on it.
    assert letters == [("journal-writer", "invariant")]


def _story(seed: int, recreate: bool = True) -> list[ev.Event]:
    """Two profiles' conversations interleaved; `acme` deleted halfway, a loop that did not know goes on for a
    while, then `acme` is re-created and works again; memory changes and imports of both on the way."""
    rng = random.Random(seed)
    clock = Clock()
    out: list[ev.Event] = [_upserted("acme", clock, "client:acme"), _upserted("globex", clock, "client:globex")]

    def some(profile: str, n: int) -> list[ev.Event]:
        events: list[ev.Event] = []
        for i in range(n):
            events += conversation(rng, clock, profile_id=profile, turns=rng.randint(1, 3))
            events.append(_memory(profile, clock, f"{profile} {i}", position=rng.randint(0, 3)))
            if i % 4 == 0:
                events.append(_transcript(profile, clock, f"{profile} import {i}"))
        return events

    def mixed(a: list[ev.Event], b: list[ev.Event]) -> list[ev.Event]:
        merged = []
        while a or b:
            source = a if a and (not b or rng.random() < 0.5) else b
            merged.append(source.pop(0))
        return merged

    out += mixed(some("acme", 12), some("globex", 12))
    out.append(_deleted("acme", clock))
    out += mixed(some("acme", 3), some("globex", 3))
    if recreate:
        out.append(_upserted("acme", clock, "client:acme", "team:again"))
        out += mixed(some("acme", 6), some("globex", 6))
    return out


async def test_live_writers_of_any_batch_size_and_a_replay_build_the_same_tables(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    events = _story(seed=31)
    await publish_all(nats_url, events)
    async with _writer(nats_url, database_url, batch_size=500):
        pass
    want = await table_checksums(database_url, ALL_TABLES)
    # What the deletion left: acme's sessions are the re-created profile's only.
    recreated_at = next(e.occurred_at for e in events if isinstance(e, ev.ProfileUpserted) and len(e.tags) == 2)
    [row] = await _fetch(
        database_url,
        "SELECT count(*) AS n, min(created_at) AS first FROM sessions WHERE profile_id = 'acme'",
    )
    assert row["n"] > 0 and row["first"] > recreated_at
    assert want["messages"][0] > 0 and want["graph.sessions"][0] > 0 and want["memory_entries"][0] > 0

    one_by_one = await fresh_database(pg_server)
    async with _writer(nats_url, one_by_one, batch_size=1):
        pass
    assert await table_checksums(one_by_one, ALL_TABLES) == want

    rebuilt = await fresh_database(pg_server)
    result = await replay(Settings(nats_url=nats_url, database_url=rebuilt))
    assert result.skipped > 0  # the events of the deleted profile are dead letters again
    assert await table_checksums(rebuilt, ALL_TABLES) == want


async def test_writers_partitioned_by_session_build_the_tables_of_one_writer(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    """The deletion is applied by the partition of the profile's events; the others refuse the profile's events
    from then on (whatever their place in the stream: rows they wrote before are deleted with it), and no batch
    writes a profile's rows while its deletion commits."""
    tables = (*CORE_TABLES, "profile_deletions")
    await publish_all(nats_url, _story(seed=47, recreate=False))
    async with journal_writer(nats_url, database_url):
        nc = await nats.connect(nats_url)
        try:
            await wait_caught_up(nc.jetstream(), database_url, "journal-writer")
        finally:
            await nc.close()
    want = await table_checksums(database_url, tables)
    assert want["profile_deletions"][0] == 1 and want["sessions"][0] > 0

    split = await fresh_database(pg_server)
    names = [f"journal-writer-p{i}-of-2" for i in range(2)]
    async with (
        journal_writer(nats_url, split, name=names[0], partitions=2, partition=0, batch_size=50),
        journal_writer(nats_url, split, name=names[1], partitions=2, partition=1, batch_size=50),
    ):
        nc = await nats.connect(nats_url)
        try:
            for name in names:
                await wait_caught_up(nc.jetstream(), split, name)
        finally:
            await nc.close()
    assert await table_checksums(split, tables) == want
