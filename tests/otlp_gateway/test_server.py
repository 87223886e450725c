"""The OTLP/HTTP receiver on a real nats-server: encodings, partial success, refusals, NATS away, ordinals."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import uuid
from pathlib import Path
from typing import Any

import nats
from google.protobuf import json_format  # type: ignore[import-untyped]
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from commonos.otlp_gateway.ordinals import KvOrdinals, state_bucket
from commonos.runtime.embedded import NatsServer
from commonos.runtime.nats import ensure_streams
from tests.otlp_gateway.conftest import NAMESPACE, Gateway, make_token, post, run_gateway, stored_events
from tests.support import wait_until

PB = "application/x-protobuf"
JSON = "application/json"
CLIENTS = Path(__file__).resolve().parents[1] / "fixtures" / "clients"


def spans(*names: str, trace: bytes = b"\x01" * 16) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                scope_spans=[
                    ScopeSpans(
                        spans=[
                            Span(
                                trace_id=trace,
                                span_id=i.to_bytes(8, "big"),
                                name=name,
                                start_time_unix_nano=1_700_000_000_000_000_000,
                            )
                            for i, name in enumerate(names, start=1)
                        ]
                    )
                ]
            )
        ]
    )


def logs(session: str, *bodies: str) -> ExportLogsServiceRequest:
    records = [
        LogRecord(
            body=AnyValue(string_value=b),
            attributes=[KeyValue(key="session.id", value=AnyValue(string_value=session))],
        )
        for b in bodies
    ]
    return ExportLogsServiceRequest(resource_logs=[ResourceLogs(scope_logs=[ScopeLogs(log_records=records)])])


def otlp_json(message: ExportTraceServiceRequest) -> bytes:
    """OTLP JSON of a request: protobuf's JSON with the trace and span ids in hex."""

    def hexed(node: object) -> object:
        if isinstance(node, dict):
            return {
                k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hexed(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [hexed(v) for v in node]
        return node

    return json.dumps(hexed(json_format.MessageToDict(message))).encode()


def span_event_id(trace: bytes, span: int) -> uuid.UUID:
    return uuid.uuid5(NAMESPACE, trace.hex() + span.to_bytes(8, "big").hex())


async def test_protobuf_json_and_gzip_requests_are_stored_and_answered_in_their_encoding(
    gateway: Gateway, token: str, nats_url: str
) -> None:
    answer = await post(gateway.url, "traces", spans("a", "b").SerializeToString(), token=token, content_type=PB)
    assert answer.status == 200, answer.body
    assert answer.headers["Content-Type"] == PB
    response = ExportTraceServiceResponse.FromString(answer.body)
    assert not response.HasField("partial_success")

    # OTLP JSON: hex ids, an enum as a number, an unknown field.
    trace = bytes(range(16))
    body = json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {"attributes": [], "entityRefs": [{"type": "x"}]},
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": trace.hex(),
                                    "spanId": (7).to_bytes(8, "big").hex(),
                                    "parentSpanId": "",
                                    "name": "json span",
                                    "kind": 3,
                                    "startTimeUnixNano": "1700000000000000000",
                                    "someFutureField": True,
                                }
                            ]
                        }
                    ],
                }
            ]
        }
    ).encode()
    answer = await post(gateway.url, "traces", body, token=token, content_type="application/json; charset=utf-8")
    assert answer.status == 200, answer.body
    assert answer.headers["Content-Type"] == JSON
    assert json.loads(answer.body) == {}

    zipped = gzip.compress(spans("c", trace=b"\x02" * 16).SerializeToString())
    answer = await post(
        gateway.url, "traces", zipped, token=token, content_type=PB, headers={"Content-Encoding": "gzip"}
    )
    assert answer.status == 200, answer.body

    ids = [e.event_id for e in await stored_events(nats_url)]
    assert ids == [
        span_event_id(b"\x01" * 16, 1),
        span_event_id(b"\x01" * 16, 2),
        span_event_id(trace, 7),
        span_event_id(b"\x02" * 16, 1),
    ]
    assert gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "protobuf", "code": "200"}) == 2
    assert gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "json", "code": "200"}) == 1
    assert gateway.metric("cos_otlp_records_total", {"signal": "traces", "outcome": "accepted"}) == 4
    assert gateway.metric("cos_otlp_events_published_total", {"type": "session_created"}) == 4
    assert gateway.metric("cos_otlp_lag_seconds_count", {"signal": "traces"}) == 4
    assert gateway.metric("cos_otlp_request_seconds_count", {"signal": "traces"}) == 3


