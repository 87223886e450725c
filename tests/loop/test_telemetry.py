"""The loop emits OpenTelemetry (issue #17, item 5), on real servers: a turn with a tool call and a delegated
child turn gives `invoke_agent`, `chat` and `execute_tool` spans nested as the turn ran, with the GenAI
attributes (tokens checked against the `model_call_completed` events) and our ids; every event published
inside a span carries its `traceparent`; the journal-writer's and billing's batches join the same trace;
the GenAI metrics are recorded; content only when opted in; and with the real OTLP/HTTP exporter the spans
and metrics reach an OTLP receiver (a small aiohttp server decoding the protobuf, standing in for any
OTLP backend). With no endpoint configured nothing is set up and no header is added.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from nats.aio.client import Client
from nats.js import JetStreamContext
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from commonos.loop.approvals import FixedApprover
from commonos.loop.journal import SessionNotFound
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.proto import events as ev
from commonos.proto.requests import ChatReply, ChatRequest, chat_subject
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime import telemetry
from commonos.runtime.embedded import free_port
from tests.billing.support import billing
from tests.loop.helpers import of_type, write_profile
from tests.support import journal_writer, wait_caught_up

SCRIPT = """
[[conversations]]
match = "find the answer"

[[conversations.steps]]
text = "42"
usage = { input_tokens = 20, output_tokens = 2, cache_read_tokens = 7 }

[[conversations]]
match = "plan"

[[conversations.steps]]
text = "Looking around."
tool_calls = [{ name = "list_dir", args = { path = "." } }]
[conversations.steps.usage]
input_tokens = 100
output_tokens = 10
cache_read_tokens = 50
cache_write_5m_tokens = 5
cache_write_1h_tokens = 3

[[conversations.steps]]
tool_calls = [{ name = "delegate", args = { goal = "Find the answer" } }]
usage = { input_tokens = 140, output_tokens = 14 }

[[conversations.steps]]
text = "Done: 42."
usage = { input_tokens = 150, output_tokens = 15, reasoning_tokens = 5 }
"""

CONFIG = """
tags = ["team:core"]
provider = "scripted"
model = "scripted-test"
system_prompt = "Be brief."
tools = ["list_dir", "delegate"]
max_steps = 5
max_delegation_depth = 1

[provider_options]
script = "script.toml"
"""


@pytest.fixture
def profile(tmp_path: Path) -> Profile:
    return write_profile(tmp_path / "profiles", config=CONFIG, script=SCRIPT)


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_SERVICE_NAME",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        telemetry.CAPTURE_CONTENT_ENV,
    ):
        monkeypatch.delenv(name, raising=False)


class InMemory:
    def __init__(self, tel: telemetry.Telemetry, spans: InMemorySpanExporter, metrics: InMemoryMetricReader) -> None:
        self.tel = tel
        self.spans = spans
        self.metrics = metrics


@pytest.fixture
def in_memory(no_otel_env: None) -> Iterator[InMemory]:
    """Telemetry on, through the module's own setup, with in-memory exporters."""
    assert telemetry.active() is None
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    tel = telemetry.setup("commonos-test", span_exporter=spans, metric_reader=metrics)
    assert tel is not None
    try:
        yield InMemory(tel, spans, metrics)
    finally:
        tel.close()
        assert telemetry.active() is None


def make_loop(js: JetStreamContext, profile: Profile) -> Loop:
    return Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=FixedApprover(None),
    )


async def stored_messages(js: JetStreamContext) -> list[tuple[ev.Event, dict[str, str]]]:
    """Every event in the stream with the headers it was published with."""
    info = await js.stream_info(EVENTS_STREAM)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        raw = await js.get_msg(EVENTS_STREAM, seq)
        assert raw.data is not None
        out.append((ev.decode_event(raw.data), dict(raw.headers or {})))
    return out


