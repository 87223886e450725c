"""OTLP/gRPC on real servers: the SDK's gRPC exporters, the official service stubs, the recorded CLIs' payloads.

The same receiver as OTLP/HTTP, so the same guarantees are checked the same way: the calls the SDK's exporter
sends are billed; NATS stopped mid-export is UNAVAILABLE with RetryInfo and never OK, and the exporter's retries
land every call once (billed once); a call without a valid token is UNAUTHENTICATED; the recorded Claude Code and
Codex payloads replayed over gRPC give exactly the fake model server's usage. And a gRPC client aimed at the
OTLP/HTTP port is answered (UNIMPLEMENTED, naming the gRPC port) and counted, without a traceback in the log.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import grpc
import nats
import pytest
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from commonos.otlp_gateway.decode import parse_request
from commonos.otlp_gateway.grpc_server import RETRY_INFO_KEY, STATUS_DETAILS_KEY
from commonos.proto.events import ModelCallCompleted
from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.embedded import NatsServer
from tests.billing.support import billing
from tests.clients.support import Recorded, recorded
from tests.otlp_gateway.conftest import Gateway, make_token, run_gateway, stored_events
from tests.otlp_gateway.test_replay_recorded import buckets, expected
from tests.otlp_gateway.test_server import logs, span_event_id, spans
from tests.support import journal_writer, wait_caught_up, wait_until

PROFILE = "otlp-grpc"
SCENARIOS = recorded()


# The official stubs (opentelemetry-proto's generated *_pb2_grpc modules), which are not typed.
def trace_stub(channel: grpc.aio.Channel) -> Any:
    return trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]


def logs_stub(channel: grpc.aio.Channel) -> Any:
    return logs_service_pb2_grpc.LogsServiceStub(channel)  # type: ignore[no-untyped-call]


def metrics_stub(channel: grpc.aio.Channel) -> Any:
    return metrics_service_pb2_grpc.MetricsServiceStub(channel)  # type: ignore[no-untyped-call]


def auth(token: str | None) -> tuple[tuple[str, str], ...]:
    return () if token is None else (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def channel(gateway: Gateway) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(gateway.running.grpc_target) as opened:
        yield opened


async def known(gateway: Gateway, token: str) -> None:
    await wait_until(lambda: gateway.running.tokens.lookup(token) is not None, timeout_s=5, what="the token known")


def grpc_count(gateway: Gateway, signal: str, code: str) -> float:
    return gateway.metric("cos_otlp_grpc_requests_total", {"signal": signal, "code": code})


async def billed(nats_url: str, database_url: str) -> list[asyncpg.Record]:
    """The model_calls the journal-writer and billing make of everything in the stream (nothing dead-lettered)."""
    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await wait_caught_up(js, database_url, "journal-writer")
            await wait_caught_up(js, database_url, "billing", table="billing_positions")
            assert await list_dead_letters(js) == []
        finally:
            await nc.close()
    conn = await asyncpg.connect(database_url)
    try:
        return list(
            await conn.fetch(
                "SELECT request_id, model, input_tokens, output_tokens FROM model_calls ORDER BY request_id"
            )
        )
    finally:
        await conn.close()


# --- the official stubs -----------------------------------------------------------------------------


async def test_traces_logs_and_metrics_are_stored_and_answered_as_over_http(
    gateway: Gateway, token: str, channel: grpc.aio.Channel, nats_url: str
) -> None:
    traces = trace_stub(channel)
    answer = await traces.Export(spans("one", "bad", "ignore", "two"), metadata=auth(token))
    assert isinstance(answer, ExportTraceServiceResponse)
    # The partial success the HTTP receiver gives: the refused span named, the ignored one not refused.
    assert answer.partial_success.rejected_spans == 1
    assert "span 'bad' refused" in answer.partial_success.error_message
    gzipped = await traces.Export(
        spans("three", trace=b"\x07" * 16), metadata=auth(token), compression=grpc.Compression.Gzip
    )
    assert not gzipped.HasField("partial_success")
    log_answer = await logs_stub(channel).Export(logs("conv", "a", "b"), metadata=auth(token))
    assert isinstance(log_answer, ExportLogsServiceResponse) and not log_answer.HasField("partial_success")
    metrics_answer = await metrics_stub(channel).Export(ExportMetricsServiceRequest(), metadata=auth(token))
    assert isinstance(metrics_answer, ExportMetricsServiceResponse)
    stored = await stored_events(nats_url)
    assert [e.title for e in stored] == ["one", "two", "three", "0", "1"]
    assert stored[0].event_id == span_event_id(b"\x01" * 16, 1)
    assert grpc_count(gateway, "traces", "OK") == 2
    assert grpc_count(gateway, "logs", "OK") == grpc_count(gateway, "metrics", "OK") == 1
    assert gateway.metric("cos_otlp_records_total", {"signal": "traces", "outcome": "rejected"}) == 1
    # Counted apart from OTLP/HTTP's requests.
    assert gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "protobuf", "code": "200"}) == 0


async def test_a_call_without_a_valid_token_is_refused(
    gateway: Gateway, channel: grpc.aio.Channel, nats_url: str
) -> None:
    traces = trace_stub(channel)
    for metadata in ((), auth("cos_otlp_not-a-token"), (("authorization", "Basic dXNlcjpwYXNz"),)):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await traces.Export(spans("one"), metadata=metadata)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token" in (refused.value.details() or "")
    assert grpc_count(gateway, "traces", "UNAUTHENTICATED") == 3
    assert gateway.metric("cos_otlp_refused_total", {"reason": "unauthenticated"}) == 3
    assert await stored_events(nats_url) == []


async def test_bad_and_oversized_messages_are_refused(nats_url: str) -> None:
    async with run_gateway(nats_url, max_body_bytes=64 * 1024) as gateway:
        token = await make_token(nats_url)
        await known(gateway, token)
        async with grpc.aio.insecure_channel(gateway.running.grpc_target) as channel:
            raw: Any = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await raw(b"\xff\xff\xff", metadata=auth(token))
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            traces = trace_stub(channel)
            big = spans(*(f"span-{i}-" + "x" * 200 for i in range(400)))
            assert big.ByteSize() > 64 * 1024
            # Over the limit as sent, and over it once inflated though small gzipped.
            for compression in (None, grpc.Compression.Gzip):
                with pytest.raises(grpc.aio.AioRpcError) as large:
                    await traces.Export(big, metadata=auth(token), compression=compression)
                assert large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert len(gzip.compress(big.SerializeToString())) < 64 * 1024
        assert grpc_count(gateway, "traces", "INVALID_ARGUMENT") == 1
        assert gateway.metric("cos_otlp_refused_total", {"reason": "bad_request"}) == 1
    assert await stored_events(nats_url) == []


def retry_delay_s(error: grpc.aio.AioRpcError) -> tuple[float, float]:
    """The RetryInfo of an UNAVAILABLE answer: (from grpc-status-details-bin, from google.rpc.retryinfo-bin)."""
    trailing = dict(error.trailing_metadata() or ())
    status = status_pb2.Status.FromString(trailing[STATUS_DETAILS_KEY])
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    [detail] = status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    alone = error_details_pb2.RetryInfo.FromString(trailing[RETRY_INFO_KEY])
    return info.retry_delay.ToTimedelta().total_seconds(), alone.retry_delay.ToTimedelta().total_seconds()


async def test_nats_stopped_is_unavailable_with_retry_info_then_the_retry_is_stored_once(
    nats_server: NatsServer, nats_url: str
) -> None:
    async with run_gateway(nats_url, publish_timeout_s=1.0, retry_after_s=3) as gateway:
        token = await make_token(nats_url)
        await known(gateway, token)
        async with grpc.aio.insecure_channel(gateway.running.grpc_target) as channel:
            traces = trace_stub(channel)
            await traces.Export(spans("one", "two"), metadata=auth(token))
            nats_server.stop()
            retried = spans("three", "four", trace=b"\x05" * 16)
            try:
                for _ in range(2):
                    with pytest.raises(grpc.aio.AioRpcError) as unavailable:
                        await traces.Export(retried, metadata=auth(token))
                    assert unavailable.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert retry_delay_s(unavailable.value) == (3.0, 3.0)
                with pytest.raises(grpc.aio.AioRpcError) as logs_refused:
                    await logs_stub(channel).Export(logs("s", "x"), metadata=auth(token))
                assert logs_refused.value.code() == grpc.StatusCode.UNAVAILABLE
            finally:
                nats_server.start()
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                try:
                    await traces.Export(retried, metadata=auth(token))
                    break
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                    assert asyncio.get_running_loop().time() < deadline, "not stored within 30 s of NATS' restart"
                    await asyncio.sleep(0.2)
            # Sent once more, as an exporter whose OK was lost would: nothing stored twice.
            await traces.Export(retried, metadata=auth(token))
        assert grpc_count(gateway, "traces", "UNAVAILABLE") >= 2
        assert gateway.metric("cos_otlp_refused_total", {"reason": "unavailable"}) >= 3
    ids = [e.event_id for e in await stored_events(nats_url)]
    assert len(ids) == len(set(ids)) == 4
    assert set(ids) >= {span_event_id(b"\x05" * 16, 1), span_event_id(b"\x05" * 16, 2)}


# --- the SDK's gRPC exporters, the real mappings, billing -------------------------------------------


def chat_span_attributes(i: int) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.response.id": f"msg_grpc_{i:03d}",
        "gen_ai.usage.input_tokens": 100 + i,
        "gen_ai.usage.output_tokens": 10 + i,
    }


async def test_the_sdk_grpc_exporters_send_genai_spans_and_logs_and_the_calls_are_billed(
    nats_url: str, database_url: str
) -> None:
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    async with run_gateway(nats_url, map_logs=None, map_traces=None) as gateway:
        token = await make_token(nats_url, PROFILE)
        await known(gateway, token)
        endpoint = f"http://{gateway.running.grpc_target}"
        headers = {"authorization": f"Bearer {token}"}

        def send() -> None:
            tracer_provider = TracerProvider(resource=Resource.create({"service.name": "agent", "client": "acme"}))
            tracer_provider.add_span_processor(
                SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True, headers=headers))
            )
            tracer = tracer_provider.get_tracer("grpc-e2e")
            with tracer.start_as_current_span(
                "invoke_agent helper", attributes={"gen_ai.operation.name": "invoke_agent"}
            ):
                for i in range(2):
                    with tracer.start_as_current_span("chat claude-sonnet-4-5", attributes=chat_span_attributes(i)):
                        pass
            tracer_provider.shutdown()
            # A Claude Code api_request record, through the SDK's logs pipeline and its gRPC log exporter.
            logger_provider = LoggerProvider(resource=Resource.create({"service.name": "claude-code"}))
            logger_provider.add_log_record_processor(
                SimpleLogRecordProcessor(OTLPLogExporter(endpoint=endpoint, insecure=True, headers=headers))
            )
            logger_provider.get_logger("com.anthropic.claude_code.events").emit(
                timestamp=time.time_ns(),
                body="claude_code.api_request",
                attributes={
                    "event.name": "api_request",
                    "session.id": "grpc-session-1",
                    "prompt.id": "grpc-prompt-1",
                    "request_id": "req_grpc_log_1",
                    "model": "claude-sonnet-4-5",
                    "input_tokens": 7,
                    "output_tokens": 3,
                    "cache_read_tokens": 0,
                    "cache_creation_tokens": 0,
                },
            )
            logger_provider.shutdown()

        await asyncio.to_thread(send)
        assert grpc_count(gateway, "traces", "OK") == 3
        assert grpc_count(gateway, "logs", "OK") == 1
    calls = [e for e in await stored_events(nats_url) if isinstance(e, ModelCallCompleted)]
    assert sorted((c.request_id, c.input_tokens, c.output_tokens) for c in calls) == [
        ("msg_grpc_000", 100, 10),
        ("msg_grpc_001", 101, 11),
        ("req_grpc_log_1", 7, 3),
    ]
    rows = await billed(nats_url, database_url)
    assert [(r["request_id"], r["input_tokens"], r["output_tokens"]) for r in rows] == [
        ("msg_grpc_000", 100, 10),
        ("msg_grpc_001", 101, 11),
        ("req_grpc_log_1", 7, 3),
    ]


async def test_nats_restarted_mid_export_the_grpc_exporters_retries_bill_every_call_once(
    nats_server: NatsServer, nats_url: str, database_url: str
) -> None:
    """The SDK's gRPC exporter sending GenAI call after call while NATS is stopped and started: UNAVAILABLE
    meanwhile, retried, and every call stored and billed once."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    total = 30
    async with run_gateway(nats_url, map_logs=None, map_traces=None, publish_timeout_s=1.0, retry_after_s=1) as gateway:
        token = await make_token(nats_url, PROFILE)
        await known(gateway, token)
        sent: list[int] = []

        def send() -> None:
            provider = TracerProvider()
            exporter = OTLPSpanExporter(
                endpoint=f"http://{gateway.running.grpc_target}",
                insecure=True,
                headers={"authorization": f"Bearer {token}"},
                timeout=60,
            )
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracer = provider.get_tracer("mid-export")
            for i in range(total):
                with tracer.start_as_current_span("chat claude-sonnet-4-5", attributes=chat_span_attributes(i)):
                    pass
                sent.append(i)
            provider.shutdown()

        sending = asyncio.create_task(asyncio.to_thread(send))
        await wait_until(lambda: len(sent) >= total // 4, timeout_s=60, what="a quarter of the calls sent")
        nats_server.stop()
        await asyncio.sleep(2.0)
        nats_server.start()
        await asyncio.wait_for(sending, 180)
        assert grpc_count(gateway, "traces", "UNAVAILABLE") >= 1
    calls = [e for e in await stored_events(nats_url) if isinstance(e, ModelCallCompleted)]
    assert sorted(str(c.request_id) for c in calls) == [f"msg_grpc_{i:03d}" for i in range(total)]
    rows = await billed(nats_url, database_url)
    assert [(r["request_id"], r["input_tokens"]) for r in rows] == [
        (f"msg_grpc_{i:03d}", 100 + i) for i in range(total)
    ]


# --- the recorded CLIs ---------------------------------------------------------------------------------


def recorded_requests(item: Recorded) -> list[tuple[str, ExportLogsServiceRequest | ExportMetricsServiceRequest]]:
    """A scenario's OTLP payloads (JSON as the CLI sent them, logs and metrics in file order) as gRPC messages."""
    out: list[tuple[str, ExportLogsServiceRequest | ExportMetricsServiceRequest]] = []
    for path in sorted((item.folder / "otlp").glob("*.json")):
        if path.stem.endswith("-logs"):
            out.append(("logs", parse_request(ExportLogsServiceRequest(), path.read_bytes(), "json")))
        else:
            out.append(("metrics", parse_request(ExportMetricsServiceRequest(), path.read_bytes(), "json")))
    return out


@pytest.mark.parametrize("item", SCENARIOS, ids=[item.id for item in SCENARIOS])
async def test_the_recorded_payloads_over_grpc_give_the_servers_usage(item: Recorded, nats_url: str) -> None:
    async with run_gateway(nats_url, map_logs=None, map_traces=None, publish_timeout_s=10.0) as gateway:
        token = await make_token(nats_url, PROFILE)
        await known(gateway, token)
        async with grpc.aio.insecure_channel(gateway.running.grpc_target) as channel:
            stubs: dict[str, Any] = {
                "logs": logs_stub(channel),
                "metrics": metrics_stub(channel),
            }
            for attempt in range(2):  # the second time as an exporter's retry: nothing new
                for signal, request in recorded_requests(item):
                    answer = await stubs[signal].Export(
                        request, metadata=auth(token), compression=grpc.Compression.Gzip
                    )
                    if signal == "logs":
                        partial = answer.partial_success
                        assert (partial.rejected_log_records, partial.error_message) == (0, ""), (item.id, attempt)
    calls = [e for e in await stored_events(nats_url) if isinstance(e, ModelCallCompleted)]
    answered = [c for c in item.calls() if not c.get("stalled")]
    assert len({c.event_id for c in calls}) == len(calls) == len(answered), item.id
    if item.cli == "claude-code":
        by_request = {str(c.request_id): c for c in calls}
        assert sorted(by_request) == sorted(c["request_id"] for c in answered), item.id
        for call in answered:
            assert buckets(by_request[call["request_id"]]) == expected(call), f"{item.id} call {call['call']}"
    else:
        # Codex names no call: the n-th call logged is the n-th the server answered.
        assert [buckets(c) for c in calls] == [expected(c) for c in answered], item.id
    assert all(c.model == call["model"] for c, call in zip(sorted_calls(calls, item), answered, strict=True))


def sorted_calls(calls: Sequence[ModelCallCompleted], item: Recorded) -> list[ModelCallCompleted]:
    """The calls in the order of the server's log (by request id for Claude Code, as logged for Codex)."""
    if item.cli != "claude-code":
        return list(calls)
    by_request = {str(c.request_id): c for c in calls}
    return [by_request[c["request_id"]] for c in item.calls() if not c.get("stalled")]


# --- a gRPC client on the OTLP/HTTP port -----------------------------------------------------------------


async def test_a_grpc_client_on_the_http_port_is_answered_and_counted_without_a_traceback(
    gateway: Gateway, token: str, nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    http_target = gateway.url.removeprefix("http://")
    caplog.set_level(logging.DEBUG)
    async with grpc.aio.insecure_channel(http_target) as channel:
        traces = trace_stub(channel)
        for _ in range(3):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await traces.Export(spans("one"), metadata=auth(token), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, refused.value
            details = refused.value.details() or ""
            assert "OTLP/HTTP" in details and f"port {gateway.running.grpc.port}" in details, details
    assert gateway.metric("cos_otlp_requests_total", {"signal": "other", "encoding": "grpc", "code": "400"}) >= 3
    assert gateway.metric("cos_otlp_refused_total", {"reason": "grpc_on_http_port"}) >= 3
    tracebacks = [r for r in caplog.records if r.exc_info is not None or r.levelno >= logging.ERROR]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]
    # The port still serves OTLP/HTTP.
    from tests.otlp_gateway.conftest import post

    answer = await post(
        gateway.url, "traces", spans("http").SerializeToString(), token=token, content_type="application/x-protobuf"
    )
    assert answer.status == 200
    assert [e.title for e in await stored_events(nats_url)] == ["http"]


async def test_two_gateways_cannot_share_a_grpc_port(nats_url: str) -> None:
    """gRPC turns SO_REUSEPORT on by default, which would let a second gateway (another `cos up`'s) bind the same
    port and take half of the first one's connections: the gateway turns it off, and the second fails to start."""
    async with run_gateway(nats_url) as first:
        with pytest.raises(OSError, match="address already in use"):
            async with run_gateway(nats_url, grpc_port=first.running.grpc.port):
                pass
