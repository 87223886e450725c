"""Every event checked where it lands: updates that match nothing, headers that disagree with the body,
replays that go to the consumer that rejected the event, titles."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta, timezone

import asyncpg
import msgspec
import nats
import pytest
from nats.js import JetStreamContext

from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.messages import UserMessage
from commonos.proto.subjects import EVENTS_STREAM, subject_for
from commonos.runtime.dlq import list_dead_letters, replay_dead_letter
from commonos.runtime.nats import ensure_streams
from tests.factories import Clock, SessionBuilder
from tests.support import journal_writer, publish_all, wait_for_position

pytestmark = pytest.mark.slow


async def _raw(js: JetStreamContext, event: ev.Event, headers: dict[str, str] | None) -> int:
    ack = await js.publish(subject_for(event), ev.encode_event(event), headers=headers, stream=EVENTS_STREAM)
    return int(ack.seq)


async def _fetch(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _run_writer(nats_url: str, dsn: str, last: int) -> None:
    async with journal_writer(nats_url, dsn):
        await wait_for_position(dsn, "journal-writer", last, timeout_s=30)


async def test_a_turn_finished_before_its_start_is_a_dead_letter_and_a_replay_completes_it(
    nats_url: str, database_url: str
) -> None:
    """An UPDATE matching no row used to be acked: the turn stayed `running` forever, also after a replay."""
    s = SessionBuilder("default", Clock())
    s.create()
    turn = s.start_turn()
    s.message(turn, UserMessage(text="hi"))
    s.finish(turn)
    create, started, message, finished = s.events
    acks = await publish_all(nats_url, [create, finished])  # the finish overtook the start
    await _run_writer(nats_url, database_url, acks[-1].seq)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        [letter] = await list_dead_letters(js)
        assert letter.consumer == "journal-writer"
        assert letter.reason.startswith("rejected: ") and str(turn) in letter.reason
        more = await publish_all(nats_url, [started, message])
        replayed = await replay_dead_letter(js, letter)
        await _run_writer(nats_url, database_url, max(replayed, more[-1].seq))
    finally:
        await nc.close()
    [row] = await _fetch(database_url, "SELECT status, finished_at FROM turns WHERE id = $1", turn)
    assert row["status"] == "completed" and row["finished_at"] is not None


async def test_deactivating_messages_that_do_not_exist_is_a_dead_letter(nats_url: str, database_url: str) -> None:
    s = SessionBuilder("default", Clock())
    s.create()
    turn = s.start_turn()
    kept = s.message(turn, UserMessage(text="stays"))
    s.deactivate(uuid.uuid4())  # no such message
    s.deactivate(kept)  # a real one, applied
    acks = await publish_all(nats_url, s.events)
    await _run_writer(nats_url, database_url, acks[-1].seq)
    nc = await nats.connect(nats_url)
    try:
        [letter] = await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()
    assert "message_deactivated" in letter.subject and "does not hold" in letter.reason
    [row] = await _fetch(database_url, "SELECT active FROM messages WHERE id = $1", kept)
    assert row["active"] is False


async def test_a_memory_change_at_a_missing_position_is_a_dead_letter(nats_url: str, database_url: str) -> None:
    from commonos.journal_writer.memory import MemoryProjection
    from commonos.journal_writer.service import serve, writer_schemas
    from commonos.runtime.settings import Settings
    from tests.support import InProcess

    clock = Clock()
    session = uuid.uuid4()

    def change(op: ev.MemoryOp, position: int, content: str | None) -> ev.MemoryChanged:
        return ev.MemoryChanged(
            occurred_at=clock.tick(),
            profile_id="default",
            session_id=session,
            turn_id=uuid.uuid4(),
            target=ev.MemoryTarget.MEMORY,
            op=op,
            position=position,
            content=content,
        )

    changes = [
        change(ev.MemoryOp.ADD, 0, "likes tea"),
        change(ev.MemoryOp.REPLACE, 5, "nothing there"),
        change(ev.MemoryOp.REMOVE, 7, None),
        change(ev.MemoryOp.REPLACE, 0, "likes green tea"),
    ]
    acks = await publish_all(nats_url, changes)
    settings = Settings(nats_url=nats_url, database_url=database_url)
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, [MemoryProjection()], writer_schemas(), "memory-writer", stop=running.stop)
    )
    try:
        await wait_for_position(database_url, "memory-writer", acks[-1].seq)
    finally:
        await running.close()
    nc = await nats.connect(nats_url)
    try:
        letters = await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()
    assert sorted(d.stream_seq or 0 for d in letters) == [acks[1].seq, acks[2].seq]
    assert all("no memory entry at position" in d.reason for d in letters)
    rows = await _fetch(database_url, "SELECT position, content FROM memory_entries ORDER BY position")
    assert [(r["position"], r["content"]) for r in rows] == [(0, "likes green tea")]


async def test_a_child_session_keeps_its_goal_as_title(nats_url: str, database_url: str) -> None:
    clock = Clock()
    parent = SessionBuilder("default", clock)
    parent.create()
    goal = "Compare the three hosting offers in offers/ and write a one-page summary with prices per month"
    child = SessionBuilder("default", clock)
    child.create(title=goal, parent_session_id=parent.session_id, source="subagent")
    long_first = "x" * 200
    top = SessionBuilder("default", clock)
    top.create()
    t = top.start_turn()
    top.message(t, UserMessage(text=long_first))
    acks = await publish_all(nats_url, [*parent.events, *child.events, *top.events])
    await _run_writer(nats_url, database_url, acks[-1].seq)
    titles = {
        r["id"]: r["title"]
        for r in await _fetch(
            database_url,
            "SELECT id, title FROM sessions WHERE id = ANY($1::uuid[])",
            [
                child.session_id,
                top.session_id,
            ],
        )
    }
    assert titles[child.session_id] == goal, "a child keeps its goal"
    assert titles[top.session_id] == "x" * 60, "a title from the first message is its first 60 characters"


HEADER_CASES = (
    "none",
    "no specversion",
    "specversion 0.3",
    "no source",
    "subject of another session",
    "time of another moment",
    "source not UTF-8",
)


def headers_case(event: ev.Event, name: str) -> tuple[dict[str, str] | None, str]:
    """Headers of `event` broken in the way `name` says, and a fragment the dead letter's reason names."""
    good = event_headers(event)
    later = event.occurred_at.replace(year=event.occurred_at.year + 1).isoformat()
    cases: dict[str, tuple[dict[str, str] | None, str]] = {
        "none": (None, "no CloudEvents headers"),
        "no specversion": ({k: v for k, v in good.items() if k != "ce-specversion"}, "ce-specversion"),
        "specversion 0.3": ({**good, "ce-specversion": "0.3"}, "0.3"),
        "no source": ({k: v for k, v in good.items() if k != "ce-source"}, "ce-source"),
        "subject of another session": ({**good, "ce-subject": str(uuid.uuid4())}, "ce-subject"),
        "time of another moment": ({**good, "ce-time": later}, "ce-time"),
        "source not UTF-8": ({**good, "ce-source": "urn:x:%FF%FE"}, "ce-source"),
    }
    return cases[name]


