"""`cos replay`: rebuild the core projection from the stream into empty tables.

The event log is the source of truth; the tables are a projection that can be dropped and rebuilt
with an identical result. Replay reads the whole stream through an ephemeral consumer and applies
it with the live writer's own projection and batching. Events that the live writer dead-lettered
are skipped again (they are already in COS_DLQ). At the end the live writer's position is set to
the last replayed event, so a writer started afterwards continues from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from commonos.journal_writer.schema import CORE_TABLES
from commonos.journal_writer.service import writer_schemas
from commonos.journal_writer.store import JournalProjection
from commonos.proto.subjects import EVENTS_ALL, EVENTS_STREAM
from commonos.runtime import nats as cos_nats
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions
from commonos.runtime.http import Health
from commonos.runtime.postgres import apply_schemas, connect, create_pool
from commonos.runtime.settings import Settings


class ReplayError(RuntimeError):
    """Replay refused or failed; the message says why."""


@dataclass(frozen=True)
class ReplayResult:
    applied: int
    skipped: int
    last_seq: int
    seconds: float

    @property
    def rate(self) -> float:
        return (self.applied + self.skipped) / self.seconds if self.seconds > 0 else 0.0


async def _prepare(dsn: str, truncate: bool) -> None:
    conn = await connect(dsn)
    try:
        await apply_schemas(conn, writer_schemas())
        counts = {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in CORE_TABLES}
        if any(counts.values()):
            if not truncate:
                filled = ", ".join(f"{t} ({n} rows)" for t, n in counts.items() if n)
                raise ReplayError(f"the tables are not empty: {filled}; pass --truncate to empty them first")
            await conn.execute(f"TRUNCATE {', '.join(CORE_TABLES)} CASCADE")
        await conn.execute("DELETE FROM projection_positions WHERE consumer = $1", JournalProjection().name)
    finally:
        await conn.close()


async def replay(
    settings: Settings,
    *,
    truncate: bool = False,
    batch_size: int = 1000,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Apply every event of COS_EVENTS to the core tables of `settings.database_url`."""
    _, dsn = settings.require_urls()
    await _prepare(dsn, truncate)
    nc = await cos_nats.connect(settings, "cos-replay")
    pool: asyncpg.Pool | None = None
    started = time.perf_counter()
    try:
        js = nc.jetstream()
        info = await js.stream_info(EVENTS_STREAM)
        last = info.state.last_seq
        total = info.state.messages
        pool = await create_pool(dsn, min_size=1, max_size=2)
        consumer = BatchConsumer(
            js, pool, JournalProjection(), Health(), ConsumerOptions(batch_size=batch_size, dead_letters=False)
        )
        if total == 0:
            return ReplayResult(0, 0, 0, time.perf_counter() - started)
        sub = await js.pull_subscribe(
            EVENTS_ALL,
            stream=EVENTS_STREAM,
            config=ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                max_ack_pending=-1,
                inactive_threshold=60.0,
            ),
        )
        done_seq = 0
        seen = 0
        while done_seq < last:
            try:
                msgs = await sub.fetch(batch_size, timeout=5)
            except nats.errors.TimeoutError:
                raise ReplayError(f"the stream stopped delivering at seq {done_seq} of {last}") from None
            await consumer.process(msgs)
            done_seq = msgs[-1].metadata.sequence.stream
            seen += len(msgs)
            if on_progress is not None:
                on_progress(seen, total)
        await sub.unsubscribe()
        return ReplayResult(consumer.applied, consumer.rejected, done_seq, time.perf_counter() - started)
    finally:
        if pool is not None:
            await pool.close()
        await nc.close()