def by_name(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def span_id(span: ReadableSpan) -> int:
    ctx = span.get_span_context()
    assert ctx is not None
    return ctx.span_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def histogram_points(reader: InMemoryMetricReader, name: str) -> list[HistogramDataPoint]:
    data = reader.get_metrics_data()
    assert data is not None
    points: list[HistogramDataPoint] = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    points += [p for p in metric.data.data_points if isinstance(p, HistogramDataPoint)]
    return points


async def test_a_turn_with_a_tool_and_a_delegation_is_one_trace_joined_by_the_consumers(
    in_memory: InMemory, nc: Client, streams: JetStreamContext, nats_url: str, database_url: str, profile: Profile
) -> None:
    js = streams
    loop = make_loop(js, profile)
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="plan it"))
    assert result.status is ev.TurnStatus.COMPLETED and result.text == "Done: 42."

    loop_spans = list(in_memory.spans.get_finished_spans())
    turns = by_name(loop_spans, "invoke_agent ")
    chats = by_name(loop_spans, "chat ")
    tools = by_name(loop_spans, "execute_tool ")
    assert len(loop_spans) == len(turns) + len(chats) + len(tools)
    assert [s.name for s in turns] == ["invoke_agent demo", "invoke_agent demo"]  # the child ends first
    child_turn, root = turns
    assert root.parent is None
    trace_id = root.context.trace_id
    assert {s.context.trace_id for s in loop_spans} == {trace_id}
    assert sorted(s.name for s in chats) == ["chat scripted-test"] * 4
    assert sorted(s.name for s in tools) == ["execute_tool delegate", "execute_tool list_dir"]

    # The structure: chats and tools under their turn; the child turn under the delegate call.
    delegate = next(s for s in tools if s.name == "execute_tool delegate")
    list_dir = next(s for s in tools if s.name == "execute_tool list_dir")
    assert parent_id(list_dir) == parent_id(delegate) == span_id(root)
    assert parent_id(child_turn) == span_id(delegate)
    root_chats = [s for s in chats if parent_id(s) == span_id(root)]
    child_chats = [s for s in chats if parent_id(s) == span_id(child_turn)]
    assert len(root_chats) == 3 and len(child_chats) == 1

    stored = await stored_messages(js)
    events = [e for e, _ in stored]
    root_session, child_session = (s.session_id for s in of_type(events, ev.SessionCreated))
    turn_ids = {s.session_id: s.turn_id for s in of_type(events, ev.TurnStarted)}
    assert root_session == result.session_id and turn_ids[root_session] == result.turn_id

    # invoke_agent: the profile as the agent, the session as the conversation, our ids.
    for span, session in ((root, root_session), (child_turn, child_session)):
        a = attrs(span)
        assert a["gen_ai.operation.name"] == "invoke_agent"
        assert a["gen_ai.agent.name"] == "demo"
        assert a["gen_ai.conversation.id"] == str(session)
        assert a["gen_ai.provider.name"] == "scripted"
        assert a["gen_ai.request.model"] == "scripted-test"
        assert a["cos.session_id"] == str(session)
        assert a["cos.turn_id"] == str(turn_ids[session])
        assert a["cos.turn.status"] == "completed"
        assert span.status.is_ok
    assert attrs(root)["cos.turn.depth"] == 0 and attrs(child_turn)["cos.turn.depth"] == 1

    # chat: each is one model_call_completed (cos.event_id), its tokens in the conventions' meaning.
    calls = {c.event_id: c for c in of_type(events, ev.ModelCallCompleted)}
    assert len(calls) == 4
    assert {attrs(s)["cos.event_id"] for s in chats} == {str(i) for i in calls}
    for span in chats:
        a = attrs(span)
        call = calls[uuid.UUID(a["cos.event_id"])]
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == call.provider == "scripted"
        assert a["gen_ai.request.model"] == "scripted-test"
        assert a["gen_ai.response.model"] == call.model
        assert a["cos.session_id"] == str(call.session_id) and a["cos.turn_id"] == str(call.turn_id)
        cache_creation = call.cache_write_5m_tokens + call.cache_write_1h_tokens
        assert a["gen_ai.usage.input_tokens"] == call.input_tokens + call.cache_read_tokens + cache_creation
        assert a["gen_ai.usage.output_tokens"] == call.output_tokens
        assert a["gen_ai.usage.cache_read.input_tokens"] == call.cache_read_tokens
        assert a["gen_ai.usage.cache_creation.input_tokens"] == cache_creation
        if call.request_id:
            assert a["gen_ai.response.id"] == call.request_id
        if call.stop_reason:
            assert list(a["gen_ai.response.finish_reasons"]) == [call.stop_reason]
        assert "gen_ai.input.messages" not in a and "gen_ai.output.messages" not in a  # content is opt-in
    first = next(s for s in chats if attrs(s)["gen_ai.usage.cache_creation.input_tokens"] == 8)
    assert attrs(first)["gen_ai.usage.input_tokens"] == 100 + 50 + 5 + 3
    assert sum(attrs(s)["gen_ai.usage.input_tokens"] for s in chats) == 158 + 140 + 150 + 27

    # execute_tool: the tool, the vendor's call id, our tool_call_recorded's id.
    recorded = {t.event_id: t for t in of_type(events, ev.ToolCallRecorded)}
    assert {attrs(s)["cos.event_id"] for s in tools} == {str(i) for i in recorded}
    for span in tools:
        a = attrs(span)
        call_event = recorded[uuid.UUID(a["cos.event_id"])]
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert a["gen_ai.tool.name"] == call_event.name == span.name.removeprefix("execute_tool ")
        assert a["gen_ai.tool.call.id"] == call_event.call_id
        assert a["gen_ai.tool.type"] == "function"
        assert a["cos.tool_call_id"] == str(call_event.tool_call_id)
        assert "gen_ai.tool.call.arguments" not in a and "gen_ai.tool.call.result" not in a

    # Every event the loop published carries the traceparent of the span it was published in.
    span_of_event: dict[uuid.UUID, ReadableSpan] = {}
    for span in [*chats, *tools]:
        span_of_event[uuid.UUID(attrs(span)["cos.event_id"])] = span
    turn_span = {root_session: root, child_session: child_turn}
    for event, headers in stored:
        assert "traceparent" in headers, f"{ev.event_type(event)} has no traceparent"
        assert headers["traceparent"].split("-")[1] == f"{trace_id:032x}"
        if event.event_id in span_of_event:
            expected = span_of_event[event.event_id]
        elif isinstance(event, ev.SessionCreated | ev.TurnStarted | ev.TurnFinished):
            expected = turn_span[event.session_id]  # a session is created in the span of its first turn
        else:
            continue
        assert headers["traceparent"] == traceparent(expected), ev.event_type(event)

    # The journal-writer and billing apply them inside spans of the same trace, linked to the producers.
    in_memory.spans.clear()
    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        await wait_caught_up(js, database_url, "journal-writer")
        await wait_caught_up(js, database_url, "billing", table="billing_positions")
    consumer_spans = list(in_memory.spans.get_finished_spans())
    loop_ids = {span_id(s) for s in loop_spans}
    groups = {attrs(s)["messaging.consumer.group.name"] for s in consumer_spans}
    assert groups == {"journal-writer", "billing"}
    for span in consumer_spans:
        assert span.name == "process COS_EVENTS"
        assert span.kind.name == "CONSUMER"
        assert span.context.trace_id == trace_id
        assert parent_id(span) in loop_ids
        assert span.links and {link.context.span_id for link in span.links} <= loop_ids
        assert attrs(span)["messaging.system"] == "nats"
        assert attrs(span)["messaging.destination.name"] == EVENTS_STREAM

    # The GenAI metrics: one token record per call and type (input counting the cached), one duration per call.
    tokens = histogram_points(in_memory.metrics, "gen_ai.client.token.usage")
    by_type = {p.attributes["gen_ai.token.type"]: p for p in tokens if p.attributes}
    assert by_type["input"].count == 4 and by_type["input"].sum == 158 + 140 + 150 + 27
    assert by_type["output"].count == 4 and by_type["output"].sum == 10 + 14 + 15 + 2
    assert by_type["input"].attributes is not None
    assert by_type["input"].attributes["gen_ai.operation.name"] == "chat"
    assert by_type["input"].attributes["gen_ai.provider.name"] == "scripted"
    durations = histogram_points(in_memory.metrics, "gen_ai.client.operation.duration")
    assert sum(p.count for p in durations) == 4


