"""The mapping's entry points: traces go to the GenAI mapper, logs of no known client are ignored (pure)."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from commonos.otlp_gateway import genai
from commonos.otlp_gateway.mapping import map_traces
from tests.otlp_gateway.logs import SOURCE, mapped, record, request


def test_map_traces_is_the_genai_mapper() -> None:
    empty = ExportTraceServiceRequest()
    assert map_traces(empty, SOURCE) == genai.map_spans(empty, SOURCE)
    assert map_traces(empty, SOURCE).events == []


async def test_logs_of_another_client_are_ignored() -> None:
    other = request(({"service.name": "my-app"}, "my.scope", [record("user_login", {"user": "x"}), record("", {})]))
    result = await mapped(other)
    assert (result.events, result.rejected, result.ignored) == ([], 0, 2)
