"""Fixtures of the gateway's tests: a gateway running in-process (its own `serve`) against the test's own
nats-server, tokens made in its bucket, trivial mappings to inject, and reading the stored events back."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import nats
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from commonos.otlp_gateway.auth import create_token, tokens_bucket
from commonos.otlp_gateway.common import CallOrdinals, Mapped, Source
from commonos.otlp_gateway.server import MapLogs, MapTraces
from commonos.otlp_gateway.service import Running, serve
from commonos.otlp_gateway.settings import GatewaySettings
from commonos.proto.events import SessionCreated, decode_event
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import Settings

NAMESPACE = uuid.UUID("6f0d1c3e-2f7b-4f55-9b36-1e2a55c0a001")


def _time(nanos: int) -> datetime:
    return datetime.fromtimestamp(nanos / 1e9, UTC) if nanos else datetime.now(UTC)


def stub_map_traces(request: ExportTraceServiceRequest, source: Source) -> Mapped:
    """One session_created per span (its id from the span's trace and span ids); a span named `bad` is
    refused, one named `ignore` ignored."""
    mapped = Mapped()
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                if span.name == "bad":
                    mapped.reject("span 'bad' refused by the test mapping")
                    continue
                if span.name == "ignore":
                    mapped.ignored += 1
                    continue
                ident = uuid.uuid5(NAMESPACE, span.trace_id.hex() + span.span_id.hex())
                mapped.events.append(
                    SessionCreated(
                        event_id=ident,
                        session_id=ident,
                        profile_id=source.profile_id,
                        source="otlp-test",
                        title=span.name,
                        occurred_at=_time(span.start_time_unix_nano),
                    )
                )
    return mapped


async def stub_map_logs(request: ExportLogsServiceRequest, source: Source, ordinals: CallOrdinals) -> Mapped:
    """One session_created per log record, its id from the record's session.id and its ordinal (the body)."""
    mapped = Mapped()
    for rl in request.resource_logs:
        for sl in rl.scope_logs:
            for record in sl.log_records:
                attrs = {kv.key: kv.value.string_value for kv in record.attributes}
                session = attrs.get("session.id") or "none"
                ordinal = await ordinals.ordinal("test", session, record.body.string_value)
                ident = uuid.uuid5(NAMESPACE, f"{session}/{ordinal}")
                mapped.events.append(
                    SessionCreated(
                        event_id=ident,
                        session_id=ident,
                        profile_id=source.profile_id,
                        source="otlp-test",
                        title=f"{ordinal}",
                        occurred_at=_time(record.time_unix_nano),
                    )
                )
    return mapped


@dataclass
class Gateway:
    running: Running
    stop: asyncio.Event
    task: asyncio.Task[int]

    @property
    def url(self) -> str:
        return self.running.url

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.running.metrics.registry.get_sample_value(name, labels or {})
        return float(value or 0.0)


@contextlib.asynccontextmanager
async def run_gateway(
    nats_url: str,
    *,
    map_logs: MapLogs | None = stub_map_logs,
    map_traces: MapTraces | None = stub_map_traces,
    **gateway: Any,
) -> AsyncIterator[Gateway]:
    """A gateway in this event loop (the stub mappings unless told otherwise; None: the real ones)."""
    options: dict[str, Any] = {"port": 0, "grpc_port": 0, "publish_timeout_s": 2.0, "retry_after_s": 1} | gateway
    stop = asyncio.Event()
    started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            Settings(nats_url=nats_url, http_port=0),
            GatewaySettings(**options),
            stop=stop,
            registry=CollectorRegistry(),
            on_started=started.set_result,
            map_logs=map_logs,
            map_traces=map_traces,
        )
    )
    waiting: list[asyncio.Future[Any]] = [started, task]
    done, _ = await asyncio.wait(waiting, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if started not in done:
        stop.set()
        if task.done():
            task.result()
        raise AssertionError("the gateway did not start within 30 s")
    running = started.result()
    await asyncio.wait_for(running.tokens.loaded.wait(), 10)
    try:
        yield Gateway(running, stop, task)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def make_token(
    nats_url: str,
    profile: str = "otlp-test",
    name: str | None = None,
    *,
    tags: tuple[str, ...] = (),
    tag_keys: tuple[str, ...] | None = None,
) -> str:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        token, _ = await create_token(await tokens_bucket(js), profile, name, tags=tags, tag_keys=tag_keys)
        return token
    finally:
        await nc.close()


async def stored_events(nats_url: str) -> list[Any]:
    """Every event in COS_EVENTS, in order."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        count = (await js.stream_info(EVENTS_STREAM)).state.last_seq
        return [decode_event((await js.get_msg(EVENTS_STREAM, seq)).data or b"") for seq in range(1, count + 1)]
    finally:
        await nc.close()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


async def post(
    url: str, signal: str, body: bytes, *, token: str | None, content_type: str, headers: dict[str, str] | None = None
) -> Answer:
    sent = {"Content-Type": content_type, **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/{signal}", data=body, headers=sent) as r:
        return Answer(r.status, dict(r.headers), await r.read())


@pytest.fixture
def gateway_factory(nats_url: str) -> Callable[..., Any]:
    def factory(**kwargs: Any) -> Any:
        return run_gateway(nats_url, **kwargs)

    return factory


@pytest.fixture
async def gateway(nats_url: str) -> AsyncIterator[Gateway]:
    async with run_gateway(nats_url) as running:
        yield running


@pytest.fixture
async def token(nats_url: str, gateway: Gateway) -> str:
    made = await make_token(nats_url)
    # The gateway learns of it through its watch.
    digest_known = gateway.running.tokens
    for _ in range(200):
        if digest_known.lookup(made) is not None:
            return made
        await asyncio.sleep(0.01)
    raise AssertionError("the gateway did not learn of the new token within 2 s")
