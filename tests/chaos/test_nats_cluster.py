"""Faults on a three-node NATS cluster (streams at three replicas): kill the stream leader, then a second node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import nats
import pytest

from commonos.proto.events import MessageAppended
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.publisher import EventPublisher
from tests.chaos.cluster import NatsCluster
from tests.factories import event_stream
from tests.harness import PgServer
from tests.support import fresh_database, journal_writer, table_checksums, wait_for_position

pytestmark = pytest.mark.slow

RESUME_LIMIT_S = 10.0


async def wait_count(acked: list[float], n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(acked) < n:
        assert time.monotonic() < deadline, f"only {len(acked)} of {n} events acknowledged"
        await asyncio.sleep(0.02)


async def test_stream_leader_and_then_a_second_node_killed(
    tmp_path: Path, pg_server: PgServer, chaos_report: Callable[..., None]
) -> None:
    cluster = NatsCluster(tmp_path).start()
    try:
        await cluster.ready(replicas=3)
        dsn = await fresh_database(pg_server)
        events = list(event_stream(5000, seed=31))
        acked: list[float] = []
        #: When the publish of each acked event started: an ack the dead leader sent just before it died
        #: can be read after the kill, so only a publish begun after it shows that publishing resumed.
        started: list[float] = []

        async def publish() -> None:
            nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
            try:
                # the ack timeout the services use; a deadline past the loss of quorum below
                publisher = EventPublisher(nc.jetstream(), "urn:test", deadline_s=120.0)
                for e in events:
                    begun = time.monotonic()
                    await publisher.publish(e)
                    started.append(begun)
                    acked.append(time.monotonic())
            finally:
                await nc.close()

        async with journal_writer(cluster.url, dsn):
            publishing = asyncio.create_task(publish())
            await wait_count(acked, 1500)
            leader = await cluster.stream_leader()
            killed_at = time.monotonic()
            await asyncio.to_thread(cluster.node(leader).kill)  # publishing goes on meanwhile
            before = len(acked)
            await wait_count(acked, before + 200)
            resumed_after = next(a for s, a in zip(started, acked, strict=True) if s > killed_at) - killed_at
            assert resumed_after <= RESUME_LIMIT_S, f"publishing resumed {resumed_after:.1f}s after the leader died"

            await wait_count(acked, 3000)
            survivors = [n for n in cluster.nodes if n.running]
            second = survivors[0]
            second.kill()
            await asyncio.sleep(1.0)
            stalled_at = len(acked)
            await asyncio.sleep(3.0)
            assert len(acked) <= stalled_at + 1, "one node of three kept acknowledging without a quorum"

            for node in cluster.nodes:
                if not node.running:
                    node.start()
            await asyncio.wait_for(publishing, 180)
            nc = await nats.connect(servers=cluster.urls)
            try:
                js = nc.jetstream()
                info = await js.stream_info(EVENTS_STREAM)
                assert info.state.messages == len(events)  # every event stored once: retries were deduplicated
                last = info.state.last_seq
                await wait_for_position(dsn, "journal-writer", last, timeout_s=120)
            finally:
                await nc.close()

        sums = await table_checksums(dsn)
        assert sums["messages"][0] == sum(isinstance(e, MessageAppended) for e in events)
        reference = await fresh_database(pg_server)
        async with journal_writer(cluster.url, reference, name="reference"):
            await wait_for_position(reference, "reference", last, timeout_s=120)
        assert await table_checksums(reference) == sums
        chaos_report(
            published=len(events),
            stored=len(events),
            projected=sums["messages"][0],
            lost=0,
            duplicated=0,
            dead_lettered=0,
            recovery_s=resumed_after,
        )
    finally:
        cluster.stop()