async def test_content_is_recorded_only_when_opted_in(
    no_otel_env: None, monkeypatch: pytest.MonkeyPatch, streams: JetStreamContext, profile: Profile
) -> None:
    monkeypatch.setenv(telemetry.CAPTURE_CONTENT_ENV, "true")
    spans = InMemorySpanExporter()
    tel = telemetry.setup("commonos-test", span_exporter=spans)
    assert tel is not None and telemetry.capture_content()
    try:
        result = await make_loop(streams, profile).run_turn(TurnRequest(profile_id="demo", text="plan it"))
    finally:
        tel.close()
    assert result.status is ev.TurnStatus.COMPLETED
    finished = list(spans.get_finished_spans())
    first_chat = min(by_name(finished, "chat "), key=lambda s: s.start_time or 0)
    a = attrs(first_chat)
    assert json.loads(a["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "plan it"}]}
    ]
    assert json.loads(a["gen_ai.system_instructions"]) == [{"type": "text", "content": "Be brief."}]
    output = json.loads(a["gen_ai.output.messages"])
    assert output[0]["role"] == "assistant"
    assert output[0]["parts"][0] == {"type": "text", "content": "Looking around."}
    assert output[0]["parts"][1]["type"] == "tool_call" and output[0]["parts"][1]["name"] == "list_dir"
    delegate = next(s for s in finished if s.name == "execute_tool delegate")
    assert json.loads(attrs(delegate)["gen_ai.tool.call.arguments"]) == {"goal": "Find the answer"}
    assert attrs(delegate)["gen_ai.tool.call.result"] == "42"


async def test_without_an_endpoint_nothing_is_set_up_and_no_header_is_added(
    no_otel_env: None, streams: JetStreamContext, profile: Profile
) -> None:
    assert not telemetry.wanted()
    assert telemetry.setup("commonos-loop") is None
    assert telemetry.active() is None
    assert not telemetry.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"})
    assert telemetry.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"})
    result = await make_loop(streams, profile).run_turn(TurnRequest(profile_id="demo", text="plan it"))
    assert result.status is ev.TurnStatus.COMPLETED
    stored = await stored_messages(streams)
    assert stored and not any("traceparent" in h or "tracestate" in h for _, h in stored)


def test_traceparent_round_trip(in_memory: InMemory) -> None:
    tracer = telemetry.tracer()
    assert tracer is not None
    headers: dict[str, str] = {}
    telemetry.inject(headers)
    assert headers == {}  # outside a span
    with tracer.start_as_current_span("producer") as span:
        telemetry.inject(headers)
    ctx = span.get_span_context()
    assert headers == {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"}
    assert int(ctx.trace_flags) & 1  # sampled
    from opentelemetry import trace

    extracted = telemetry.extract(headers)
    assert extracted is not None
    remote = trace.get_current_span(extracted).get_span_context()
    assert (remote.trace_id, remote.span_id, remote.is_remote) == (ctx.trace_id, ctx.span_id, True)
    assert telemetry.extract({"traceparent": "00-zz-yy-01"}) is None
    assert telemetry.extract({}) is None and telemetry.extract(None) is None


class OtlpReceiver:
    """Any OTLP/HTTP backend, as far as the exporter can tell: /v1/traces and /v1/metrics, protobuf."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.content_types: set[str] = set()

    async def on_traces(self, request: web.Request) -> web.Response:
        self.content_types.add(request.content_type)
        self.traces.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def on_metrics(self, request: web.Request) -> web.Response:
        self.metrics.append(ExportMetricsServiceRequest.FromString(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[OtlpReceiver, str]]:
    r = OtlpReceiver()
    app = web.Application()
    app.router.add_post("/v1/traces", r.on_traces)
    app.router.add_post("/v1/metrics", r.on_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield r, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


async def test_the_otlp_http_exporter_delivers_the_spans_and_metrics_to_an_otlp_receiver(
    no_otel_env: None,
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[OtlpReceiver, str],
    streams: JetStreamContext,
    profile: Profile,
) -> None:
    r, url = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=test,client=acme")
    tel = telemetry.setup("commonos-loop")
    assert tel is not None and tel.service_name == "commonos-loop"
    try:
        result = await make_loop(streams, profile).run_turn(TurnRequest(profile_id="demo", text="plan it"))
    finally:
        await tel.aclose()  # flushes: the batch processor and the metric reader export now
    assert result.status is ev.TurnStatus.COMPLETED
    assert telemetry.active() is None

    assert r.content_types == {"application/x-protobuf"}
    spans = []
    for request in r.traces:
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            assert resource["service.name"] == "commonos-loop"
            assert resource["client"] == "acme"
            for ss in rs.scope_spans:
                assert ss.scope.name == telemetry.SCOPE
                spans += list(ss.spans)
    names = sorted(s.name for s in spans)
    assert names == sorted(
        ["invoke_agent demo"] * 2 + ["chat scripted-test"] * 4 + ["execute_tool list_dir", "execute_tool delegate"]
    )
    assert len({s.trace_id for s in spans}) == 1
    events = await NatsJournal(streams).events()
    calls = {str(c.event_id): c for c in of_type(events, ev.ModelCallCompleted)}
    for span in spans:
        a = {kv.key: _value(kv.value) for kv in span.attributes}
        if span.name.startswith("chat "):
            call = calls[a["cos.event_id"]]
            assert a["gen_ai.usage.input_tokens"] == (
                call.input_tokens + call.cache_read_tokens + call.cache_write_5m_tokens + call.cache_write_1h_tokens
            )
            assert a["gen_ai.usage.output_tokens"] == call.output_tokens

    metric_names: dict[str, int] = {}
    for request in r.metrics:
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    metric_names[metric.name] = sum(p.count for p in metric.histogram.data_points)
    assert metric_names["gen_ai.client.operation.duration"] == 4
    assert metric_names["gen_ai.client.token.usage"] == 8  # input and output of each call


async def test_the_service_name_is_overridden_by_otel_service_name(
    no_otel_env: None, monkeypatch: pytest.MonkeyPatch, receiver: tuple[OtlpReceiver, str]
) -> None:
    _, url = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{url}/v1/traces")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-loop")
    tel = telemetry.setup("commonos-loop")
    assert tel is not None
    try:
        assert tel.service_name == "my-loop"
        assert tel.meter_provider is None  # a traces endpoint says nothing about where metrics go
    finally:
        await tel.aclose()
    await asyncio.sleep(0)


async def test_the_loop_service_exports_with_its_name_and_flushes_when_stopped(
    no_otel_env: None,
    receiver: tuple[OtlpReceiver, str],
    nc: Client,
    nats_url: str,
    streams: JetStreamContext,
    profile: Profile,
) -> None:
    """`python -m commonos.loop serve` with OTEL_EXPORTER_OTLP_ENDPOINT: the turn's spans, service.name
    commonos-loop, reach the receiver when the service stops (the export delay is longer than the test)."""
    r, url = receiver
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "commonos.loop",
        "serve",
        env={
            **env,
            "COS_NATS_URL": nats_url,
            "COS_PROFILES_DIR": str(profile.folder.parent),
            "COS_HTTP_PORT": str(free_port()),
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        },
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            while b"loop serving profiles demo" not in await proc.stderr.readline():
                assert proc.returncode is None
        msg = await nc.request(chat_subject("demo"), msgspec.json.encode(ChatRequest(text="plan it")), timeout=30)
        reply = msgspec.json.decode(msg.data, type=ChatReply)
        assert reply.status == "completed", reply
        assert not r.traces  # still buffered
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    names = []
    for request in r.traces:
        for rs in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            assert resource["service.name"] == "commonos-loop"
            names += [s.name for ss in rs.scope_spans for s in ss.spans]
    assert sorted(names) == sorted(
        ["invoke_agent demo"] * 2 + ["chat scripted-test"] * 4 + ["execute_tool list_dir", "execute_tool delegate"]
    )
    assert any(
        m.name == "gen_ai.client.token.usage"
        for req in r.metrics
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


async def test_a_request_refused_before_its_turn_starts_is_a_failed_span_of_ours(
    in_memory: InMemory, streams: JetStreamContext, profile: Profile
) -> None:
    """Marked as ours from its start (`cos.turn_id`), so our gateway receiving it makes no turn of it."""
    missing = uuid.uuid4()
    with pytest.raises(SessionNotFound):
        await make_loop(streams, profile).run_turn(TurnRequest(profile_id="demo", text="hi", session_id=missing))
    [span] = in_memory.spans.get_finished_spans()
    a = attrs(span)
    assert span.name == "invoke_agent demo" and not span.status.is_ok
    assert a["cos.session_id"] == a["gen_ai.conversation.id"] == str(missing)
    uuid.UUID(a["cos.turn_id"])
    assert a["error.type"] == "SessionNotFound"
