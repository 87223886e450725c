"""What every consuming service does around its consumers: signals, health port, NATS, draining."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.runtime import nats as cos_nats
from commonos.runtime.consumer import BatchConsumer
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.lifecycle import install_stop_signals
from commonos.runtime.nats import ConnectionLost
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


@contextlib.asynccontextmanager
async def service_context(
    settings: Settings, name: str, stop: asyncio.Event | None = None
) -> AsyncIterator[ServiceContext]:
    """Stop event (SIGTERM/SIGINT unless one is given), `/metrics` `/healthz` `/readyz`, NATS, the streams."""
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
        ctx.lost = f"NATS connection closed: {ctx.nc.last_error or 'by the server'}"
        log.error("%s: %s; stopping so that the service is restarted", name, ctx.lost)
        health.fail(ctx.lost)
        stop.set()

    try:
        nc = await cos_nats.connect(settings, name, closed_cb=on_closed)
        try:
            js = nc.jetstream()
            await _streams_when_there(js, settings.stream_replicas, health, stop)
            holder.append(ServiceContext(nc, js, health, stop))
            yield holder[0]
        finally:
            await nc.close()
    finally:
        await http.stop()


async def _streams_when_there(js: JetStreamContext, replicas: int, health: Health, stop: asyncio.Event) -> None:
    """The streams, created if this user may; else waited for (an admin creates them: `cos streams ensure`)."""
    backoff = 0.5
    while not stop.is_set():
        try:
            await cos_nats.ensure_streams(js, replicas)
            health.set_ready("streams", True)
            return
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, 10.0)


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
