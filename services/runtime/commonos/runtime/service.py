"""What every consuming service does around its consumers: signals, health port, NATS, the streams, its
schemas, its consumers, draining.

`serve` is the whole life of a consuming service (the journal-writer, billing); a service gives it its
name, its schemas and its projections (or a function making them once NATS and PostgreSQL are there).
`service_context` is the part every NATS service shares (the loop's too): the stop event, the health port,
the connection (readiness follows it), the streams waited for; `wait_for_streams` is its one way to wait for
them (and whatever else a service needs of JetStream first, as the OTLP gateway's KV buckets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from commonos.runtime import nats as cos_nats
from commonos.runtime import telemetry
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions, Projection, projection_of
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.lifecycle import install_stop_signals
from commonos.runtime.nats import ConnectionLost
from commonos.runtime.postgres import apply_schemas, create_pool
from commonos.runtime.retry import Backoff, sleep_or_stop
from commonos.runtime.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ServiceContext:
    nc: Client
    js: JetStreamContext
    health: Health
    stop: asyncio.Event
    #: Why the NATS connection was lost for good (the service must exit non-zero), or None.
    lost: str | None = None
    #: Called, in order, when the connection is lost for good, before `stop` is set (the loop's service
    #: records the loss, so that it interrupts its turns at once).
    on_lost: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


#: Makes a service's projections once NATS, the streams, the schemas and the pool are there (billing
#: loads its budgets and publishes its alerts through them).
ProjectionFactory = Callable[[ServiceContext, asyncpg.Pool], Awaitable[Sequence[Projection]]]


@contextlib.asynccontextmanager
async def service_context(
    settings: Settings,
    name: str,
    stop: asyncio.Event | None = None,
    streams: Sequence[StreamConfig] = (),
) -> AsyncIterator[ServiceContext]:
    """Stop event (SIGTERM/SIGINT unless one is given), `/metrics` `/healthz` `/readyz`, NATS, the streams
    (the events', the dead letters' and `streams`)."""
    if stop is None:
        stop = asyncio.Event()
        install_stop_signals(stop)
    health = Health()
    http = HttpServer(health, settings.http_host, settings.http_port)
    port = await http.start()
    log.info("%s: /metrics /healthz /readyz on %s:%d", name, settings.http_host, port)
    holder: list[ServiceContext] = []

    async def on_closed() -> None:
        if stop.is_set() or not holder:
            return  # our own shutdown
        ctx = holder[0]
        for callback in ctx.on_lost:
            await callback()
        ctx.lost = ctx.lost or f"NATS connection closed: {ctx.nc.last_error or 'by the server'}"
        log.error("%s: %s; stopping so that the service is restarted", name, ctx.lost)
        health.fail(ctx.lost)
        stop.set()

    try:
        nc = await cos_nats.connect(settings, name, closed_cb=on_closed)
        cos_nats.watch_connection(health, nc)
        try:
            js = nc.jetstream()
            await wait_for_streams(js, settings.stream_replicas, health, stop, streams)
            holder.append(ServiceContext(nc, js, health, stop))
            yield holder[0]
        finally:
            await nc.close()
    finally:
        await http.stop()


async def wait_for_streams(
    js: JetStreamContext,
    replicas: int,
    health: Health,
    stop: asyncio.Event,
    extra: Sequence[StreamConfig] = (),
    also: Callable[[], Awaitable[None]] | None = None,
) -> bool:
    """The streams (the events', the dead letters', `extra`), created if this user may, else waited for (an
    admin creates them: `cos streams ensure`), then `also` (what else the service needs of JetStream, waited
    for the same way); readiness check "streams" until then. False if stopped first."""
    backoff = Backoff(0.5, 10.0)
    while not stop.is_set():
        try:
            await cos_nats.ensure_streams(js, replicas)
            for config in extra:
                await cos_nats.ensure_stream(js, config)
            if also is not None:
                await also()
            health.set_ready("streams", True)
            return True
        except (
            cos_nats.StreamUnavailable,
            nats.errors.TimeoutError,
            nats.errors.NoRespondersError,
            nats.js.errors.ServiceUnavailableError,
        ) as exc:
            # An operator has yet to create the streams, or a cluster is still electing its JetStream leader.
            reason = str(exc) if isinstance(exc, cos_nats.StreamUnavailable) else f"JetStream: {type(exc).__name__}"
            health.set_ready("streams", False, reason)
            health.beat()  # waiting is not a hang
            log.warning("%s; waiting", reason)
            await sleep_or_stop(stop, backoff.next())
    return False


async def apply_schemas_when_reachable(
    dsn: str, schemas: Sequence[str], health: Health, stop: asyncio.Event, logger: logging.Logger = log
) -> bool:
    """Apply `schemas` under the schema advisory lock, waiting out a PostgreSQL that cannot be reached
    yet; False if stopped first."""
    backoff = Backoff(0.1, 5.0)
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
            logger.warning("PostgreSQL unreachable (%s); retrying", exc)
            await sleep_or_stop(stop, backoff.next())
    return False


def consumer_options(settings: Settings, projection: Projection) -> ConsumerOptions:
    """The one way a service's consumer is configured: the COS_BATCH_* settings, the subjects the
    projection reads, and this instance's partition unless the projection is not partitioned."""
    partitioned = projection.partitioned
    return ConsumerOptions(
        batch_size=settings.batch_size,
        batch_timeout_s=settings.batch_timeout_s,
        filter_subjects=projection.filter_subjects,
        partitions=settings.partitions if partitioned else 1,
        partition=(settings.partition or 0) if partitioned else 0,
    )


