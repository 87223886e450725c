"""The OTLP gateway under its own NATS user of deploy/nats/auth.conf: it starts (its KV buckets), publishes
events, keeps its ordinals and ends turns, and may neither write a token nor read the events."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client import CollectorRegistry

from commonos.otlp_gateway.auth import create_token, tokens_bucket
from commonos.otlp_gateway.ordinals import KvOrdinals, state_bucket
from commonos.otlp_gateway.service import Running, serve
from commonos.otlp_gateway.settings import GatewaySettings
from commonos.proto.events import TurnFinished, decode_event
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import Settings
from tests.deploy.conftest import SecuredNats, nats_password
from tests.otlp_gateway.conftest import post, stub_map_logs, stub_map_traces
from tests.otlp_gateway.logs import claude, record


async def test_the_gateway_runs_as_otlp_gateway(secured_nats: SecuredNats) -> None:
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    stop = asyncio.Event()
    started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
    settings = Settings(
        nats_url=secured_nats.url, nats_user="otlp-gateway", nats_password=nats_password("otlp-gateway"), http_port=0
    )
    task = asyncio.create_task(
        serve(
            settings,
            GatewaySettings(port=0, grpc_port=0, publish_timeout_s=3.0),
            stop=stop,
            registry=CollectorRegistry(),
            on_started=started.set_result,
            map_logs=stub_map_logs,
            map_traces=stub_map_traces,
        )
    )
    try:
        running = await asyncio.wait_for(started, 30)
        await asyncio.wait_for(running.tokens.loaded.wait(), 10)
        token, _ = await create_token(await tokens_bucket(admin), "acme")  # the admin writes tokens
        await asyncio.sleep(0.3)
        spans = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(scope_spans=[ScopeSpans(spans=[Span(trace_id=b"\1" * 16, span_id=b"\2" * 8)])])
            ]
        )
        answer = await post(
            running.url, "traces", spans.SerializeToString(), token=token, content_type="application/x-protobuf"
        )
        assert answer.status == 200, answer.body
        record = LogRecord(
            body=AnyValue(string_value="call"),
            attributes=[KeyValue(key="session.id", value=AnyValue(string_value="s"))],
        )
        logs = ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=[record])])])
        answer = await post(
            running.url, "logs", logs.SerializeToString(), token=token, content_type="application/x-protobuf"
        )
        assert answer.status == 200, answer.body  # its ordinals, in COS_OTLP_STATE
        assert (await admin.stream_info(EVENTS_STREAM)).state.messages == 2
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0

    gateway = await secured_nats.connect("otlp-gateway")
    kv = await tokens_bucket(gateway.jetstream(timeout=0.5), create=False)
    with pytest.raises(nats.errors.TimeoutError):
        await kv.put("forged", b'{"profile_id": "acme", "name": "forged"}')
    await secured_nats.refused("otlp-gateway", "$KV.COS_OTLP_TOKENS.forged")
    with pytest.raises(nats.errors.TimeoutError):
        await gateway.jetstream(timeout=0.5).get_msg(EVENTS_STREAM, 1)
    assert [
        v
        for v in secured_nats.violations("otlp-gateway")
        if "cos_otlp_tokens" not in v.lower() and "stream.msg.get" not in v.lower()
    ] == []


async def test_the_gateway_ends_turns_as_otlp_gateway(secured_nats: SecuredNats) -> None:
    """Its sweeper reads, replaces and deletes the sessions' turns in COS_OTLP_STATE under its own user."""
    admin = (await secured_nats.connect("admin")).jetstream()
    await ensure_streams(admin)
    stop = asyncio.Event()
    started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
    settings = Settings(
        nats_url=secured_nats.url, nats_user="otlp-gateway", nats_password=nats_password("otlp-gateway"), http_port=0
    )
    task = asyncio.create_task(
        serve(
            settings,
            GatewaySettings(port=0, publish_timeout_s=1.0, turn_idle_s=0.5),
            stop=stop,
            registry=CollectorRegistry(),
            on_started=started.set_result,
        )
    )
    try:
        running = await asyncio.wait_for(started, 30)
        await asyncio.wait_for(running.tokens.loaded.wait(), 10)
        token, _ = await create_token(await tokens_bucket(admin), "acme")
        await asyncio.sleep(0.3)
        prompt = record("user_prompt", {"session.id": "s-1", "prompt.id": "p-1"})
        answer = await post(
            running.url, "logs", claude(prompt).SerializeToString(), token=token, content_type="application/x-protobuf"
        )
        assert answer.status == 200, answer.body
        deadline = asyncio.get_running_loop().time() + 30
        while (await admin.stream_info(EVENTS_STREAM)).state.messages < 3:  # the session, the turn, its end
            assert asyncio.get_running_loop().time() < deadline, "the turn was not ended within 30 s"
            await asyncio.sleep(0.1)
        last = await admin.get_msg(EVENTS_STREAM, 3)
        assert isinstance(decode_event(last.data or b""), TurnFinished)
        kv = await state_bucket(admin)
        ordinals = KvOrdinals(kv)
        while await ordinals.sessions():  # forgotten once ended and quiet
            assert asyncio.get_running_loop().time() < deadline, "the session's turns were not forgotten"
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
