"""The journal-writer process: a durable consumer of COS_EVENTS projecting into the core tables."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import asyncpg

from commonos.journal_writer.schema import SCHEMA
from commonos.journal_writer.store import JournalProjection
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions, Projection, partition_suffix
from commonos.runtime.http import Health
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.postgres import apply_schemas, create_pool
from commonos.runtime.service import run_consumers, service_context
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.journal_writer")

DEFAULT_HTTP_PORT = 9462


def writer_schemas() -> list[str]:
    """The core schema, then the plugin schemas whose projections run in this process."""
    from commonos.journal_writer.graph_schema import SCHEMA as GRAPH_SCHEMA
    from commonos.journal_writer.memory import OWNERS_SCHEMA as MEMORY_OWNERS_SCHEMA
    from commonos.memory.schema import SCHEMA as MEMORY_SCHEMA

    return [SCHEMA, MEMORY_SCHEMA, MEMORY_OWNERS_SCHEMA, GRAPH_SCHEMA]


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
    async with service_context(settings, name, stop) as ctx:
        if not await apply_schemas_when_reachable(database_url, schemas, ctx.health, ctx.stop):
            return 0
        pool = await create_pool(database_url, min_size=1, max_size=2 + len(projections))
        try:
            consumers = [
                BatchConsumer(ctx.js, pool, p, ctx.health, consumer_options(settings, p, filter_subjects))
                for p in projections
            ]
            applied = await run_consumers(ctx, consumers, settings.drain_timeout_s)
        finally:
            await pool.close()
    log.info("%s: stopped after applying %d events", name, applied)
    return 1 if ctx.lost else 0


def main() -> int:
    async def _main() -> int:
        settings = Settings.from_env(http_port=DEFAULT_HTTP_PORT)
        setup_logging(settings.log_level)
        suffix = partition_suffix(settings)
        projections = writer_projections(suffix, unpartitioned=(settings.partition or 0) == 0)
        return await serve(settings, projections, writer_schemas(), "journal-writer" + suffix)

    return run(_main)