async def test_headers_that_are_missing_or_disagree_with_the_body_are_dead_letters(
    nats_url: str, database_url: str
) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        expected: dict[int, str] = {}
        clock = Clock()
        for name in HEADER_CASES:
            (event,) = SessionBuilder("default", clock).create().events
            headers, fragment = headers_case(event, name)
            expected[await _raw(js, event, headers)] = fragment
        (good,) = SessionBuilder("default", clock).create().events
        last = await _raw(js, good, event_headers(good))
        await _run_writer(nats_url, database_url, last)
        letters = {d.stream_seq: d for d in await list_dead_letters(js)}
        assert set(letters) == set(expected)
        for seq, fragment in expected.items():
            reason = letters[seq].reason
            assert reason.startswith("bad headers") and fragment in reason, reason
        rows = await _fetch(database_url, "SELECT id FROM sessions")
        assert [r["id"] for r in rows] == [good.session_id]
    finally:
        await nc.close()


async def test_equivalent_time_spellings_are_accepted(nats_url: str, database_url: str) -> None:
    """`ce-time` is compared as an instant: another offset or precision of the same moment agrees."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        s = SessionBuilder("default", Clock())
        s.create()
        (event,) = s.events
        headers = event_headers(event)
        headers["ce-time"] = event.occurred_at.astimezone(timezone(timedelta(hours=-5))).isoformat()
        last = await _raw(js, event, headers)
        await _run_writer(nats_url, database_url, last)
        assert await list_dead_letters(js) == []
    finally:
        await nc.close()


async def test_a_replay_goes_only_to_the_consumer_that_rejected_the_event(nats_url: str, database_url: str) -> None:
    """An undecodable model call is dead-lettered by the journal-writer and by billing; replaying both
    letters used to make four new ones. Each replay now reaches only the consumer named in its letter."""
    from tests.billing.support import billing

    s = SessionBuilder("default", Clock())
    s.create()
    turn = s.start_turn()
    s.model_call(turn)
    call = s.events[-1]
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        broken = msgspec.json.encode({**msgspec.json.decode(ev.encode_event(call)), "input_tokens": "many"})
        ack = await js.publish(subject_for(call), broken, headers=event_headers(call), stream=EVENTS_STREAM)
        async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
            await wait_for_position(database_url, "journal-writer", ack.seq)
            await wait_for_position(database_url, "billing", ack.seq, table="billing_positions")
            letters = await list_dead_letters(js)
            assert sorted(d.consumer for d in letters) == ["billing", "journal-writer"]
            seqs = [await replay_dead_letter(js, d) for d in letters]
            await wait_for_position(database_url, "journal-writer", max(seqs))
            await wait_for_position(database_url, "billing", max(seqs), table="billing_positions")
            again = await list_dead_letters(js)
        assert sorted(d.consumer for d in again) == ["billing", "journal-writer"], "one new letter each, not four"
        assert {d.stream_seq for d in again} == set(seqs)
    finally:
        await nc.close()


async def test_events_of_another_profile_cannot_change_a_session(nats_url: str, database_url: str) -> None:
    """Events published under profile `evil` for a session of `acme` used to insert a turn and a message
    into acme's session, finish acme's running turn as failed and record an approval on it; acme's own
    message with the same seq was then dead-lettered. Each is now a `profile_mismatch` dead letter."""
    clock = Clock()
    acme = SessionBuilder("acme", clock)
    acme.create()
    turn = acme.start_turn()
    acme.message(turn, UserMessage(text="hello from acme"))
    evil = SessionBuilder("evil", clock, session_id=acme.session_id)
    evil.create()  # the same session id, claimed by another profile
    evil_turn = evil.start_turn()
    evil.seq = 1
    evil.message(turn, UserMessage(text="injected"))
    evil.finish(turn, ev.TurnStatus.FAILED, "injected")
    evil.events.append(
        ev.ApprovalDecided(
            profile_id="evil",
            session_id=acme.session_id,
            turn_id=turn,
            tool_call_id=uuid.uuid4(),
            call_id="c1",
            status=ev.ApprovalStatus.APPROVED,
            decided_at=clock.tick(),
            decided_by="evil",
        )
    )
    genuine = SessionBuilder("acme", clock, session_id=acme.session_id, seq=1)
    genuine.message(turn, UserMessage(text="acme's second message"))
    genuine.finish(turn)
    acks = await publish_all(nats_url, [*acme.events, *evil.events, *genuine.events])
    await _run_writer(nats_url, database_url, acks[-1].seq)
    nc = await nats.connect(nats_url)
    try:
        letters = await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()
    assert len(letters) == len(evil.events)
    assert all(d.reason.startswith("profile_mismatch: ") and "'acme'" in d.reason for d in letters), [
        d.reason for d in letters
    ]
    [session] = await _fetch(database_url, "SELECT profile_id FROM sessions WHERE id = $1", acme.session_id)
    assert session["profile_id"] == "acme"
    turns = await _fetch(database_url, "SELECT id, status FROM turns WHERE session_id = $1", acme.session_id)
    assert [(t["id"], t["status"]) for t in turns] == [(turn, "completed")]
    assert evil_turn not in {t["id"] for t in turns}
    messages = await _fetch(database_url, "SELECT seq, content FROM messages ORDER BY seq")
    assert [m["seq"] for m in messages] == [1, 2] and "acme's second" in messages[1]["content"]
    assert await _fetch(database_url, "SELECT * FROM approvals") == []


async def test_billing_and_memory_refuse_events_of_another_profile(nats_url: str, database_url: str) -> None:
    """A model call or memory change published under `evil` for a session of `acme` is a profile_mismatch
    dead letter; a session nobody created in the stream (imported work) belongs to the first profile naming it."""
    from commonos.journal_writer.memory import MemoryProjection
    from commonos.journal_writer.service import serve, writer_schemas
    from commonos.runtime.settings import Settings
    from tests.billing.support import billing
    from tests.support import InProcess

    clock = Clock()
    acme = SessionBuilder("acme", clock).create()
    turn = acme.start_turn()
    acme.model_call(turn)
    evil = SessionBuilder("evil", clock, session_id=acme.session_id)
    evil.model_call(turn)
    imported = SessionBuilder("codex", clock)  # no session_created: its first model call names the owner
    imported.model_call(uuid.uuid4())
    thief = SessionBuilder("evil", clock, session_id=imported.session_id)
    thief.model_call(uuid.uuid4())

    def memory(profile: str) -> ev.MemoryChanged:
        return ev.MemoryChanged(
            occurred_at=clock.tick(),
            profile_id=profile,
            session_id=acme.session_id,
            turn_id=turn,
            target=ev.MemoryTarget.MEMORY,
            op=ev.MemoryOp.ADD,
            position=0,
            content=f"from {profile}",
        )

    stolen_memory = memory("evil")
    stream = [*acme.events, memory("acme"), *evil.events, stolen_memory, *imported.events, *thief.events]
    acks = await publish_all(nats_url, stream)
    last_memory = acks[stream.index(stolen_memory)].seq
    settings = Settings(nats_url=nats_url, database_url=database_url)
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, [MemoryProjection()], writer_schemas(), "memory-writer", stop=running.stop)
    )
    try:
        async with billing(nats_url, database_url):
            await wait_for_position(database_url, "billing", acks[-1].seq, table="billing_positions")
            await wait_for_position(database_url, "memory-writer", last_memory)
    finally:
        await running.close()
    nc = await nats.connect(nats_url)
    try:
        letters = await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()
    by_consumer = sorted((d.consumer, d.subject.rsplit(".", 1)[-1]) for d in letters)
    assert by_consumer == [
        ("billing", "model_call_completed"),
        ("billing", "model_call_completed"),
        ("memory-writer", "memory_changed"),
    ]
    assert all(d.reason.startswith("profile_mismatch: ") for d in letters)
    calls = await _fetch(database_url, "SELECT profile_id, session_id FROM model_calls ORDER BY profile_id")
    assert [(c["profile_id"], c["session_id"]) for c in calls] == [
        ("acme", acme.session_id),
        ("codex", imported.session_id),
    ]
    entries = await _fetch(database_url, "SELECT profile_id, content FROM memory_entries")
    assert [(e["profile_id"], e["content"]) for e in entries] == [("acme", "from acme")]


async def test_an_imported_session_belongs_to_the_profile_that_imported_it(nats_url: str, database_url: str) -> None:
    """A transcript part under profile `evil` naming a session that `claude-code` imported is a profile_mismatch
    dead letter; graph.sessions says who owns each session."""
    from commonos.journal_writer.service import serve, writer_schemas
    from commonos.proto.graph import Graph, Outcome, Session
    from commonos.runtime.settings import Settings
    from tests.support import InProcess

    root = str(uuid.uuid4())

    def part(profile: str, title: str) -> ev.TranscriptImported:
        graph = Graph(
            sessions=[
                Session(
                    id=root, parent_session_id=None, spawned_by_tool_use_id=None, outcome=Outcome.UNKNOWN, title=title
                )
            ]
        )
        return ev.TranscriptImported(
            occurred_at=Clock().tick(),
            profile_id=profile,
            session_id=uuid.UUID(root),
            vendor="claude-code",
            graph=graph,
        )

    acks = await publish_all(nats_url, [part("claude-code", "mine"), part("evil", "stolen")])
    from commonos.journal_writer.graph_projection import GraphProjection

    running = InProcess()
    running.task = asyncio.create_task(
        serve(
            Settings(nats_url=nats_url, database_url=database_url),
            [GraphProjection()],
            writer_schemas(),
            "graph-writer",
            stop=running.stop,
        )
    )
    try:
        await wait_for_position(database_url, "graph-writer", acks[-1].seq, table="graph.positions")
    finally:
        await running.close()
    nc = await nats.connect(nats_url)
    try:
        [letter] = await list_dead_letters(nc.jetstream())
    finally:
        await nc.close()
    assert letter.reason.startswith("profile_mismatch: ") and "'claude-code'" in letter.reason
    [row] = await _fetch(database_url, "SELECT profile_id, title FROM graph.sessions")
    assert (row["profile_id"], row["title"]) == ("claude-code", "mine")