async def test_partial_success_names_the_refused_records(gateway: Gateway, token: str, nats_url: str) -> None:
    answer = await post(
        gateway.url, "traces", spans("ok", "bad", "ignore").SerializeToString(), token=token, content_type=PB
    )
    assert answer.status == 200
    partial = ExportTraceServiceResponse.FromString(answer.body).partial_success
    assert partial.rejected_spans == 1
    assert "span 'bad' refused" in partial.error_message
    # In JSON too (int64 as a string, lowerCamelCase keys).
    answer = await post(
        gateway.url, "traces", otlp_json(spans("bad", trace=b"\x03" * 16)), token=token, content_type=JSON
    )
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["partialSuccess"]["rejectedSpans"] in ("1", 1)
    assert len(await stored_events(nats_url)) == 1
    for outcome, count in (("accepted", 1), ("rejected", 2), ("ignored", 1)):
        assert gateway.metric("cos_otlp_records_total", {"signal": "traces", "outcome": outcome}) == count


async def test_bad_bodies_unknown_types_and_oversized_bodies_are_refused(
    gateway_factory: object, nats_url: str
) -> None:
    async with run_gateway(nats_url, max_body_bytes=4096) as gateway:
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        cases = [
            (b"\xff\xff\xff", PB, {}, 400, "bad_request"),
            (b"{not json", JSON, {}, 400, "bad_request"),
            (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', JSON, {}, 400, "bad_request"),
            (b"[]", JSON, {}, 400, "bad_request"),
            (b"hello", "text/plain", {}, 415, "unsupported_media_type"),
            (b"\x00", PB, {"Content-Encoding": "br"}, 415, "unsupported_media_type"),
            (b"x" * 5000, PB, {}, 413, "too_large"),
            # A gzip bomb: 100 KiB of zeros in a few hundred bytes, refused once inflated past the limit.
            (gzip.compress(b"\x00" * 100_000), PB, {"Content-Encoding": "gzip"}, 413, "too_large"),
            (gzip.compress(b"\x0a\x00")[:-6], PB, {"Content-Encoding": "gzip"}, 400, "bad_request"),
        ]
        for body, content_type, headers, status, _reason in cases:
            answer = await post(gateway.url, "traces", body, token=token, content_type=content_type, headers=headers)
            assert answer.status == status, (body[:40], answer.status, answer.body)
            if status != 415:
                kind = answer.headers["Content-Type"]
                decoded = (
                    json_format.Parse(answer.body, status_pb2.Status())
                    if kind == JSON
                    else status_pb2.Status.FromString(answer.body)
                )
                assert decoded.message, body[:40]
        for reason, count in (("bad_request", 5), ("unsupported_media_type", 2), ("too_large", 2)):
            assert gateway.metric("cos_otlp_refused_total", {"reason": reason}) == count
        assert await stored_events(nats_url) == []


async def test_a_gzip_body_of_several_members_is_read_whole_or_refused(nats_url: str) -> None:
    """RFC 1952 lets a gzip body be several members one after the other (`gzip a; gzip b; cat`): every member's
    records are stored, the body limit holds across all of them, and anything after the last member that is
    no gzip member is refused: never a 200 for records not stored."""
    first = spans("a", trace=b"\x0a" * 16).SerializeToString()
    second = spans("b", "c", trace=b"\x0b" * 16).SerializeToString()
    async with run_gateway(nats_url, max_body_bytes=4096) as gateway:
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        zipped = {"Content-Encoding": "gzip"}
        answer = await post(
            gateway.url,
            "traces",
            gzip.compress(first) + gzip.compress(second),
            token=token,
            content_type=PB,
            headers=zipped,
        )
        assert answer.status == 200, answer.body
        assert not ExportTraceServiceResponse.FromString(answer.body).HasField("partial_success")
        assert [e.event_id for e in await stored_events(nats_url)] == [
            span_event_id(b"\x0a" * 16, 1),
            span_event_id(b"\x0b" * 16, 1),
            span_event_id(b"\x0b" * 16, 2),
        ]
        # Each member within the limit, the two together over it; a second member cut short; bytes that are
        # no gzip member after the first.
        half = gzip.compress(b"\x00" * 3000)
        for body, status in (
            (half + half, 413),
            (gzip.compress(first) + gzip.compress(second)[:-6], 400),
            (gzip.compress(first) + b"trailing bytes", 400),
        ):
            answer = await post(gateway.url, "traces", body, token=token, content_type=PB, headers=zipped)
            assert answer.status == status, (body[-20:], answer.status, answer.body)
            assert status_pb2.Status.FromString(answer.body).message
        assert len(await stored_events(nats_url)) == 3


async def test_real_client_payloads_are_decoded(gateway: Gateway, token: str) -> None:
    """The JSON the real Claude Code and Codex CLIs sent (tests/fixtures/clients), logs and metrics."""
    files = sorted(CLIENTS.glob("*/*/otlp/*.json"))
    assert files
    log_records = points = 0
    for path in files:
        signal = "logs" if path.stem.endswith("logs") else "metrics"
        body = path.read_bytes()
        if signal == "logs":
            parsed = json_format.Parse(
                json.dumps(_hex_free(json.loads(body))), ExportLogsServiceRequest(), ignore_unknown_fields=True
            )
            log_records += sum(len(s.log_records) for r in parsed.resource_logs for s in r.scope_logs)
        else:
            parsed_metrics = json_format.Parse(body, ExportMetricsServiceRequest(), ignore_unknown_fields=True)
            points += sum(
                len(getattr(m, m.WhichOneof("data")).data_points)
                for r in parsed_metrics.resource_metrics
                for s in r.scope_metrics
                for m in s.metrics
            )
        answer = await post(gateway.url, signal, body, token=token, content_type=JSON)
        assert answer.status == 200, (path, answer.body)
    assert gateway.metric("cos_otlp_records_total", {"signal": "logs", "outcome": "accepted"}) == log_records
    assert gateway.metric("cos_otlp_records_total", {"signal": "metrics", "outcome": "accepted"}) == points
    # The clients' own metrics, exposed by profile, never as events.
    usage = gateway.metric(
        "cos_otlp_client_metric",
        {
            "metric": "claude_code.token.usage",
            "profile": "otlp-test",
            "type": "input",
            "model": _a_claude_model(),
            "decision": "",
            "tool_name": "",
            "source": "",
        },
    )
    assert usage > 0


def _hex_free(node: object) -> object:
    """The recorded JSON with its (empty or hex) trace/span ids dropped, for protobuf's own JSON parser."""
    if isinstance(node, dict):
        return {k: _hex_free(v) for k, v in node.items() if k not in ("traceId", "spanId")}
    if isinstance(node, list):
        return [_hex_free(v) for v in node]
    return node


def _a_claude_model() -> str:
    for path in sorted(CLIENTS.glob("claude-code-*/*/otlp/*metrics.json")):
        parsed = json_format.Parse(path.read_bytes(), ExportMetricsServiceRequest(), ignore_unknown_fields=True)
        for r in parsed.resource_metrics:
            for s in r.scope_metrics:
                for m in s.metrics:
                    if m.name == "claude_code.token.usage":
                        for p in m.sum.data_points:
                            attrs = {kv.key: kv.value.string_value for kv in p.attributes}
                            if attrs.get("type") == "input":
                                return str(attrs["model"])
    raise AssertionError("no claude_code.token.usage input point in the fixtures")


async def test_nats_stopped_is_503_with_retry_after_then_the_retry_is_stored_once(
    nats_server: NatsServer, nats_url: str
) -> None:
    async with run_gateway(nats_url, publish_timeout_s=1.0, retry_after_s=3) as gateway:
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        first = spans("one", "two").SerializeToString()
        assert (await post(gateway.url, "traces", first, token=token, content_type=PB)).status == 200
        nats_server.stop()
        try:
            retried = spans("three", "four", trace=b"\x05" * 16).SerializeToString()
            for _ in range(2):
                answer = await post(gateway.url, "traces", retried, token=token, content_type=PB)
                assert answer.status == 503, answer.body
                assert answer.headers["Retry-After"] == "3"
                assert status_pb2.Status.FromString(answer.body).message
            logs_answer = await post(
                gateway.url, "logs", logs("s", "x").SerializeToString(), token=token, content_type=PB
            )
            assert logs_answer.status == 503
            assert "nats" in gateway.running.health.reasons()
        finally:
            nats_server.start()
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            answer = await post(gateway.url, "traces", retried, token=token, content_type=PB)
            if answer.status == 200:
                break
            assert answer.status == 503
            assert asyncio.get_running_loop().time() < deadline, "not stored within 30 s of NATS' restart"
            await asyncio.sleep(0.2)
        # Sent once more, as an exporter whose 200 was lost would: nothing stored twice.
        assert (await post(gateway.url, "traces", retried, token=token, content_type=PB)).status == 200
        assert gateway.metric("cos_otlp_refused_total", {"reason": "unavailable"}) >= 3
    ids = [e.event_id for e in await stored_events(nats_url)]
    assert len(ids) == len(set(ids)) == 4
    assert set(ids) >= {span_event_id(b"\x05" * 16, 1), span_event_id(b"\x05" * 16, 2)}


async def test_two_gateways_agree_on_ordinals_and_a_retry_gets_the_same(nats_url: str) -> None:
    async with run_gateway(nats_url) as a, run_gateway(nats_url) as b:
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        for gateway, bodies in ((a, ("c1", "c2")), (b, ("c2", "c3")), (a, ("c3", "c4")), (b, ("c1", "c4"))):
            answer = await post(
                gateway.url, "logs", logs("conv", *bodies).SerializeToString(), token=token, content_type=PB
            )
            assert answer.status == 200
            assert not ExportLogsServiceResponse.FromString(answer.body).HasField("partial_success")
    titles = [e.title for e in await stored_events(nats_url)]
    assert titles == ["0", "1", "2", "3"]


async def test_kv_ordinals_under_concurrent_replicas(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        first, second = KvOrdinals(await state_bucket(js)), KvOrdinals(await state_bucket(js))
        fingerprints = [f"fp-{i}" for i in range(12)]
        got = await asyncio.gather(*(o.ordinal("codex", "conv", fp) for fp in fingerprints for o in (first, second)))
        by_fp: dict[str, set[int]] = {}
        for (fp, _), ordinal in zip(((fp, o) for fp in fingerprints for o in (0, 1)), got, strict=True):
            by_fp.setdefault(fp, set()).add(ordinal)
        assert all(len(v) == 1 for v in by_fp.values()), by_fp
        assert sorted(next(iter(v)) for v in by_fp.values()) == list(range(12))
        assert await KvOrdinals(first.kv).ordinal("codex", "conv", "fp-3") == next(iter(by_fp["fp-3"]))
        assert await first.ordinal("codex", "other", "fp-3") == 0
    finally:
        await nc.close()


async def test_the_opentelemetry_sdk_exporters_protobuf_and_json_gzip_or_not(
    gateway: Gateway, token: str, nats_url: str
) -> None:
    """The Python SDK's own OTLP/HTTP span exporters (protobuf, and JSON with hex ids), gzip or not."""
    from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter as JsonSpanExporter
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

    endpoint = f"{gateway.url}/v1/traces"
    headers = {"Authorization": f"Bearer {token}"}
    exporters = [
        OTLPSpanExporter(endpoint=endpoint, headers=headers),
        OTLPSpanExporter(endpoint=endpoint, headers=headers, compression=Compression.Gzip),
        JsonSpanExporter(endpoint=endpoint, headers=headers),
    ]
    results: list[SpanExportResult] = []

    class Recording(SimpleSpanProcessor):
        def on_end(self, span: Any) -> None:
            results.append(self.span_exporter.export([span]))

    def send() -> list[str]:
        names = []
        for i, exporter in enumerate(exporters):
            provider = TracerProvider()
            provider.add_span_processor(Recording(exporter))
            with provider.get_tracer("test").start_as_current_span(f"span-{i}") as span:
                names.append(format(span.get_span_context().span_id, "016x"))
            provider.shutdown()
        return names

    span_ids = await asyncio.to_thread(send)
    assert results == [SpanExportResult.SUCCESS] * 3
    stored = await stored_events(nats_url)
    assert [e.title for e in stored] == ["span-0", "span-1", "span-2"]
    assert gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "json", "code": "200"}) == 1
    assert len(span_ids) == 3


