"""What every consuming service does around its consumers: signals, health port, NATS, draining."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.runtime import nats as cos_nats
from commonos.runtime.consumer import BatchConsumer
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.lifecycle import install_stop_signals
from commonos.runtime.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ServiceContext:
    nc: Client
    js: JetStreamContext
    health: Health
    stop: asyncio.Event


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
    try:
        nc = await cos_nats.connect(settings, name)
        try:
            js = nc.jetstream()
            await cos_nats.ensure_streams(js, settings.stream_replicas)
            yield ServiceContext(nc, js, health, stop)
        finally:
            await nc.close()
    finally:
        await http.stop()


async def run_consumers(consumers: Sequence[BatchConsumer], stop: asyncio.Event, drain_timeout_s: float) -> int:
    """Run until `stop` (or a consumer fails), then let batches in flight finish or be abandoned un-acked.

    Returns how many events the consumers applied; re-raises a consumer's failure.
    """
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
            raise exc
    return sum(c.applied for c in consumers)
