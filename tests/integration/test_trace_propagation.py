"""Trace context through JetStream, on real servers: events published inside a span carry its `traceparent`;
the journal-writer applies a batch of them inside a `process COS_EVENTS` span linked to every producer span
(a child of it when the batch holds one trace, a root span when it holds several), and a batch without any
trace context makes no span at all."""

from __future__ import annotations

import random
from collections.abc import Iterator

import nats
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime import telemetry
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.factories import Clock, conversation
from tests.support import journal_writer, wait_caught_up


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
