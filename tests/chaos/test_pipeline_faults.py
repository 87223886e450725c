"""Faults under load on one nats-server: killed services, a database that refuses connections, a
restarted nats-server, a consumer a long way behind. After each, every event acknowledged by
JetStream is projected exactly once and every service is healthy again by itself."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
import nats
import pytest

from commonos.proto.events import Event, MessageAppended, ModelCallCompleted
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.embedded import NatsServer
from commonos.runtime.publisher import EventPublisher
from tests.chaos.conftest import intensity
from tests.factories import event_stream
from tests.harness import PgServer
from tests.support import (
    ServiceProcess,
    fresh_database,
    journal_writer,
    position,
    publish_all,
    table_checksums,
    wait_for_position,
    wait_http,
    wait_until,
)

pytestmark = pytest.mark.slow


async def dead_letters(nats_url: str) -> int:
    nc = await nats.connect(nats_url)
    try:
        return int((await nc.jetstream().stream_info("COS_DLQ")).state.messages)
    finally:
        await nc.close()


async def count(dsn: str, sql: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def expected_messages(events: list[Event]) -> int:
    return sum(isinstance(e, MessageAppended) for e in events)


async def test_writer_and_billing_killed_repeatedly(
    nats_url: str, database_url: str, tmp_path: Path, chaos_report: Callable[..., None]
) -> None:
    rng = random.Random(17)
    events = list(event_stream(intensity(20_000, 200_000), seed=17))
    acks = await publish_all(nats_url, events)
    last = acks[-1].seq
    env = {"COS_NATS_URL": nats_url, "COS_DATABASE_URL": database_url}
    writer = ServiceProcess("commonos.journal_writer", env, tmp_path / "writer.log").start()
    billing = ServiceProcess("commonos.billing", env, tmp_path / "billing.log").start()
    recoveries: list[float] = []
    try:
        for _ in range(intensity(2, 6)):
            target = await position(database_url, "journal-writer") + rng.randint(500, max(600, last // 10))
            await wait_for_position(database_url, "journal-writer", min(target, last - 1), timeout_s=120)
            writer.kill()
            billing.kill()
            restarted = time.monotonic()
            writer.start()
            billing.start()
            await wait_http(writer.url + "/readyz", 200)
            await wait_http(billing.url + "/readyz", 200)
            recoveries.append(time.monotonic() - restarted)
        await wait_for_position(database_url, "journal-writer", last, timeout_s=300)
        calls = sum(isinstance(e, ModelCallCompleted) for e in events)
        deadline = time.monotonic() + 120
        while await count(database_url, "SELECT count(*) FROM model_calls") < calls:
            assert time.monotonic() < deadline, billing.output()
            await asyncio.sleep(0.1)
    finally:
        for p in (writer, billing):
            if p.alive:
                assert p.terminate() == 0, p.output()
    rows = await count(database_url, "SELECT count(*) FROM messages")
    billed = await count(database_url, "SELECT count(*) FROM model_calls")
    distinct = await count(database_url, "SELECT count(DISTINCT event_id) FROM model_calls")
    assert rows == expected_messages(events)
    assert billed == distinct == calls
    chaos_report(
        published=len(events),
        stored=last,
        projected=rows + billed,
        lost=expected_messages(events) - rows + calls - billed,
        duplicated=billed - distinct,
        dead_lettered=await dead_letters(nats_url),
        recovery_s=max(recoveries),
    )


async def test_postgres_refuses_connections(
    nats_url: str, database_url: str, pg_server: PgServer, tmp_path: Path, chaos_report: Callable[..., None]
) -> None:
    events = list(event_stream(intensity(8_000, 40_000), seed=23))
    env = {"COS_NATS_URL": nats_url, "COS_DATABASE_URL": database_url}
    writer = ServiceProcess("commonos.journal_writer", env, tmp_path / "writer.log").start()
    database = database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(pg_server.admin_url)
    try:
        await publish_all(nats_url, events[:2000])
        await wait_for_position(database_url, "journal-writer", 2000)
        publishing = asyncio.create_task(publish_all(nats_url, events[2000:], window=200))
        await admin.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false')
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database)
        await wait_http(writer.url + "/readyz", 503, timeout_s=20)
        await asyncio.sleep(intensity(5, 30))
        assert writer.alive, writer.output()
        await admin.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true')
        allowed = time.monotonic()
        acks = await publishing
        await wait_for_position(database_url, "journal-writer", acks[-1].seq, timeout_s=180)
        recovery = time.monotonic() - allowed
        await wait_http(writer.url + "/readyz", 200)
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true')
        await admin.close()
        if writer.alive:
            assert writer.terminate() == 0, writer.output()
    reference = await fresh_database(pg_server)
    async with journal_writer(nats_url, reference, name="reference"):
        await wait_for_position(reference, "reference", len(events))
    got = await table_checksums(database_url)
    assert got == await table_checksums(reference)
    rows = got["messages"][0]
    assert rows == expected_messages(events)
    chaos_report(
        published=len(events),
        stored=len(events),
        projected=rows,
        lost=expected_messages(events) - rows,
        duplicated=0,
        dead_lettered=await dead_letters(nats_url),
        recovery_s=recovery,
    )


async def test_nats_server_restarted(
    nats_server: NatsServer, database_url: str, pg_server: PgServer, chaos_report: Callable[..., None]
) -> None:
    events = list(event_stream(intensity(6_000, 30_000), seed=29))
    acked: list[int] = []

    async def publish() -> None:
        nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        try:
            publisher = EventPublisher(nc.jetstream(), "urn:test", ack_timeout_s=2.0, deadline_s=120.0)
            for e in events:
                acked.append((await publisher.publish(e)).seq)
        finally:
            await nc.close()

    async with journal_writer(nats_server.url, database_url):
        publishing = asyncio.create_task(publish())
        await wait_until(lambda: len(acked) >= len(events) // 3, timeout_s=120)
        nats_server.kill()
        await asyncio.sleep(2)
        nats_server.start()
        restarted = time.monotonic()
        before = len(acked)
        await wait_until(lambda: len(acked) > before, timeout_s=60)
        recovery = time.monotonic() - restarted
        await asyncio.wait_for(publishing, 180)
        await wait_for_position(database_url, "journal-writer", max(acked), timeout_s=120)
    nc = await nats.connect(nats_server.url)
    try:
        stored = (await nc.jetstream().stream_info(EVENTS_STREAM)).state.messages
    finally:
        await nc.close()
    assert stored == len(events)
    reference = await fresh_database(pg_server)
    async with journal_writer(nats_server.url, reference, name="reference"):
        await wait_for_position(reference, "reference", max(acked))
    got = await table_checksums(database_url)
    assert got == await table_checksums(reference)
    assert got["messages"][0] == expected_messages(events)
    chaos_report(
        published=len(events),
        stored=stored,
        projected=got["messages"][0],
        lost=expected_messages(events) - got["messages"][0],
        duplicated=stored - len(events),
        dead_lettered=await dead_letters(nats_server.url),
        recovery_s=recovery,
    )


async def test_consumer_far_behind_catches_up(
    nats_url: str, database_url: str, tmp_path: Path, chaos_report: Callable[..., None]
) -> None:
    events = list(event_stream(intensity(100_000, 1_000_000), seed=37))
    acks = await publish_all(nats_url, events)
    env = {"COS_NATS_URL": nats_url, "COS_DATABASE_URL": database_url}
    writer = ServiceProcess("commonos.journal_writer", env, tmp_path / "writer.log").start()
    started = time.monotonic()
    try:
        await wait_for_position(database_url, "journal-writer", acks[-1].seq, timeout_s=intensity(300, 1200))
        caught_up = time.monotonic() - started
        await wait_http(writer.url + "/readyz", 200)
    finally:
        assert writer.terminate() == 0, writer.output()
    rows = await count(database_url, "SELECT count(*) FROM messages")
    assert rows == expected_messages(events)
    chaos_report(
        published=len(events),
        stored=acks[-1].seq,
        projected=rows,
        lost=expected_messages(events) - rows,
        duplicated=0,
        dead_lettered=await dead_letters(nats_url),
        recovery_s=caught_up,
    )