async def test_a_failing_mapping_is_a_500_with_a_status(nats_url: str) -> None:
    def broken(request: ExportTraceServiceRequest, source: object) -> object:
        raise RuntimeError("boom")

    async with run_gateway(nats_url, map_traces=broken) as gateway:  # type: ignore[arg-type]
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        answer = await post(gateway.url, "traces", spans("a").SerializeToString(), token=token, content_type=PB)
        assert answer.status == 500
        assert "RuntimeError" in status_pb2.Status.FromString(answer.body).message
        assert (
            gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "protobuf", "code": "500"}) == 1
        )


async def test_nats_restarted_mid_stream_the_sdk_exporters_retries_land_every_span_once(
    nats_server: NatsServer, nats_url: str
) -> None:
    """The SDK's exporter sending span after span while NATS is stopped and started: it is answered 503 with
    Retry-After meanwhile, retries, and every span is stored once."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    total = 40
    async with run_gateway(nats_url, publish_timeout_s=1.0, retry_after_s=1) as gateway:
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        sent: list[int] = []

        def send() -> None:
            provider = TracerProvider()
            exporter = OTLPSpanExporter(
                endpoint=f"{gateway.url}/v1/traces", headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracer = provider.get_tracer("mid-stream")
            for i in range(total):
                with tracer.start_as_current_span(f"span-{i}"):
                    pass
                sent.append(i)
            provider.shutdown()

        sending = asyncio.create_task(asyncio.to_thread(send))
        await wait_until(lambda: len(sent) >= total // 4, timeout_s=60, what="a quarter of the spans sent")
        nats_server.stop()
        await asyncio.sleep(2.0)
        nats_server.start()
        await asyncio.wait_for(sending, 120)
        assert gateway.metric("cos_otlp_refused_total", {"reason": "unavailable"}) >= 1
    titles = [e.title for e in await stored_events(nats_url)]
    assert sorted(titles, key=lambda t: int(t.split("-")[1])) == [f"span-{i}" for i in range(total)]


def test_client_metrics_sums_gauges_and_histograms() -> None:
    """Cumulative sums kept per client stream and added up per label set, delta sums added, gauges latest,
    histograms as _count and _sum; session and user ids never labels."""
    from opentelemetry.proto.metrics.v1.metrics_pb2 import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )

    from commonos.otlp_gateway.metrics import ClientMetrics

    cumulative = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    delta = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA

    def attrs(**values: str) -> list[KeyValue]:
        return [KeyValue(key=k.replace("_", "."), value=AnyValue(string_value=v)) for k, v in values.items()]

    def request(session: str, tokens: int, cost: float, latency: float) -> ExportMetricsServiceRequest:
        metrics = [
            Metric(
                name="claude_code.token.usage",
                sum=Sum(
                    aggregation_temporality=cumulative,
                    data_points=[NumberDataPoint(as_int=tokens, attributes=attrs(session_id=session, type="input"))],
                ),
            ),
            Metric(
                name="codex.cost",
                sum=Sum(aggregation_temporality=delta, data_points=[NumberDataPoint(as_double=cost)]),
            ),
            Metric(name="queue.depth", gauge=Gauge(data_points=[NumberDataPoint(as_double=tokens)])),
            Metric(
                name="latency",
                histogram=Histogram(
                    aggregation_temporality=delta, data_points=[HistogramDataPoint(count=2, sum=latency)]
                ),
            ),
        ]
        return ExportMetricsServiceRequest(
            resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=metrics)])]
        )

    client = ClientMetrics()
    assert client.record(request("s1", 100, 0.5, 1.0), "p") == 4
    client.record(request("s1", 150, 0.25, 2.0), "p")  # s1's cumulative sum grew to 150
    client.record(request("s2", 10, 0.25, 3.0), "p")
    values = client.values()

    def value(metric: str, kind: str = "") -> float:
        return values[(metric, "p", kind, "", "", "", "")]

    assert value("claude_code.token.usage", "input") == 160
    assert value("codex.cost") == 1.0
    assert value("queue.depth") == 10
    assert (value("latency_count"), value("latency_sum")) == (6, 6.0)
    assert all("s1" not in labels for labels in values)
