"""OpenTelemetry for our services: traces and metrics exported over OTLP/HTTP, and the W3C trace context
carried in our NATS headers.

Configured from the standard `OTEL_*` environment variables, and only when an endpoint is given:
`OTEL_EXPORTER_OTLP_ENDPOINT` (traces to `<endpoint>/v1/traces`, metrics to `<endpoint>/v1/metrics`) or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (traces only, unless `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set too).
Without one nothing is configured: no SDK is imported, no span is made, no header is added — the cost is
one `None` check. `OTEL_SDK_DISABLED=true` turns it off whatever the endpoints; `OTEL_TRACES_EXPORTER=none`
or `OTEL_METRICS_EXPORTER=none` turn off one signal. The exporter's own variables (`OTEL_EXPORTER_OTLP_HEADERS`,
`..._TIMEOUT`, `..._COMPRESSION`, `..._CERTIFICATE`), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*` and
`OTEL_METRIC_EXPORT_INTERVAL` are read by the SDK as usual. `service.name` is the service's own
(`commonos-loop`, `commonos-journal-writer`, `commonos-billing`) unless `OTEL_SERVICE_NAME` (or a
`service.name` in `OTEL_RESOURCE_ATTRIBUTES`) says otherwise. The protocol is OTLP/HTTP with protobuf
(`http/protobuf`, what every OTLP receiver takes); another `OTEL_EXPORTER_OTLP_PROTOCOL` is warned about.

Trace context in events: `inject` adds `traceparent` (and `tracestate` when there is one) of the current
span to an event's headers, so an event published inside a span says which span produced it; `extract`
reads it back. A consumer's batch joins the trace (`consumer_batch_span`).

The providers are this module's own (`tracer`, `meter`), not the OpenTelemetry globals, so a test can
install an in-memory exporter (`setup(span_exporter=...)`) and a service started in the same process
uses it instead of configuring its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from commonos.proto.cloudevents import TRACEPARENT, TRACESTATE

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Meter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

#: The longest `tracestate` passed on (the W3C limit is 32 members; 512 characters is what a vendor may
#: truncate to): the headers must fit one message.
MAX_TRACESTATE: Final = 512
#: Opt-in to record content (messages, tool arguments and results) on GenAI spans.
CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: The instrumentation scope of our spans and metrics.
SCOPE: Final = "commonos"
#: Links kept on one consumer batch span (the SDK's default link limit).
MAX_LINKS: Final = 128


def _on(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def _set(env: Mapping[str, str], name: str) -> bool:
    return bool((env.get(name) or "").strip())


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces: an OTLP endpoint is set and the SDK is not disabled."""
    env = os.environ if env is None else env
    if _on(env.get("OTEL_SDK_DISABLED")):
        return False
    return _set(env, "OTEL_EXPORTER_OTLP_ENDPOINT") or _set(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@dataclass
class Telemetry:
    """The SDK's providers while telemetry is on (`setup`); `close` flushes and shuts them down."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider | None
    service_name: str
    capture_content: bool = False
    #: How many `setup` calls share it: the last `close` shuts it down.
    users: int = 1
    _tracers: dict[str, Tracer] = field(default_factory=dict)

    def tracer(self, name: str = SCOPE) -> Tracer:
        tracer = self._tracers.get(name)
        if tracer is None:
            tracer = self._tracers[name] = self.tracer_provider.get_tracer(name)
        return tracer

    def flush(self, timeout_ms: int = 10_000) -> None:
        self.tracer_provider.force_flush(timeout_ms)
        if self.meter_provider is not None:
            self.meter_provider.force_flush(timeout_ms)

    async def aclose(self) -> None:
        """`close` off the event loop (exporting what is buffered is a blocking HTTP request)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Give up one `setup`: the last one flushes what is buffered and shuts the providers down."""
        global _active
        self.users -= 1
        if self.users > 0:
            self.flush()
            return
        if _active is self:
            _active = None
        try:
            self.tracer_provider.shutdown()
        finally:
            if self.meter_provider is not None:
                self.meter_provider.shutdown()


#: The telemetry of this process, or None (the default: nothing configured).
_active: Telemetry | None = None


def active() -> Telemetry | None:
    """This process's telemetry, or None when it is off."""
    return _active


@contextlib.asynccontextmanager
async def serving(service_name: str) -> AsyncIterator[Telemetry | None]:
    """Telemetry while a service runs (`setup` with the environment's settings), flushed and shut down off the
    event loop when it stops, however it stops."""
    tel = setup(service_name)
    try:
        yield tel
    finally:
        if tel is not None:
            await tel.aclose()


def setup(
    service_name: str,
    *,
    env: Mapping[str, str] | None = None,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
) -> Telemetry | None:
    """Turn telemetry on for this process if the environment asks for it (`wanted`), or with the exporter
    given (tests: an in-memory exporter, spans exported as each ends); None when it stays off.

    Telemetry already on (an earlier `setup` in the process) is shared, not replaced: the caller gets it
    and must `close` it as well. `service_name` is the default `service.name` of the resource.
    """
    global _active
    env = os.environ if env is None else env
    if _active is not None:
        _active.users += 1
        return _active
    if span_exporter is None and not wanted(env):
        return None
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    resource = Resource.create({SERVICE_NAME: service_name} if _default_service_name(env) else {})
    tracer_provider = TracerProvider(resource=resource)
    if span_exporter is not None:
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif (env.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower() != "none":
        _check_protocol(env, "TRACES")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    meter_provider = _meter_provider(env, resource, metric_reader, span_exporter is not None)
    _active = Telemetry(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        service_name=str(resource.attributes.get(SERVICE_NAME, service_name)),
        capture_content=_on(env.get(CAPTURE_CONTENT_ENV)),
    )
    log.info(
        "OpenTelemetry on: service.name=%s, traces%s exported over OTLP/HTTP%s",
        _active.service_name,
        " and metrics" if meter_provider is not None else "",
        ", with message content" if _active.capture_content else "",
    )
    return _active


def _default_service_name(env: Mapping[str, str]) -> bool:
    """Whether the service's own name is used: neither OTEL_SERVICE_NAME nor a service.name attribute is set."""
    if _set(env, "OTEL_SERVICE_NAME"):
        return False
    attributes = env.get("OTEL_RESOURCE_ATTRIBUTES") or ""
    return not any(part.split("=", 1)[0].strip() == "service.name" for part in attributes.split(","))


def _check_protocol(env: Mapping[str, str], signal: str) -> None:
    protocol = env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    protocol = protocol.strip()
    if protocol and protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported: exporting with http/protobuf", protocol)


def _meter_provider(
    env: Mapping[str, str], resource: Any, reader: MetricReader | None, testing: bool
) -> MeterProvider | None:
    from opentelemetry.sdk.metrics import MeterProvider

    if reader is None:
        if testing or (env.get("OTEL_METRICS_EXPORTER") or "otlp").strip().lower() == "none":
            return None
        if not (_set(env, "OTEL_EXPORTER_OTLP_ENDPOINT") or _set(env, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")):
            return None  # a traces endpoint alone says nothing about where metrics go
        _check_protocol(env, "METRICS")
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    return MeterProvider(resource=resource, metric_readers=[reader])


def tracer(name: str = SCOPE) -> Tracer | None:
    """A tracer of this process's telemetry, or None when it is off."""
    return _active.tracer(name) if _active is not None else None


def meter(name: str = SCOPE) -> Meter | None:
    """A meter of this process's telemetry, or None when it is off or exports no metrics."""
    if _active is None or _active.meter_provider is None:
        return None
    return _active.meter_provider.get_meter(name)


def capture_content() -> bool:
    """Whether spans may carry content (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`)."""
    return _active is not None and _active.capture_content


# -- trace context in headers ---------------------------------------------------------------------------


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to `headers`; nothing outside a span or
    when telemetry is off."""
    if _active is None:
        return
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return
    headers[TRACEPARENT] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    state = context.trace_state.to_header() if context.trace_state else ""
    if state and len(state) <= MAX_TRACESTATE:
        headers[TRACESTATE] = state


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The remote span context `headers` carry (`traceparent`, `tracestate`) as a Context, or None when they
    carry none (or a malformed one)."""
    if not headers or TRACEPARENT not in headers:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract(
        {k: v for k, v in headers.items() if k in (TRACEPARENT, TRACESTATE)}
    )
    return context if trace.get_current_span(context).get_span_context().is_valid else None


@contextlib.contextmanager
def consumer_batch_span(
    consumer: str, stream: str, headers: Sequence[Mapping[str, str] | None]
) -> Iterator[Span | None]:
    """A span for a consumer's batch whose events carry a trace context (None otherwise, and when telemetry
    is off): `process <stream>`, kind CONSUMER, linked to the span that published each event. When the
    events all come from one trace, the span is a child of the first event's producer, so the consumer's
    work shows in that trace; events of several traces make it a root span with the links only."""
    tracer_ = tracer()
    if tracer_ is None:
        yield None
        return
    from opentelemetry import trace

    parents = []
    seen: set[tuple[int, int]] = set()
    for h in headers:
        context = extract(h)
        if context is None:
            continue
        span_context = trace.get_current_span(context).get_span_context()
        key = (span_context.trace_id, span_context.span_id)
        if key not in seen:
            seen.add(key)
            parents.append((context, span_context))
    if not parents:
        yield None
        return
    one_trace = len({sc.trace_id for _, sc in parents}) == 1
    parent = parents[0][0] if one_trace else trace.set_span_in_context(trace.INVALID_SPAN)
    with tracer_.start_as_current_span(
        f"process {stream}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=[trace.Link(sc) for _, sc in parents[:MAX_LINKS]],
        attributes={
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": stream,
            "messaging.consumer.group.name": consumer,
            "messaging.batch.message_count": len(headers),
        },
    ) as span:
        yield span
