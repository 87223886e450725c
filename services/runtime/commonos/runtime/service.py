"""What every long-running service does around its work: signals, health port, NATS, the streams, its
schemas, its consumers or its HTTP application, draining.

`serve` is the whole life of a consuming service (the journal-writer, billing); a service gives it its
name, its schemas and its projections (or a function making them once NATS and PostgreSQL are there).
`service_context` is the part every NATS service shares (the loop's, the OTLP gateway's and the console's too):
the stop event, the health port, the connection (waited for while NATS cannot be reached; readiness follows
it), the streams waited for; `wait_for_streams` is its one way to wait for them (and whatever else a service
needs of JetStream first, as the OTLP gateway's KV buckets: `also`).

An HTTP service mounts its application into that life. Its ports are `Listener`s (`HttpServer`, the gateway's
OTLP port, `commonos.runtime.asgi.AsgiServer`): the service's own `/metrics` `/healthz` `/readyz` port is
`http` (by default an `HttpServer` on COS_HTTP_PORT; the console gives its application, which serves them
beside its pages, on its own port), open from the start; `ServiceContext.serve(*listeners)` opens the
others once the service has what they need, marks it ready and beats its liveness until the stop event,
then lets each port's requests in flight finish (COS_DRAIN_TIMEOUT_S). As the context ends, the service's
own tasks (`ServiceContext.start_task`) are ended, its `http` port drained and closed, and NATS closed:

    health = Health()
    async with service_context(settings, "cos-console", health=health, http=AsgiServer(app, ...)) as ctx:
        ...                                   # what the application needs: ctx.nc, a pool, app.state
        await ctx.serve(stopping=live.close)  # until SIGTERM; live streams end, requests drain
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import asyncpg
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from commonos.runtime import nats as cos_nats
from commonos.runtime import retention, telemetry
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions, Projection, projection_of
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.lifecycle import install_stop_signals
from commonos.runtime.nats import ConnectionLost
from commonos.runtime.postgres import apply_schemas, create_pool
from commonos.runtime.retry import Backoff, sleep_or_stop
from commonos.runtime.settings import Settings

log = logging.getLogger(__name__)

#: How often `ServiceContext.serve` beats the liveness heartbeat.
BEAT_S = 1.0
#: How long a service's own tasks (`ServiceContext.start_task`) are given to end once it stops.
TASKS_END_S = 5.0
#: Waiting for NATS and its streams: the first pause between attempts, doubled up to the second.
NATS_BACKOFF = (0.5, 10.0)
#: What JetStream answers while a service's streams (or buckets) cannot be had yet: an operator has yet to
#: create them, or a cluster is still electing its JetStream leader.
JETSTREAM_NOT_YET = (
    cos_nats.StreamUnavailable,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
)


class Listener(Protocol):
    """A port a service serves: `start` binds it (OSError when it cannot) and returns the port bound, `stop`
    lets the requests in flight finish and closes it (stopping it again does nothing)."""

    async def start(self) -> int: ...

    async def stop(self) -> None: ...


@dataclass
class ServiceContext:
    nc: Client
    js: JetStreamContext
    health: Health
    stop: asyncio.Event
    #: The service's `/metrics` `/healthz` `/readyz` port (for the console, its application's).
    http: Listener
    #: Why the NATS connection was lost for good (the service must exit non-zero), or None.
    lost: str | None = None
    #: Called, in order, when the connection is lost for good, before `stop` is set (the loop's service
    #: records the loss, so that it interrupts its turns at once).
    on_lost: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def start_task(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Run `work` beside the service (the gateway's token watch): ended as the context ends, `stop` set,
        cancelled and given TASKS_END_S, its failure logged. `work` should end on `stop` too: Python 3.11's
        asyncio.wait_for drops a cancellation that arrives as its awaitable completes."""
        task = asyncio.create_task(work, name=name)
        self.tasks.append(task)
        return task

    async def serve(
        self,
        *listeners: Listener,
        ready: Callable[[], None] | None = None,
        stopping: Callable[[], None] | None = None,
    ) -> None:
        """An HTTP service's life once it has what it serves with: start `listeners` (ports besides `http`),
        be ready (then `ready()`), beat the liveness heartbeat until `stop`; then not ready ("stopping"),
        `stopping()` (the console ends its live streams, so that their responses complete) and each listener
        stopped, letting its requests in flight finish. A listener that cannot start (its port taken) raises,
        and the service stops."""
        started: list[Listener] = []
        try:
            for listener in listeners:
                await listener.start()
                started.append(listener)
            self.health.set_ready("starting", True)
            if ready is not None:
                ready()
            while not await sleep_or_stop(self.stop, BEAT_S):
                self.health.beat()
        finally:
            self.stop.set()
            self.health.set_ready("stopping", False, "stopping")
            if stopping is not None:
                stopping()
            for listener in started:
                await listener.stop()

    async def _end_tasks(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        if not self.tasks:
            return
        ended, running = await asyncio.wait(self.tasks, timeout=TASKS_END_S)
        for task in ended:
            if not task.cancelled() and (failure := task.exception()) is not None:
                log.warning("%s ended with %s: %s", task.get_name(), type(failure).__name__, failure)
        for task in running:
            log.warning("%s did not end within %.0f s of the stop; left behind", task.get_name(), TASKS_END_S)


#: Makes a service's projections once NATS, the streams, the schemas and the pool are there (billing
#: loads its budgets and publishes its alerts through them).
ProjectionFactory = Callable[[ServiceContext, asyncpg.Pool], Awaitable[Sequence[Projection]]]


@contextlib.asynccontextmanager
async def service_context(
    settings: Settings,
    name: str,
    stop: asyncio.Event | None = None,
    streams: Sequence[StreamConfig] = (),
    *,
    also: Callable[[JetStreamContext], Awaitable[None]] | None = None,
    health: Health | None = None,
    http: Listener | None = None,
) -> AsyncIterator[ServiceContext]:
    """Stop event (SIGTERM/SIGINT unless one is given), `/metrics` `/healthz` `/readyz` (on `http`, by default
    an `HttpServer` of `health` on COS_HTTP_HOST:COS_HTTP_PORT), NATS (waited for), the streams (the events',
    the dead letters' and `streams`) and `also(js)` (what else the service needs of JetStream, waited for with
    them). Stopped before all of it is there, it yields all the same, `stop` set: the service ends at once."""
    if stop is None:
        stop = asyncio.Event()
        install_stop_signals(stop)
    health = health if health is not None else Health()
    http = http if http is not None else HttpServer(health, settings.http_host, settings.http_port)
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
        nc = await connect_when_reachable(settings, name, health, stop, closed_cb=on_closed)
        try:
            js = nc.jetstream()
            if not stop.is_set():
                await wait_for_streams(
                    js, settings.stream_replicas, health, stop, streams, None if also is None else lambda: also(js)
                )
            holder.append(ServiceContext(nc, js, health, stop, http))
            try:
                yield holder[0]
            finally:
                await holder[0]._end_tasks()
                await http.stop()
        finally:
            await nc.close()
    finally:
        await http.stop()


async def connect_when_reachable(
    settings: Settings, name: str, health: Health, stop: asyncio.Event, **overrides: Any
) -> Client:
    """The service's NATS connection (`commonos.runtime.nats.connect`), waited for while NATS cannot be
    reached: readiness check "nats" until then, liveness beating, and `stop` (SIGTERM) heard meanwhile. The
    client returned is connected, or, when stopped first, not (the service ends at once)."""
    nc = Client()
    connecting = asyncio.create_task(cos_nats.connect(settings, name, client=nc, **overrides))
    backoff = Backoff(*NATS_BACKOFF)
    stopped = asyncio.create_task(stop.wait())
    try:
        while not connecting.done():
            await asyncio.wait([connecting, stopped], timeout=backoff.next(), return_when=asyncio.FIRST_COMPLETED)
            if connecting.done() or stop.is_set():
                break
            # nats-py tries again and again by itself (unlimited reconnects): say why it is not there yet.
            reason = f"NATS unreachable: {type(nc.last_error).__name__ if nc.last_error else 'connecting'}"
            health.set_ready("nats", False, reason)
            health.beat()  # waiting for NATS is not a hang
            log.warning("%s; waiting", reason)
    finally:
        stopped.cancel()
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await connecting
    if connecting.done() and not connecting.cancelled():
        connecting.result()  # a configuration error raises
        health.set_ready("nats", True)
        cos_nats.watch_connection(health, nc)
    return nc


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
    backoff = Backoff(*NATS_BACKOFF)
    while not stop.is_set():
        try:
            await cos_nats.ensure_streams(js, replicas)
            for config in extra:
                await cos_nats.ensure_stream(js, config)
            if also is not None:
                await also()
            health.set_ready("streams", True)
            return True
        except JETSTREAM_NOT_YET as exc:
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
    async with telemetry.serving(f"commonos-{projection_of(name)}"):
        return await _serve(settings, name, schemas, projections, stop, streams, pool_size, logger, database_url)


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
            _start_retention(ctx, settings, database_url, chosen, logger)
            consumers = [
                BatchConsumer(ctx.js, pool, p, ctx.health, consumer_options(settings, p), nc=ctx.nc) for p in chosen
            ]
            applied = await run_consumers(ctx, consumers, settings.drain_timeout_s)
        finally:
            await pool.close()
    logger.info("%s: stopped after applying %d events", name, applied)
    return 1 if ctx.lost else 0


def _start_retention(
    ctx: ServiceContext, settings: Settings, dsn: str, projections: Sequence[Projection], logger: logging.Logger
) -> None:
    """With COS_RETENTION_MONTHS (COS_MODEL_CALLS_RETENTION_MONTHS for model_calls), the first partition's
    instance drops the months of its projections' tables that are no longer kept, hourly
    (`commonos.runtime.retention`)."""
    if settings.partition not in (None, 0):
        return
    chosen = retention.RetentionSettings.from_env()
    plan = retention.service_plan(chosen, [t for p in projections for t in p.tables])
    if plan:
        logger.info("retention: keeping %s", ", ".join(f"{t} {n} months" for t, n in sorted(plan.items())))
        ctx.start_task(retention.run_periodically(dsn, plan, chosen.export_dir, ctx.stop, logger), name="retention")


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
