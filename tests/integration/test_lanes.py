"""A projection reading several kinds of events gets one single-filter consumer per kind, merged in stream order.

nats-server serves a consumer with several filter subjects about thirty times slower than one with a
single filter on a stream with one subject per session (`python -m bench.filters`), which made billing
and the plugin projections several times slower once they also read session creations and profile
deletions. The merge must still hand out every event in stream order, from a backlog and live.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any, cast

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.billing.projection import BillingProjection
from commonos.journal_writer.graph_projection import GraphProjection
from commonos.journal_writer.memory import MemoryProjection
from commonos.journal_writer.service import writer_schemas
from commonos.proto import events as ev
from commonos.proto.events import NO_SESSION
from commonos.proto.subjects import EVENTS_STREAM, MODEL_CALLS_FILTER, PROFILES_FILTER, SESSIONS_CREATED_FILTER
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions
from commonos.runtime.http import Health
from commonos.runtime.lanes import Lane, MergedFetcher
from commonos.runtime.nats import ensure_streams
from commonos.runtime.postgres import apply_schemas, connect, create_pool
from commonos.runtime.projection import Projection
from commonos.runtime.publisher import EventPublisher
from tests.support import wait_for_position

FILTERS = (MODEL_CALLS_FILTER, SESSIONS_CREATED_FILTER, PROFILES_FILTER)
KINDS = ("session_created", "turn_started", "message_appended", "model_call_completed", "turn_finished")


def _subject(rng: random.Random, sessions: list[uuid.UUID]) -> str:
    if rng.random() < 0.03:
        # Mostly profile-level events; a few (poison) that match two lanes' filters at once.
        kinds = ["profile_deleted", "profile_upserted", "profile_upserted", "session_created", "model_call_completed"]
        return f"cos.events.demo.{NO_SESSION}.{rng.choice(kinds)}"
    return f"cos.events.demo.{rng.choice(sessions)}.{rng.choice(KINDS)}"


def _matches(subject: str) -> bool:
    tokens = subject.split(".")
    return tokens[4] in ("model_call_completed", "session_created") or tokens[3] == str(NO_SESSION)


class Reads(Projection):
    """A projection that reads `filter_subjects` and writes nothing (only its consumers are looked at)."""

    position_table = "projection_positions"
    tables = ()

    def __init__(self, name: str, filter_subjects: tuple[str, ...]) -> None:
        self.name = name
        self.filter_subjects = filter_subjects

    async def apply(self, conn: Any, events: Any) -> None:
        raise AssertionError("not applied here")


async def _lanes(js: JetStreamContext, name: str) -> list[Lane]:
    consumer = BatchConsumer(js, cast(Any, None), Reads(name, FILTERS), Health())
    for lane in consumer.lanes:
        await js.add_consumer(EVENTS_STREAM, consumer.consumer_config(lane))
    return consumer.lanes


async def _drain(fetcher: MergedFetcher, want: int, timeout_s: float = 30.0) -> list[tuple[int, str]]:
    """What the lanes hand out, each event once (one matching two lanes' filters comes out twice in a row)."""
    got: list[tuple[int, str]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(got) < want and loop.time() < deadline:
        for msg in await fetcher.fetch(timeout_s=0.5, linger_s=0.005):
            seq = msg.metadata.sequence.stream or 0
            if not got or got[-1][0] != seq:
                got.append((seq, msg.subject))
            await msg.ack()
    return got


async def test_a_backlog_comes_out_of_the_lanes_whole_and_in_stream_order(nc: Client, js: JetStreamContext) -> None:
    await ensure_streams(js)
    rng = random.Random(5)
    sessions = [uuid.uuid4() for _ in range(200)]
    stored = []
    for _ in range(3000):
        subject = _subject(rng, sessions)
        ack = await js.publish(subject, b"{}")
        stored.append((ack.seq, subject))
    expected = [s for s in stored if _matches(s[1])]

    fetcher = await MergedFetcher(nc, js, await _lanes(js, "backlog"), batch=100).start()
    try:
        got = await _drain(fetcher, len(expected))
    finally:
        await fetcher.stop()
    assert got == expected


async def test_events_published_while_the_lanes_are_read_come_out_in_stream_order(
    nc: Client, js: JetStreamContext, nats_url: str
) -> None:
    await ensure_streams(js)
    fetcher = await MergedFetcher(nc, js, await _lanes(js, "live"), batch=50).start()
    rng = random.Random(11)
    sessions = [uuid.uuid4() for _ in range(20)]
    stored: list[tuple[int, str]] = []

    async def publish() -> None:
        publisher = await nats.connect(nats_url)
        try:
            pjs = publisher.jetstream()
            for i in range(1500):
                subject = _subject(rng, sessions)
                ack = await pjs.publish(subject, b"{}")
                stored.append((ack.seq, subject))
                if i % 50 == 0:
                    await asyncio.sleep(rng.random() * 0.02)
        finally:
            await publisher.close()

    try:
        task = asyncio.create_task(publish())
        got: list[tuple[int, str]] = []
        while not task.done() or len(got) < sum(1 for s in stored if _matches(s[1])):
            batch = await _drain(fetcher, 1, timeout_s=1.0)
            got += batch
            if task.done() and not batch:
                break
        await task
    finally:
        await fetcher.stop()
    assert got == [s for s in stored if _matches(s[1])]


@pytest.mark.parametrize("projection", [BillingProjection, MemoryProjection, GraphProjection], ids=lambda p: p.__name__)
async def test_no_consumer_of_a_projection_has_several_filters(
    js: JetStreamContext, projection: type[Projection]
) -> None:
    await ensure_streams(js)
    reads = Reads(projection.__name__.lower(), projection.filter_subjects)
    consumer = BatchConsumer(js, cast(Any, None), reads, Health())
    assert len(projection.filter_subjects) > 1
    await consumer.bind()
    found = [c.config for c in await js.consumers_info(EVENTS_STREAM) if c.name.startswith(reads.name)]
    several = [c.durable_name for c in found if c.filter_subjects]
    assert not several, f"consumers with several filter subjects: {several}"
    assert sorted(str(c.filter_subject) for c in found) == sorted(projection.filter_subjects)


class Records(Reads):
    """Keeps the ids of the events it is given, in order."""

    def __init__(self, name: str, filter_subjects: tuple[str, ...]) -> None:
        super().__init__(name, filter_subjects)
        self.applied: list[uuid.UUID] = []

    async def apply(self, conn: Any, events: Any) -> None:
        self.applied += [e.event_id for e in events]


async def test_an_event_matching_two_lanes_is_applied_once_and_opens_no_gap(
    nc: Client, js: JetStreamContext, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`session_created` under the no-session token matches the session-creation and the profile lanes."""
    await ensure_streams(js)
    conn = await connect(database_url)
    await apply_schemas(conn, writer_schemas())
    await conn.close()
    publisher = EventPublisher(js, "urn:test", nc=nc)
    events: list[ev.Event] = []
    for i in range(30):
        session = NO_SESSION if i % 7 == 3 else uuid.uuid4()
        events.append(ev.SessionCreated(profile_id="demo", session_id=session, source="test"))
        events.append(ev.ProfileUpserted(profile_id="demo"))
    last = 0
    for event in events:
        last = (await publisher.publish(event)).seq

    records = Records("twice", (SESSIONS_CREATED_FILTER, PROFILES_FILTER))
    pool = await create_pool(database_url)
    stop = asyncio.Event()
    consumer = BatchConsumer(js, pool, records, Health(), ConsumerOptions(batch_size=7), nc=nc)
    task = asyncio.create_task(consumer.run(stop))
    try:
        await wait_for_position(database_url, "twice", last)
    finally:
        stop.set()
        await task
        await pool.close()
    assert records.applied == [e.event_id for e in events]
    assert "lost in flight" not in caplog.text and "binding again" not in caplog.text
