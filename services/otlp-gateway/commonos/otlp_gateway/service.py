"""The OTLP gateway process: OTLP/HTTP (COS_OTLP_PORT, 4318) and OTLP/gRPC (COS_OTLP_GRPC_PORT, 4317) in, our
events out to JetStream.

It keeps no state of its own: the tokens (COS_OTLP_TOKENS), the Codex call ordinals and the sessions' turns
(COS_OTLP_STATE) are NATS KV buckets, the events are deduplicated by JetStream, so replicas behind a load
balancer agree; each replica's sweeper ends the Claude Code and Codex turns that are over (`sweeper`). Its
`/metrics` `/healthz` `/readyz` are on COS_HTTP_PORT (default 9464); it is ready once connected to NATS, the
streams there and the tokens loaded, and not ready while NATS is disconnected (it then answers 503).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from prometheus_client import REGISTRY, CollectorRegistry

from commonos.otlp_gateway.auth import TokenIndex, tokens_bucket
from commonos.otlp_gateway.common import CallOrdinals, TurnStore
from commonos.otlp_gateway.grpc_server import OtlpGrpcServer
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
from commonos.otlp_gateway.sweeper import TurnSweeper
from commonos.proto.errors import ConfigError
from commonos.runtime.http import Health, HttpServer
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.publisher import EventPublisher
from commonos.runtime.service import service_context
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.otlp_gateway")

NAME = "otlp-gateway"
#: The CloudEvents source of what the gateway publishes.
EVENT_SOURCE = "urn:commonos:otlp-gateway"


@dataclass
class Running:
    """A started gateway, as `serve` hands it to `on_started` (tests read its ports and metrics)."""

    otlp: OtlpServer
    grpc: OtlpGrpcServer
    http: HttpServer
    metrics: GatewayMetrics
    tokens: TokenIndex
    health: Health

    @property
    def url(self) -> str:
        return self.otlp.url

    @property
    def grpc_target(self) -> str:
        """host:port of the OTLP/gRPC port, as a gRPC channel names it."""
        return self.grpc.target


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
    connection was closed for good, so that it is restarted).

    Its life is every service's (`commonos.runtime.service.service_context`): /metrics /healthz /readyz on
    COS_HTTP_PORT, NATS, the streams and its KV buckets waited for; then the token watch, and the OTLP port
    served until stopped, its requests in flight finishing first (COS_DRAIN_TIMEOUT_S)."""
    if not settings.nats_url:
        raise ConfigError("COS_NATS_URL is not set (or run everything embedded with `cos up`)")
    gateway = gateway or GatewaySettings.from_env()
    health = Health()
    http = HttpServer(
        health,
        settings.http_host,
        settings.http_port,
        registry=registry,
        middlewares=[host_check(allowed_hosts(settings.http_host, gateway.hosts))],
        keepalive_timeout_s=gateway.header_timeout_s,
    )
    buckets: list[Any] = []

    async def kv_buckets(js: JetStreamContext) -> None:
        buckets[:] = [
            await tokens_bucket(js, settings.stream_replicas),
            await state_bucket(js, settings.stream_replicas),
        ]

    async with service_context(settings, NAME, stop, also=kv_buckets, health=health, http=http) as ctx:
        if ctx.stop.is_set():
            return 1 if ctx.lost else 0
        kv_tokens, kv_state = buckets
        tokens = TokenIndex()
        health.watch("tokens", lambda: None if tokens.loaded.is_set() else "the tokens are not loaded yet")
        ctx.start_task(tokens.run(ctx.nc, kv_tokens, ctx.stop), "otlp-tokens")
        metrics = GatewayMetrics(registry, profiles=tokens.profiles)
        publisher = EventPublisher(
            ctx.js,
            EVENT_SOURCE,
            nc=ctx.nc,
            ack_timeout_s=min(2.0, gateway.publish_timeout_s),
            deadline_s=gateway.publish_timeout_s,
        )
        extra: dict[str, Any] = {}
        if map_logs is not None:
            extra["map_logs"] = map_logs
        if map_traces is not None:
            extra["map_traces"] = map_traces
        store = ordinals if ordinals is not None else KvOrdinals(kv_state)
        if isinstance(store, TurnStore):
            sweeper = TurnSweeper(
                store,
                publisher,
                idle_s=gateway.turn_idle_s,
                publish_timeout_s=gateway.publish_timeout_s,
                metrics=metrics,
            )
            ctx.start_task(sweeper.run(ctx.stop), "otlp-turns")
        receiver = OtlpReceiver(
            gateway,
            tokens,
            publisher,
            store,
            metrics,
            nc=ctx.nc,
            **extra,
        )
        grpc = OtlpGrpcServer(receiver, gateway.host, gateway.grpc_port, shutdown_timeout_s=settings.drain_timeout_s)
        otlp = OtlpServer(
            receiver,
            gateway.host,
            gateway.port,
            shutdown_timeout_s=settings.drain_timeout_s,
            grpc_port=lambda: grpc.port,
        )

        def started() -> None:
            log.info("%s: OTLP/HTTP on %s (/v1/traces /v1/logs /v1/metrics)", NAME, otlp.url)
            log.info("%s: OTLP/gRPC on %s", NAME, grpc.url)
            if on_started is not None:
                on_started(Running(otlp, grpc, http, metrics, tokens, health))

        # The gRPC port first: the HTTP port's answer to a gRPC client names it.
        await ctx.serve(grpc, otlp, ready=started)
    log.info("%s: stopped", NAME)
    return 1 if ctx.lost else 0


def main() -> int:
    async def _main() -> int:
        settings = Settings.from_env(http_port=DEFAULT_HTTP_PORT)
        gateway = GatewaySettings.from_env()
        setup_logging(settings.log_level)
        return await serve(settings, gateway)

    return run(_main)
