"""The OTLP gateway process: OTLP/HTTP in (COS_OTLP_PORT, 4318), our events out to JetStream.

It keeps no state of its own: the tokens (COS_OTLP_TOKENS) and the Codex call ordinals (COS_OTLP_STATE) are
NATS KV buckets, the events are deduplicated by JetStream, so replicas behind a load balancer agree. Its
`/metrics` `/healthz` `/readyz` are on COS_HTTP_PORT (default 9464); it is ready once connected to NATS, the
streams there and the tokens loaded, and not ready while NATS is disconnected (it then answers 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nats.errors
from prometheus_client import REGISTRY, CollectorRegistry

from commonos.otlp_gateway.auth import TokenIndex, tokens_bucket
from commonos.otlp_gateway.common import CallOrdinals
from commonos.otlp_gateway.metrics import GatewayMetrics
from commonos.otlp_gateway.ordinals import KvOrdinals, state_bucket
from commonos.otlp_gateway.server import (
    MapLogs,
    MapTraces,
    OtlpReceiver,
    OtlpServer,
    allowed_hosts,
    host_check,
)
from commonos.otlp_gateway.settings import DEFAULT_HTTP_PORT, GatewaySettings
from commonos.runtime import nats as cos_nats
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.lifecycle import install_stop_signals, run, setup_logging
from commonos.runtime.publisher import EventPublisher
from commonos.runtime.retry import Backoff, sleep_or_stop
from commonos.runtime.service import wait_for_streams
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.otlp_gateway")

NAME = "otlp-gateway"
#: The CloudEvents source of what the gateway publishes.
EVENT_SOURCE = "urn:commonos:otlp-gateway"
#: How long the gateway's own tasks (the token watch) are given to end once it stops.
TASKS_END_S = 5.0


@dataclass
class Running:
    """A started gateway, as `serve` hands it to `on_started` (tests read its ports and metrics)."""

    otlp: OtlpServer
    http: HttpServer
    metrics: GatewayMetrics
    tokens: TokenIndex
    health: Health

    @property
    def url(self) -> str:
        return self.otlp.url


async def _wait_for_nats(
    settings: Settings, health: Health, stop: asyncio.Event, on_closed: Callable[[], Any]
) -> Any | None:
    async def on_disconnected() -> None:
        log.warning("nats: disconnected; OTLP requests are answered 503 until it is back")

    async def on_reconnected() -> None:
        log.info("nats: reconnected")

    backoff = Backoff(0.2, 5.0)
    while not stop.is_set():
        try:
            nc = await cos_nats.connect(
                settings,
                NAME,
                closed_cb=on_closed,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
            )
            health.set_ready("nats", True)
            cos_nats.watch_connection(health, nc)
            return nc
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            health.set_ready("nats", False, f"NATS unreachable: {type(exc).__name__}")
            health.beat()
            log.warning("NATS unreachable (%s); retrying", exc)
            await sleep_or_stop(stop, backoff.next())
    return None


async def serve(
    settings: Settings,
    gateway: GatewaySettings | None = None,
    *,
    stop: asyncio.Event | None = None,
    registry: CollectorRegistry = REGISTRY,
    on_started: Callable[[Running], None] | None = None,
    map_logs: MapLogs | None = None,
    map_traces: MapTraces | None = None,
    ordinals: CallOrdinals | None = None,
) -> int:
    """Run the gateway until `stop` is set (SIGTERM/SIGINT when not given); its exit code (1 when the NATS
    connection was closed for good, so that it is restarted)."""
    if not settings.nats_url:
        from commonos.proto.errors import ConfigError

        raise ConfigError("COS_NATS_URL is not set (or run everything embedded with `cos up`)")
    gateway = gateway or GatewaySettings.from_env()
    if stop is None:
        stop = asyncio.Event()
        install_stop_signals(stop)
    health = Health()
    http = HttpServer(
        health,
        settings.http_host,
        settings.http_port,
        registry=registry,
        middlewares=[host_check(allowed_hosts(settings.http_host, gateway.hosts))],
        keepalive_timeout_s=gateway.header_timeout_s,
    )
    port = await http.start()
    log.info("%s: /metrics /healthz /readyz on %s:%d", NAME, settings.http_host, port)
    lost: list[str] = []

    async def on_closed() -> None:
        if stop.is_set():
            return
        reason = "NATS connection closed for good"
        lost.append(reason)
        log.error("%s; stopping so that the gateway is restarted", reason)
        health.fail(reason)
        stop.set()

    otlp: OtlpServer | None = None
    tasks: list[asyncio.Task[Any]] = []
    nc = await _wait_for_nats(settings, health, stop, on_closed)
    try:
        if nc is None:
            return 0
        js = nc.jetstream()
        buckets: list[Any] = []

        async def kv_buckets() -> None:
            buckets[:] = [
                await tokens_bucket(js, settings.stream_replicas),
                await state_bucket(js, settings.stream_replicas),
            ]

        if not await wait_for_streams(js, settings.stream_replicas, health, stop, also=kv_buckets):
            return 1 if lost else 0
        kv_tokens, kv_state = buckets
        tokens = TokenIndex()
        health.set_ready("tokens", False, "the tokens are not loaded yet")
        tasks.append(asyncio.create_task(tokens.run(nc, kv_tokens, stop), name="otlp-tokens"))

        async def ready_once_loaded() -> None:
            await tokens.loaded.wait()
            health.set_ready("tokens", True)

        tasks.append(asyncio.create_task(ready_once_loaded(), name="otlp-tokens-loaded"))
        metrics = GatewayMetrics(registry)
        publisher = EventPublisher(
            js,
            EVENT_SOURCE,
            nc=nc,
            ack_timeout_s=min(2.0, gateway.publish_timeout_s),
            deadline_s=gateway.publish_timeout_s,
        )
        extra: dict[str, Any] = {}
        if map_logs is not None:
            extra["map_logs"] = map_logs
        if map_traces is not None:
            extra["map_traces"] = map_traces
        receiver = OtlpReceiver(
            gateway,
            tokens,
            publisher,
            ordinals if ordinals is not None else KvOrdinals(kv_state),
            metrics,
            nc=nc,
            **extra,
        )
        otlp = OtlpServer(receiver, gateway.host, gateway.port, shutdown_timeout_s=settings.drain_timeout_s)
        await otlp.start()
        log.info("%s: OTLP/HTTP on %s (/v1/traces /v1/logs /v1/metrics)", NAME, otlp.url)
        health.set_ready("starting", True)
        if on_started is not None:
            on_started(Running(otlp, http, metrics, tokens, health))
        while not stop.is_set():
            health.beat()
            health.set_ready("tokens", tokens.loaded.is_set(), "the tokens are not loaded yet")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
        health.set_ready("stopping", False, "stopping")
    finally:
        # The tasks' own loops end on `stop` too: Python 3.11's asyncio.wait_for drops a cancellation that
        # arrives as its awaitable completes (the token watch's next update), and a task that kept running
        # after it kept the gateway from exiting (its OTLP port taken, it hung instead of failing).
        stop.set()
        if otlp is not None:
            await otlp.stop()  # requests in flight finish first (COS_DRAIN_TIMEOUT_S)
        for task in tasks:
            task.cancel()
        if tasks:
            ended, running = await asyncio.wait(tasks, timeout=TASKS_END_S)
            for task in ended:
                if not task.cancelled() and (failure := task.exception()) is not None:
                    log.warning("%s ended with %s: %s", task.get_name(), type(failure).__name__, failure)
            for task in running:
                log.warning("%s did not end within %.0f s of the stop; left behind", task.get_name(), TASKS_END_S)
        if nc is not None:
            await nc.close()
        await http.stop()
    log.info("%s: stopped", NAME)
    return 1 if lost else 0


def main() -> int:
    async def _main() -> int:
        settings = Settings.from_env(http_port=DEFAULT_HTTP_PORT)
        gateway = GatewaySettings.from_env()
        setup_logging(settings.log_level)
        return await serve(settings, gateway)

    return run(_main)