async def serve(
    settings: Settings,
    name: str,
    schemas: Sequence[str],
    projections: Sequence[Projection] | ProjectionFactory,
    *,
    stop: asyncio.Event | None = None,
    streams: Sequence[StreamConfig] = (),
    pool_size: int | None = None,
    logger: logging.Logger = log,
) -> int:
    """Run a consuming service until `stop` is set (SIGTERM/SIGINT when not given); its exit code.

    Serves `/metrics` `/healthz` `/readyz`, connects to NATS, waits for the streams (`streams` besides
    the events' and the dead letters'), applies `schemas` under the schema advisory lock (waiting for
    PostgreSQL), then runs one consumer per projection until stopped and lets their batches drain.
    `projections` is a list, or a function making them from the context and the pool. The pool holds
    `pool_size` connections: by default two more than the projections (a factory counts as one).
    Returns 1 when the NATS connection was lost for good (the service must be restarted), else 0.
    """
    _, database_url = settings.require_urls()
    # OpenTelemetry when OTEL_EXPORTER_OTLP_ENDPOINT asks for it (service.name commonos-journal-writer,
    # commonos-billing), flushed as the service stops.
    tel = telemetry.setup(f"commonos-{projection_of(name)}")
    try:
        return await _serve(settings, name, schemas, projections, stop, streams, pool_size, logger, database_url)
    finally:
        if tel is not None:
            await tel.aclose()


async def _serve(
    settings: Settings,
    name: str,
    schemas: Sequence[str],
    projections: Sequence[Projection] | ProjectionFactory,
    stop: asyncio.Event | None,
    streams: Sequence[StreamConfig],
    pool_size: int | None,
    logger: logging.Logger,
    database_url: str,
) -> int:
    async with service_context(settings, name, stop, streams) as ctx:
        if not await apply_schemas_when_reachable(database_url, schemas, ctx.health, ctx.stop, logger):
            return 1 if ctx.lost else 0
        if pool_size is None:
            pool_size = 2 + (len(projections) if isinstance(projections, Sequence) else 1)
        pool = await create_pool(database_url, min_size=1, max_size=pool_size)
        try:
            chosen = projections if isinstance(projections, Sequence) else await projections(ctx, pool)
            consumers = [
                BatchConsumer(ctx.js, pool, p, ctx.health, consumer_options(settings, p), nc=ctx.nc) for p in chosen
            ]
            applied = await run_consumers(ctx, consumers, settings.drain_timeout_s)
        finally:
            await pool.close()
    logger.info("%s: stopped after applying %d events", name, applied)
    return 1 if ctx.lost else 0


async def run_consumers(ctx: ServiceContext, consumers: Sequence[BatchConsumer], drain_timeout_s: float) -> int:
    """Run until `ctx.stop` (or a consumer fails), then let batches in flight finish or be abandoned un-acked.

    Returns how many events the consumers applied; re-raises a consumer's failure. A NATS connection
    lost for good is not a crash but a reason to be restarted: it is recorded in `ctx.lost` (the
    service then exits non-zero) and /healthz fails.
    """
    stop = ctx.stop
    tasks = [asyncio.create_task(c.run(stop), name=c.name) for c in consumers]
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    stopper.cancel()
    _, pending = await asyncio.wait(tasks, timeout=drain_timeout_s)
    for t in pending:
        t.cancel()
    for t in tasks:
        if t.done() and not t.cancelled() and (exc := t.exception()) is not None:
            if isinstance(exc, ConnectionLost):
                ctx.lost = ctx.lost or str(exc)
                ctx.health.fail(ctx.lost)
                log.error("%s; stopping so that the service is restarted", exc)
                continue
            raise exc
    return sum(c.applied for c in consumers)
