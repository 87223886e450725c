"""Deliveries lost in flight (a NATS leader change, a reconnect) never let the position skip an event.

JetStream would send lost deliveries again only after `ack_wait`, behind newer ones. A batch that
starts after such a hole must not be committed: the position would pass events never applied, and
they would be skipped as "already applied" when they come back.
"""

from __future__ import annotations

import nats

from commonos.journal_writer.service import writer_schemas
from commonos.journal_writer.store import JournalProjection
from commonos.runtime.consumer import BatchConsumer
from commonos.runtime.http import Health
from commonos.runtime.postgres import apply_schemas, connect, create_pool
from tests.factories import event_stream
from tests.harness import PgServer
from tests.support import fresh_database, journal_writer, position, publish_all, table_checksums, wait_for_position


async def test_a_batch_after_a_hole_is_not_committed_and_the_hole_is_applied_later(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    events = list(event_stream(200, seed=41))
    acks = await publish_all(nats_url, events)
    last = acks[-1].seq
    conn = await connect(database_url)
    await apply_schemas(conn, writer_schemas())
    await conn.close()

    nc = await nats.connect(nats_url)
    pool = await create_pool(database_url)
    try:
        js = nc.jetstream()
        consumer = BatchConsumer(js, pool, JournalProjection("holes"), Health())
        await consumer.load_position()
        await consumer.bind()
        sub = await js.pull_subscribe(
            "cos.events.>", durable="holes", stream="COS_EVENTS", config=consumer.consumer_config()
        )
        lost = await sub.fetch(50, timeout=5)  # delivered, then lost on the way
        after = await sub.fetch(50, timeout=5)
        assert [m.metadata.sequence.consumer for m in (lost[0], after[0])] == [1, 51]

        assert await consumer.process(after)
        assert consumer.gap, "the hole before the batch went unnoticed"
        assert await position(database_url, "holes") == 0, "the position passed events never applied"
    finally:
        await pool.close()
        await nc.close()

    # The writer restarts the cursor from the committed position: every event lands once.
    async with journal_writer(nats_url, database_url, name="holes"):
        await wait_for_position(database_url, "holes", last)
    reference = await fresh_database(pg_server)
    async with journal_writer(nats_url, reference, name="reference"):
        await wait_for_position(reference, "reference", last)
    assert await table_checksums(database_url) == await table_checksums(reference)
