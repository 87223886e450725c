"""Two journal-writer instances partitioned by session give the same tables as one."""

from __future__ import annotations

import nats
from prometheus_client import REGISTRY

from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.postgres import connect
from tests.factories import event_stream
from tests.harness import PgServer
from tests.support import fresh_database, journal_writer, publish_all, table_checksums, wait_for_position


def applied(consumer: str) -> float:
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if (
                sample.name == "cos_consumer_events_total"
                and sample.labels.get("consumer") == consumer
                and sample.labels.get("outcome") == "applied"
            ):
                total += sample.value
    return total


async def test_two_partitioned_writers_equal_one(nats_url: str, database_url: str, pg_server: PgServer) -> None:
    events = list(event_stream(8000, seed=21))
    acks = await publish_all(nats_url, events)
    last = acks[-1].seq

    async with (
        journal_writer(nats_url, database_url, name="jw-p0-of-2", partitions=2, partition=0),
        journal_writer(nats_url, database_url, name="jw-p1-of-2", partitions=2, partition=1),
    ):
        await wait_for_position(database_url, "jw-p0-of-2", last, timeout_s=120)
        await wait_for_position(database_url, "jw-p1-of-2", last, timeout_s=120)

    single = await fresh_database(pg_server)
    async with journal_writer(nats_url, single, name="single"):
        await wait_for_position(single, "single", last, timeout_s=120)

    assert await table_checksums(database_url) == await table_checksums(single)
    # Both instances did real work, and together exactly the whole stream.
    p0, p1 = applied("jw-p0-of-2"), applied("jw-p1-of-2")
    assert p0 > len(events) / 4 and p1 > len(events) / 4
    assert p0 + p1 == len(events)

    conn = await connect(database_url)
    try:
        gaps = await conn.fetchval(
            "SELECT count(*) FROM (SELECT session_id, count(*) AS n, max(seq) AS top, min(seq) AS bottom "
            "FROM messages GROUP BY session_id) s WHERE n <> top OR bottom <> 1"
        )
        assert gaps == 0
    finally:
        await conn.close()
    nc = await nats.connect(nats_url)
    try:
        assert await list_dead_letters(nc.jetstream()) == []  # no session was ever applied out of order
    finally:
        await nc.close()
