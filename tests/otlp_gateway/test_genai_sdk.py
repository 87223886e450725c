"""GenAI spans made by the real OpenTelemetry SDK, encoded by the official OTLP exporter's encoder
(`encode_spans`, what the OTLP/HTTP protobuf exporter sends), sent through the wire format and mapped."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from commonos.billing.projection import check_model_call
from commonos.otlp_gateway.common import Mapped, Source
from commonos.otlp_gateway.genai import map_spans
from commonos.proto import events as ev
from commonos.proto.graph.ids import mint_id
from tests.otlp_gateway.genai_spans import checked, of_type

SOURCE = Source("acme")


def agent_run() -> tuple[list[ReadableSpan], str]:
    """An agent (conversation `conv-sdk`) that calls a model, runs a tool that fails, and delegates to a
    researcher agent that calls a model in turn. Returns the finished spans, in the order they ended."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-agent", "client": "acme", "team": "ml"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests.genai")
    conversation = {"gen_ai.conversation.id": "conv-sdk"}
    with tracer.start_as_current_span(
        "invoke_agent planner",
        kind=SpanKind.INTERNAL,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner", **conversation},
    ) as root:
        trace_id = format(root.get_span_context().trace_id, "032x")
        with tracer.start_as_current_span(
            "chat claude-sonnet-4-5",
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "anthropic",
                "gen_ai.request.model": "claude-sonnet-4-5",
                **conversation,
            },
        ) as chat:
            chat.set_attribute("gen_ai.response.model", "claude-sonnet-4-5-20250929")
            chat.set_attribute("gen_ai.response.id", "msg_sdk_1")
            chat.set_attribute("gen_ai.response.finish_reasons", ["tool_use"])
            chat.set_attribute("gen_ai.usage.input_tokens", 12_000)  # all of it, cached or not
            chat.set_attribute("gen_ai.usage.cache_read.input_tokens", 10_000)
            chat.set_attribute("gen_ai.usage.cache_creation.input_tokens", 1_500)
            chat.set_attribute("gen_ai.usage.output_tokens", 800)
            chat.set_attribute("gen_ai.usage.reasoning.output_tokens", 300)
        with tracer.start_as_current_span(
            "execute_tool fetch",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "fetch",
                "gen_ai.tool.call.id": "toolu_1",
                "gen_ai.tool.call.arguments": '{"url": "https://example.com"}',
                **conversation,
            },
        ) as fetch:
            fetch.set_attribute("error.type", "TimeoutError")
            fetch.set_status(Status(StatusCode.ERROR, "timed out"))
        with (
            tracer.start_as_current_span(
                "execute_tool delegate",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "delegate",
                    "gen_ai.tool.call.id": "toolu_2",
                    **conversation,
                },
            ),
            tracer.start_as_current_span(
                "invoke_agent researcher",
                attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher", **conversation},
            ),
            tracer.start_as_current_span(
                "chat gpt-4o",
                kind=SpanKind.CLIENT,
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 500,
                    "gen_ai.usage.cache_read.input_tokens": 128,
                    "gen_ai.usage.output_tokens": 40,
                    **conversation,
                },
            ),
        ):
            pass
    provider.shutdown()
    return list(exporter.get_finished_spans()), trace_id


def wire(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """What the OTLP/HTTP protobuf exporter sends, parsed back as the gateway parses it."""
    parsed = ExportTraceServiceRequest()
    parsed.ParseFromString(encode_spans(spans).SerializeToString())
    return parsed


def mapped_of(spans: Sequence[ReadableSpan]) -> Mapped:
    mapped = checked(map_spans(wire(spans), SOURCE))
    assert (mapped.rejected, mapped.errors) == (0, [])
    return mapped


def test_an_sdk_agent_run_maps_end_to_end() -> None:
    spans, trace_id = agent_run()
    mapped = mapped_of(spans)
    session = uuid.UUID(mint_id("session", "otel", "acme", "conv-sdk"))
    assert {e.session_id for e in mapped.events} == {session}
    (created,) = of_type(mapped, ev.SessionCreated)
    assert (created.source, created.tags) == ("otel", ("client:acme", "team:ml"))

    by_name = {s.name: s for s in spans}

    def turn(name: str) -> uuid.UUID:
        span_id = format(by_name[name].context.span_id, "016x")
        return uuid.UUID(mint_id("turn", "otel", "acme", trace_id, span_id))

    turns = {t.turn_id: t for t in of_type(mapped, ev.TurnStarted)}
    planner, researcher = turns[turn("invoke_agent planner")], turns[turn("invoke_agent researcher")]
    assert (planner.depth, planner.parent_turn_id) == (0, None)
    assert (researcher.depth, researcher.parent_turn_id) == (1, planner.turn_id)  # delegation
    assert {f.turn_id: f.status for f in of_type(mapped, ev.TurnFinished)} == {
        planner.turn_id: ev.TurnStatus.COMPLETED,
        researcher.turn_id: ev.TurnStatus.COMPLETED,
    }

    claude, gpt = of_type(mapped, ev.ModelCallCompleted)
    assert (claude.turn_id, gpt.turn_id) == (planner.turn_id, researcher.turn_id)
    assert (claude.provider, claude.model, claude.request_id, claude.stop_reason) == (
        "anthropic",
        "claude-sonnet-4-5-20250929",
        "msg_sdk_1",
        "tool_use",
    )
    # 12,000 input tokens of which 10,000 read from the cache and 1,500 written to it: 500 uncached.
    assert (claude.input_tokens, claude.cache_read_tokens, claude.cache_write_5m_tokens) == (500, 10_000, 1_500)
    assert (claude.output_tokens, claude.reasoning_tokens) == (800, 300)
    assert (gpt.input_tokens, gpt.cache_read_tokens, gpt.output_tokens) == (372, 128, 40)
    sdk_chat = by_name["chat claude-sonnet-4-5"]
    assert sdk_chat.start_time is not None and sdk_chat.end_time is not None
    assert claude.latency_s == (sdk_chat.end_time - sdk_chat.start_time) / 1e9
    for call in (claude, gpt):
        check_model_call(call)
        assert call.tags == ("client:acme", "team:ml")

    fetch, delegate = of_type(mapped, ev.ToolCallRecorded)
    assert (fetch.name, fetch.call_id, fetch.is_error, fetch.args) == (
        "fetch",
        "toolu_1",
        True,
        {"url": "https://example.com"},
    )
    assert (delegate.name, delegate.is_error, delegate.turn_id) == ("delegate", False, planner.turn_id)


def test_an_sdk_trace_split_across_exports_in_either_order_is_the_same_calls() -> None:
    spans, _ = agent_run()
    whole = mapped_of(spans)
    # The SDK hands spans to its exporter as they end: children first, the long-running agent last.
    assert spans[-1].name == "invoke_agent planner"
    for cut in range(1, len(spans)):
        for first, second in ((spans[:cut], spans[cut:]), (spans[cut:], spans[:cut])):
            events = mapped_of(first).events + mapped_of(second).events
            calls = (ev.ModelCallCompleted, ev.ToolCallRecorded, ev.TurnFinished)
            assert sorted(ev.encode_event(e) for e in events if isinstance(e, calls)) == sorted(
                ev.encode_event(e) for e in whole.events if isinstance(e, calls)
            )
            # Turns: the same ids, the placeholders sharing the agents' turn_started event ids.
            assert {e.event_id for e in events} == {e.event_id for e in whole.events}
            assert {e.turn_id for e in of_type(events, ev.TurnStarted)} == {
                e.turn_id for e in of_type(whole, ev.TurnStarted)
            }
