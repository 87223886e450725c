"""The journal-writer under faults: SIGKILL mid-backlog, a PostgreSQL outage, poison events, rebuild."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import uuid
from pathlib import Path

import nats
import pytest

from commonos.journal_writer.replay import ReplayError, replay
from commonos.proto import events as ev
from commonos.proto.cloudevents import event_headers
from commonos.proto.messages import UserMessage
from commonos.proto.subjects import DLQ_STREAM, subject_for
from commonos.runtime.dlq import REASON, list_dead_letters
from commonos.runtime.settings import Settings
from tests.factories import Clock, SessionBuilder, event_stream
from tests.harness import PgServer
from tests.support import (
    ServiceProcess,
    fresh_database,
    http_status,
    journal_writer,
    position,
    publish_all,
    table_checksums,
    wait_for_position,
    wait_http,
)

pytestmark = pytest.mark.slow


def writer_process(nats_url: str, dsn: str, tmp_path: Path) -> ServiceProcess:
    return ServiceProcess(
        "commonos.journal_writer", {"COS_NATS_URL": nats_url, "COS_DATABASE_URL": dsn}, tmp_path / "journal-writer.log"
    )


async def test_sigkill_mid_backlog_loses_and_duplicates_nothing(
    nats_url: str, database_url: str, pg_server: PgServer, tmp_path: Path
) -> None:
    events = list(event_stream(50_000, seed=11))
    acks = await publish_all(nats_url, events)
    last = acks[-1].seq
    assert last == len(events) >= 50_000

    writer = writer_process(nats_url, database_url, tmp_path).start()
    try:
        target = random.Random(3).randint(10_000, 30_000)
        await wait_for_position(database_url, "journal-writer", target, timeout_s=120)
        writer.kill()
        killed_at = await position(database_url, "journal-writer")
        assert 0 < killed_at < last, f"killed at {killed_at}: not in the middle of the backlog"
        writer.start()
        await wait_for_position(database_url, "journal-writer", last, timeout_s=180)
    finally:
        writer.terminate()

    undisturbed = await fresh_database(pg_server)
    async with journal_writer(nats_url, undisturbed, name="undisturbed"):
        await wait_for_position(undisturbed, "undisturbed", last, timeout_s=180)
    got, want = await table_checksums(database_url), await table_checksums(undisturbed)
    assert got == want
    assert want["messages"][0] > 10_000

    # The event-sourcing promise: the same tables rebuilt from the stream alone.
    rebuilt = await fresh_database(pg_server)
    result = await replay(Settings(nats_url=nats_url, database_url=rebuilt))
    # Every event through the core pass, and each session_created through the memory pass too (its owners).
    deliveries = len(events) + sum(isinstance(e, ev.SessionCreated) for e in events)
    assert (result.applied, result.skipped, result.last_seq) == (deliveries, 0, last)
    assert await table_checksums(rebuilt) == want


async def test_postgres_outage_under_load(
    nats_url: str, database_url: str, pg_server: PgServer, tmp_path: Path
) -> None:
    writer = writer_process(nats_url, database_url, tmp_path).start()
    events = list(event_stream(12_000, seed=5))
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await publish_all(nats_url, events[:4000])
        await wait_http(writer.url + "/readyz", 200)
        await wait_for_position(database_url, "journal-writer", 4000)

        publisher = asyncio.create_task(publish_all(nats_url, events[4000:], window=200))
        pg_server.stop()
        await wait_http(writer.url + "/readyz", 503, timeout_s=15)
        floor_at_start = (await js.consumer_info("COS_EVENTS", "journal-writer")).ack_floor.stream_seq
        await asyncio.sleep(10)  # the outage itself: ten seconds of load with no database
        info = await js.consumer_info("COS_EVENTS", "journal-writer")
        assert info.ack_floor.stream_seq == floor_at_start, "events were acked while PostgreSQL was down"
        assert writer.alive and await http_status(writer.url + "/healthz") == 200
        acks = await publisher
        pg_server.start()

        await wait_for_position(database_url, "journal-writer", acks[-1].seq, timeout_s=120)
        await wait_http(writer.url + "/readyz", 200)
    finally:
        await nc.close()
        if writer.alive:
            assert writer.terminate() == 0

    reference = await fresh_database(pg_server)
    async with journal_writer(nats_url, reference, name="reference"):
        await wait_for_position(reference, "reference", len(events))
    assert await table_checksums(database_url) == await table_checksums(reference)


def malformed(rng: random.Random, n: int, clock: Clock) -> list[tuple[str, bytes, dict[str, str] | None, str]]:
    """`n` bad deliveries of different kinds: (subject, payload, headers, kind)."""
    sid = uuid.uuid4()
    good = ev.SessionCreated(profile_id="default", session_id=sid, source="cli", occurred_at=clock.tick())
    base = json.loads(ev.encode_event(good))
    out: list[tuple[str, bytes, dict[str, str] | None, str]] = []
    for i in range(n):
        kind = i % 7
        subject = f"cos.events.default.{sid}.session_created"
        headers: dict[str, str] | None = None
        if kind == 0:
            payload = rng.randbytes(rng.randint(1, 200))
        elif kind == 1:
            payload = json.dumps({**base, "type": "no_such_type", "event_id": str(uuid.uuid4())}).encode()
            subject = f"cos.events.default.{sid}.no_such_type"
        elif kind == 2:
            payload = json.dumps({**base, "source": 42, "event_id": str(uuid.uuid4())}).encode()
        elif kind == 3:  # a message for a session that does not exist
            e = ev.MessageAppended(
                profile_id="default",
                session_id=uuid.uuid4(),
                turn_id=uuid.uuid4(),
                seq=1,
                content=UserMessage(text="orphan"),
                occurred_at=clock.tick(),
            )
            payload, subject, headers = ev.encode_event(e), subject_for(e), event_headers(e)
        elif kind == 4:  # subject and body disagree
            payload = json.dumps({**base, "event_id": str(uuid.uuid4())}).encode()
            subject = f"cos.events.ops.{sid}.session_created"
        elif kind == 5:
            payload = b'{"type": "session_created", "profile_id": "default", "source": "\xff\xfe"}'
        else:
            payload = json.dumps({**base, "event_id": str(uuid.uuid4()), "tags": ["Bad Tag"]}).encode()
        out.append((subject, payload, headers, str(kind)))
    return out


async def test_malformed_events_go_to_the_dead_letter_stream(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    rng = random.Random(9)
    clock = Clock()
    valid = list(event_stream(3000, seed=2))
    # Also a duplicate seq with different content inside a real session.
    s = SessionBuilder("default", clock).create()
    turn = s.start_turn()
    s.message(turn, UserMessage(text="first"))
    s.seq = 0
    s.message(turn, UserMessage(text="a different first"))
    valid += s.events[:-1]
    dup_seq = s.events[-1]
    bad = malformed(rng, 999, clock)

    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await publish_all(nats_url, valid[:10])  # creates the streams
        slots = sorted(rng.sample(range(len(valid) + len(bad)), len(bad)))
        vi = bi = 0
        for i in range(len(valid) + len(bad)):
            if bi < len(bad) and slots[bi] == i:
                subject, payload, headers, _ = bad[bi]
                await js.publish(subject, payload, headers=headers)
                bi += 1
            else:
                e = valid[vi]
                await js.publish(subject_for(e), ev.encode_event(e), headers=event_headers(e))
                vi += 1
        last = await js.publish(subject_for(dup_seq), ev.encode_event(dup_seq), headers=event_headers(dup_seq))

        async with journal_writer(nats_url, database_url) as writer:
            await wait_for_position(database_url, "journal-writer", last.seq, timeout_s=120)
            assert writer.task is not None and not writer.task.done(), "the writer stopped"

        letters = await list_dead_letters(js)
        assert len(letters) == 1000
        assert all(d.reason and d.headers.get(REASON) for d in letters)
        reasons = " | ".join(d.reason for d in letters)
        for fragment in (
            "undecodable event",
            "rejected by PostgreSQL: ForeignKeyViolationError",
            "does not match",
            # messages is partitioned by month: the writer, not a constraint, keeps one message a (session, seq)
            "rejected: message_appended: session",
        ):
            assert fragment in reasons
        orphan = next(d for d in letters if "ForeignKey" in d.reason)
        assert orphan.headers["ce-type"] == "cos.message_appended.v1"  # original headers kept
        assert (await js.stream_info(DLQ_STREAM)).state.messages == 1000
    finally:
        await nc.close()

    reference = await fresh_database(pg_server)
    await publish_all(nats_url, [])
    async with journal_writer(nats_url, reference, name="reference"):
        await wait_for_position(reference, "reference", last.seq, timeout_s=120)
    # Every valid event projected (the reference read the same stream, with the same poison skipped)
    got = await table_checksums(database_url)
    assert got == await table_checksums(reference)
    assert got["messages"][0] == sum(isinstance(e, ev.MessageAppended) for e in valid)


async def test_dead_letters_can_be_replayed_after_a_fix(nats_url: str, database_url: str) -> None:
    clock = Clock()
    s = SessionBuilder("default", clock)
    s.create()
    turn = s.start_turn()
    s.message(turn, UserMessage(text="hello"))
    create, *rest = s.events
    acks = await publish_all(nats_url, rest)  # the session is missing: both events are poison
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            letters = await list_dead_letters(js)
            assert len(letters) == 2
            fixed = await publish_all(nats_url, [create])  # the fix: the missing session arrives
            await wait_for_position(database_url, "journal-writer", fixed[-1].seq)
            from commonos.runtime.dlq import replay_dead_letter

            for letter in letters:
                await replay_dead_letter(js, letter)
            assert await list_dead_letters(js) == []
            await wait_for_position(database_url, "journal-writer", fixed[-1].seq + 2)
        finally:
            await nc.close()
    counts = await table_checksums(database_url)
    assert counts["sessions"][0] == 1 and counts["turns"][0] == 1 and counts["messages"][0] == 1


async def test_replay_refuses_filled_tables(nats_url: str, database_url: str) -> None:
    events = list(event_stream(200, seed=1))
    acks = await publish_all(nats_url, events)
    async with journal_writer(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", acks[-1].seq)
    live = await table_checksums(database_url)
    settings = Settings(nats_url=nats_url, database_url=database_url)
    with pytest.raises(ReplayError, match="not empty"):
        await replay(settings)
    result = await replay(settings, truncate=True)
    assert result.applied == len(events) + sum(isinstance(e, ev.SessionCreated) for e in events)
    assert await table_checksums(database_url) == live


async def test_sigterm_stops_cleanly(nats_url: str, database_url: str, tmp_path: Path) -> None:
    await publish_all(nats_url, list(event_stream(20_000, seed=4)))
    writer = writer_process(nats_url, database_url, tmp_path).start()
    await wait_for_position(database_url, "journal-writer", 1000, timeout_s=60)
    assert writer.proc is not None
    writer.proc.send_signal(signal.SIGTERM)
    assert writer.proc.wait(15) == 0, writer.output()
    stopped_at = await position(database_url, "journal-writer")
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info("COS_EVENTS", "journal-writer")
        # Nothing acked beyond what was committed, nothing committed left un-acked for long.
        assert info.ack_floor.stream_seq <= stopped_at
    finally:
        await nc.close()


async def test_writer_reports_bad_configuration_in_one_line(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "commonos.journal_writer",
        env={
            **os.environ,
            "COS_NATS_URL": "nats://127.0.0.1:4222",
            "COS_DATABASE_URL": "postgresql://x",
            "COS_BATCH_SIZE": "lots",
        },
        stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert err.decode().strip() == "error: COS_BATCH_SIZE='lots' is not a whole number"
