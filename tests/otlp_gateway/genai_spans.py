"""Building OTLP trace requests by hand for the GenAI mapping's tests (the official protobuf messages)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from commonos.journal_writer.projection import check_event
from commonos.otlp_gateway.common import Mapped
from commonos.proto import events as ev

T0 = 1_764_000_000_000_000_000  # nanoseconds since the epoch
S = 1_000_000_000  # one second in nanoseconds


def value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, str):
        return AnyValue(string_value=v)
    if isinstance(v, list | tuple):
        return AnyValue(array_value=ArrayValue(values=[value(x) for x in v]))
    if isinstance(v, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=value(x)) for k, x in v.items()]))
    raise TypeError(v)


def kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=value(v)) for k, v in attrs.items()]


def span(
    span_id: int,
    parent: int | None,
    attrs: dict[str, Any],
    *,
    start: float = 0,
    end: float = 1,
    trace: int = 1,
    name: str | None = None,
    error: str | None = None,
) -> Span:
    """A span of trace `trace` (ids are small integers), times in seconds from T0."""
    return Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span_id.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name or f"{attrs.get('gen_ai.operation.name', 'other')} {span_id}",
        start_time_unix_nano=T0 + int(start * S),
        end_time_unix_nano=T0 + int(end * S),
        attributes=kvs(attrs),
        status=Status(code=Status.STATUS_CODE_ERROR, message=error) if error is not None else Status(),
    )


def request(*spans: Span, resource: dict[str, Any] | None = None) -> ExportTraceServiceRequest:
    res = {"service.name": "agent-app"} if resource is None else resource
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=Resource(attributes=kvs(res)), scope_spans=[ScopeSpans(spans=spans)])]
    )


def agent(span_id: int, /, **attrs: Any) -> dict[str, Any]:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": f"agent-{span_id}", **attrs}


def chat(**attrs: Any) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5",
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 10,
        **attrs,
    }


def tool(name: str = "search", /, **attrs: Any) -> dict[str, Any]:
    return {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": "call_1", **attrs}


def of_type(mapped: Mapped | Sequence[ev.EventBase], kind: type[Any]) -> list[Any]:
    events = mapped.events if isinstance(mapped, Mapped) else mapped
    return [e for e in events if isinstance(e, kind)]


def checked(mapped: Mapped) -> Mapped:
    """`mapped`, after checking every event passes the journal-writer's invariants and round-trips."""
    for event in mapped.events:
        check_event(event)  # type: ignore[arg-type]
        assert ev.decode_event(ev.encode_event(event)) == event
    return mapped
