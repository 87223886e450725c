"""`cos replay`: rebuild the journal-writer's projections from the stream into empty tables.

The event log is the source of truth; the tables are projections that can be dropped and rebuilt
with an identical result. Replay reads the stream through an ephemeral consumer per projection
(the core tables, the session graph, the Memory plugin's entries), all at once, and applies it with
the live writer's own projection code and batching. Events the live writer dead-lettered are skipped again
(they are already in COS_DLQ). Each projection's position ends at the last replayed event, so a
writer started afterwards continues from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from commonos.journal_writer.service import writer_projections, writer_schemas
from commonos.proto.errors import DataError
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime import registry
from commonos.runtime.cli_support import cli_connect, cli_database
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions, Projection
from commonos.runtime.fetcher import PullFetcher
from commonos.runtime.http import Health
from commonos.runtime.lanes import Lane, MergedFetcher
from commonos.runtime.postgres import apply_schemas, create_pool
from commonos.runtime.settings import Settings


class ReplayError(DataError):
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


async def _old_layout(conn: Any, tables: Sequence[str]) -> list[str]:
    """The tables of `tables` the declarations partition that exist as one table (made by an older version)."""
    partitioned = [t.name for t in registry.tables() if t.partition_by is not None and t.name in tables]
    rows = await conn.fetch(
        "SELECT t FROM unnest($1::text[]) AS t JOIN pg_class c ON c.oid = to_regclass(t) WHERE c.relkind = 'r'",
        partitioned,
    )
    return [r["t"] for r in rows]


async def _prepare(dsn: str, projections: Sequence[Projection], truncate: bool) -> None:
    async with cli_database(dsn) as conn:
        old = await _old_layout(conn, [t for p in projections for t in p.tables])
        if old:
            if not truncate:
                raise ReplayError(
                    f"{', '.join(old)}: made unpartitioned by an older version; pass --truncate to rebuild them in "
                    "the partitioned layout from the stream"
                )
            # The stream is the truth: the old tables go, the schema makes them partitioned, the replay fills them.
            await conn.execute(f"DROP TABLE {', '.join(old)} CASCADE")
        await apply_schemas(conn, writer_schemas())
        tables = [t for p in projections for t in p.tables]
        counts = {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in tables}
        if any(counts.values()):
            if not truncate:
                filled = ", ".join(f"{t} ({n} rows)" for t, n in counts.items() if n)
                raise ReplayError(f"the tables are not empty: {filled}; pass --truncate to empty them first")
            await conn.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
        for p in projections:
            await conn.execute(f"DELETE FROM {p.position_table} WHERE consumer = $1", p.name)


async def replay(
    settings: Settings,
    *,
    truncate: bool = False,
    batch_size: int = 1000,
    projections: Sequence[Projection] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Apply every event of COS_EVENTS to the tables of `settings.database_url`.

    The projections' passes run at the same time, each with its own consumer and connection, as the
    live writer's consumers do; the first pass to fail stops the others. `on_progress(done, total)`
    counts deliveries over all passes.
    """
    _, dsn = settings.require_urls()
    chosen = list(projections) if projections is not None else writer_projections()
    await _prepare(dsn, chosen, truncate)
    nc = await cli_connect(settings, "cos-replay")
    pool: asyncpg.Pool | None = None
    started = time.perf_counter()
    try:
        js = nc.jetstream()
        pool = await create_pool(dsn, min_size=1, max_size=len(chosen) + 1)
        consumers = [
            BatchConsumer(
                js,
                pool,
                p,
                Health(),
                ConsumerOptions(
                    batch_size=batch_size,
                    dead_letters=False,
                    filter_subjects=p.filter_subjects,
                ),
                nc=nc,
            )
            for p in chosen
        ]
        totals = await asyncio.gather(*(_pending(js, c) for c in consumers))
        progress = _Progress(sum(totals), on_progress)
        try:
            async with asyncio.TaskGroup() as group:
                passes = [
                    group.create_task(_pass(nc, js, c, expected, batch_size, progress))
                    for c, expected in zip(consumers, totals, strict=True)
                    if expected
                ]
        except ExceptionGroup as failed:
            first = failed.exceptions[0]
            raise first if isinstance(first, Exception) else failed from None
        last_seq = max((t.result() for t in passes), default=0)
        applied = sum(c.applied for c in consumers)
        skipped = sum(c.rejected for c in consumers)
        return ReplayResult(applied, skipped, last_seq, time.perf_counter() - started)
    finally:
        if pool is not None:
            await pool.close()
        await nc.close()


@dataclass
class _Progress:
    total: int
    report: Callable[[int, int], None] | None
    done: int = 0

    def add(self, n: int) -> None:
        self.done += n
        if self.report is not None:
            self.report(self.done, self.total)


async def _pending(js: JetStreamContext, consumer: BatchConsumer) -> int:
    """How many deliveries the stream holds on the consumer's subjects (a throwaway consumer per subject counts
    them; an event two subjects match counts twice, as it is delivered twice)."""
    total = 0
    for subject in consumer.options.filter_subjects:
        probe = await js.add_consumer(
            EVENTS_STREAM,
            ConsumerConfig(
                ack_policy=AckPolicy.NONE,
                deliver_policy=DeliverPolicy.ALL,
                inactive_threshold=5.0,
                filter_subject=subject,
            ),
        )
        await js.delete_consumer(EVENTS_STREAM, probe.name)
        total += probe.num_pending or 0
    return total


async def _pass(
    nc: NATS, js: JetStreamContext, consumer: BatchConsumer, expected: int, batch_size: int, progress: _Progress
) -> int:
    """Apply the `expected` deliveries of one projection; returns the last stream sequence applied.

    One consumer per subject, merged in stream order when there are several (`commonos.runtime.lanes`).
    """
    lanes = []
    for subject in consumer.options.filter_subjects:
        created = await js.add_consumer(
            EVENTS_STREAM,
            ConsumerConfig(
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                max_ack_pending=-1,
                inactive_threshold=60.0,
                filter_subject=subject,
            ),
        )
        lanes.append(Lane(created.name, subject))
    fetcher: PullFetcher | MergedFetcher
    if len(lanes) == 1:
        fetcher = await PullFetcher(nc, EVENTS_STREAM, lanes[0].durable, batch=batch_size).start()
    else:
        fetcher = await MergedFetcher(nc, js, lanes, batch=batch_size).start()
    got = last_seq = 0
    try:
        while got < expected:
            msgs = await fetcher.fetch(timeout_s=10.0)
            if not msgs:
                raise ReplayError(f"{consumer.name}: the stream stopped delivering after {got} of {expected} events")
            await consumer.process(msgs)
            if consumer.gap:
                raise ReplayError(
                    f"{consumer.name}: deliveries were lost in flight (a NATS leader "
                    "change?); run the replay again with --truncate"
                )
            got += len(msgs)
            last_seq = max(last_seq, msgs[-1].metadata.sequence.stream or 0)
            progress.add(len(msgs))
    except nats.errors.Error as exc:
        raise ReplayError(f"{consumer.name}: {exc}") from exc
    finally:
        await fetcher.stop()
        for lane in lanes:
            await _quietly_delete(js, lane.durable)
    return last_seq


async def _quietly_delete(js: JetStreamContext, name: str) -> None:
    """Delete a replay consumer; if NATS is gone it expires by itself (inactive_threshold)."""
    with contextlib.suppress(nats.errors.Error):
        await js.delete_consumer(EVENTS_STREAM, name)
