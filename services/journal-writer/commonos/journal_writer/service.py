"""The journal-writer process: a durable consumer of COS_EVENTS projecting into the core tables."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import asyncpg

from commonos.journal_writer.schema import SCHEMA
from commonos.journal_writer.store import JournalProjection
from commonos.runtime import nats as cos_nats
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions, Projection
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.lifecycle import install_stop_signals, run, setup_logging
from commonos.runtime.postgres import apply_schemas, create_pool
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.journal_writer")

DEFAULT_HTTP_PORT = 9462


def writer_schemas() -> list[str]:
    """The core schema, then the plugin schemas whose projections run in this process."""
    from commonos.journal_writer.graph_schema import SCHEMA as GRAPH_SCHEMA
    from commonos.loop.memory_schema import SCHEMA as MEMORY_SCHEMA

    return [SCHEMA, MEMORY_SCHEMA, GRAPH_SCHEMA]


def partition_suffix(settings: Settings) -> str:
    """Durable consumer names carry the partition, so each partition has its own cursor and position."""
    if settings.partitions == 1:
        return ""
    return f"-p{settings.partition or 0}-of-{settings.partitions}"


def writer_projections(suffix: str = "", unpartitioned: bool = True) -> list[Projection]:
    """The core projection, the session graph's and, on one instance only, the Memory plugin's."""
    from commonos.journal_writer.graph_projection import GraphProjection
    from commonos.journal_writer.memory import MemoryProjection

    projections: list[Projection] = [
        JournalProjection("journal-writer" + suffix),
        GraphProjection("graph-writer" + suffix),
    ]
    if unpartitioned:
        projections.append(MemoryProjection())
    return projections


async def apply_schemas_when_reachable(dsn: str, schemas: Sequence[str], health: Health, stop: asyncio.Event) -> bool:
    backoff = 0.1
    while not stop.is_set():
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                await apply_schemas(conn, schemas)
            finally:
                await conn.close()
            return True
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.InterfaceError, TimeoutError) as exc:
            health.set_ready("database", False, f"PostgreSQL unreachable: {type(exc).__name__}")
            health.beat()  # waiting for the database is this service working as designed, not a hang
            log.warning("PostgreSQL unreachable (%s); retrying", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, 5.0)
    return False


def consumer_options(
    settings: Settings, projection: Projection, filter_subjects: tuple[str, ...] = ("cos.events.>",)
) -> ConsumerOptions:
    """A projection may narrow the subjects it reads (`filter_subjects`) and opt out of partitioning."""
    partitioned = getattr(projection, "partitioned", True)
    return ConsumerOptions(
        batch_size=settings.batch_size,
        batch_timeout_s=settings.batch_timeout_s,
        filter_subjects=getattr(projection, "filter_subjects", filter_subjects),
        partitions=settings.partitions if partitioned else 1,
        partition=(settings.partition or 0) if partitioned else 0,
    )


async def serve(
    settings: Settings,
    projections: Sequence[Projection],
    schemas: Sequence[str],
    name: str,
    stop: asyncio.Event | None = None,
    filter_subjects: tuple[str, ...] = ("cos.events.>",),
) -> int:
    """Run consumers for `projections` until `stop` is set (SIGTERM/SIGINT when not given)."""
    _, database_url = settings.require_urls()
    own_stop = stop is None
    stop = stop or asyncio.Event()
    if own_stop:
        install_stop_signals(stop)
    health = Health()
    http = HttpServer(health, settings.http_host, settings.http_port)
    port = await http.start()
    log.info("%s: /metrics /healthz /readyz on %s:%d", name, settings.http_host, port)
    nc = await cos_nats.connect(settings, name)
    pool: asyncpg.Pool | None = None
    try:
        js = nc.jetstream()
        await cos_nats.ensure_streams(js, settings.stream_replicas)
        if not await apply_schemas_when_reachable(database_url, schemas, health, stop):
            return 0
        pool = await create_pool(database_url, min_size=1, max_size=2 + len(projections))
        consumers = [
            BatchConsumer(js, pool, p, health, consumer_options(settings, p, filter_subjects)) for p in projections
        ]
        tasks = [asyncio.create_task(c.run(stop), name=c.name) for c in consumers]
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        # Let the batch in flight finish (or be abandoned un-acked) within the drain deadline.
        _, pending = await asyncio.wait(tasks, timeout=settings.drain_timeout_s)
        for t in pending:
            t.cancel()
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        log.info("%s: stopped after applying %d events", name, sum(c.applied for c in consumers))
        return 0
    finally:
        await http.stop()
        if pool is not None:
            await pool.close()
        await nc.close()


def main() -> int:
    async def _main() -> int:
        settings = Settings.from_env(http_port=DEFAULT_HTTP_PORT)
        setup_logging(settings.log_level)
        suffix = partition_suffix(settings)
        projections = writer_projections(suffix, unpartitioned=(settings.partition or 0) == 0)
        return await serve(settings, projections, writer_schemas(), "journal-writer" + suffix)

    return run(_main)
