"""Trace context through JetStream, on real servers: events published inside a span carry its `traceparent`;
the journal-writer applies a batch of them inside a `process COS_EVENTS` span linked to every producer span
(a child of it when the batch holds one trace, a root span when it holds several), and a batch without any
trace context makes no span at all. The journal-writer and billing as processes, given
`OTEL_EXPORTER_OTLP_ENDPOINT`, export their spans (service.name theirs, the producer's trace) over OTLP/HTTP and
flush them when stopped."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime import telemetry
from commonos.runtime.embedded import free_port
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.factories import Clock, conversation
from tests.support import ServiceProcess, journal_writer, wait_caught_up, wait_for_position


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    exporter = InMemorySpanExporter()
    tel = telemetry.setup("commonos-test", span_exporter=exporter)
    assert tel is not None
    try:
        yield exporter
    finally:
        tel.close()


async def test_the_journal_writer_joins_the_traces_of_the_events_it_applies(
    spans: InMemorySpanExporter, nats_url: str, database_url: str
) -> None:
    rng, clock = random.Random(3), Clock()
    untraced, first, second = (conversation(rng, clock, turns=1) for _ in range(3))
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        publisher = EventPublisher(js, "urn:commonos:test")
        for event in untraced:
            await publisher.publish(event)
        async with journal_writer(nats_url, database_url):
            await wait_caught_up(js, database_url, "journal-writer")
        assert spans.get_finished_spans() == ()  # nothing traced, nothing recorded

        tracer = telemetry.tracer()
        assert tracer is not None
        producers = []
        for events in (first, second):
            with tracer.start_as_current_span("producer") as producer:
                await publisher.publish_many(events)
            producers.append(producer.get_span_context())
        for seq in range(len(untraced) + 1, len(untraced) + len(first) + len(second) + 1):
            raw = await js.get_msg(EVENTS_STREAM, seq)
            ctx = producers[0] if seq <= len(untraced) + len(first) else producers[1]
            assert (raw.headers or {})["traceparent"] == (
                f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
            )
        spans.clear()
        async with journal_writer(nats_url, database_url):
            await wait_caught_up(js, database_url, "journal-writer")
    finally:
        await nc.close()

    batches = [s for s in spans.get_finished_spans() if s.name == "process COS_EVENTS"]
    assert batches
    linked = set()
    for span in batches:
        links = {(link.context.trace_id, link.context.span_id) for link in span.links}
        linked |= links
        traces = {trace_id for trace_id, _ in links}
        attributes = dict(span.attributes or {})
        assert attributes["messaging.consumer.group.name"] == "journal-writer"
        if len(traces) > 1:
            assert span.parent is None  # several traces: a root span, linked to each
        else:
            assert span.parent is not None and (span.parent.trace_id, span.parent.span_id) in links
    assert linked == {(p.trace_id, p.span_id) for p in producers}
    counts = [dict(s.attributes or {})["messaging.batch.message_count"] for s in batches]
    assert sum(int(str(n)) for n in counts) == len(first) + len(second)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[list[ExportTraceServiceRequest], str]]:
    """An OTLP/HTTP receiver of traces (protobuf), as any backend is; metrics are accepted and dropped."""
    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        received.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def metrics(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    app.router.add_post("/v1/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield received, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_the_services_export_their_spans_over_otlp_and_flush_them_when_stopped(
    spans: InMemorySpanExporter,
    receiver: tuple[list[ExportTraceServiceRequest], str],
    nats_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    received, url = receiver
    env = {
        "COS_NATS_URL": nats_url,
        "COS_DATABASE_URL": database_url,
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        # Longer than the test: what arrives was flushed by the services' shutdown.
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    }
    writer = ServiceProcess("commonos.journal_writer", env, tmp_path / "writer.log").start()
    billing = ServiceProcess("commonos.billing", env, tmp_path / "billing.log").start()
    try:
        events = conversation(random.Random(5), Clock(), turns=2)
        tracer = telemetry.tracer()
        assert tracer is not None
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await ensure_streams(js)
            with tracer.start_as_current_span("producer") as producer:
                acks = await EventPublisher(js, "urn:commonos:test").publish_many(events)
            await wait_for_position(database_url, "journal-writer", acks[-1].seq)
            await wait_caught_up(js, database_url, "billing", table="billing_positions")
        finally:
            await nc.close()
        assert await asyncio.to_thread(writer.terminate) == 0, writer.output()
        assert await asyncio.to_thread(billing.terminate) == 0, billing.output()
    finally:
        for process in (writer, billing):
            if process.alive:
                process.kill()
    trace_id = producer.get_span_context().trace_id.to_bytes(16, "big")
    services: dict[str, int] = {}
    for request in received:
        for rs in request.resource_spans:
            name = next(kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name")
            for ss in rs.scope_spans:
                for span in ss.spans:
                    assert span.name == "process COS_EVENTS"
                    assert span.trace_id == trace_id
                    services[name] = services.get(name, 0) + 1
    assert set(services) == {"commonos-journal-writer", "commonos-billing"}, services
