"""Fuzz target of the OTLP gateway's mappers: GenAI span trees and Claude Code / Codex log records.

Requests are drawn loose, as a careless client sends them: a few traces whose span ids come from a
small pool (so parents are missing, duplicated, self-parented or looping), times at 0, equal,
backwards and up to the largest fixed64, and, for every attribute a mapper reads, values of the right
type, of the wrong one, spelled as strings, negative, huge or empty; log records with their times in
``time_unix_nano``, ``observed_time_unix_nano`` or an ``event.timestamp`` string, valid or not; and
resources whose attributes give valid and invalid tags.

For every request:

1. the mapper never raises: what it cannot map it refuses through `Mapped` (the rejected count never
   above the request's records);
2. every event passes the journal-writer's `check_event` and round-trips through `encode_event` /
   `decode_event`, and every ``model_call_completed`` passes billing's `check_model_call`;
3. preparing each event for NATS raises nothing but `EventTooLarge`: an event over the server's
   max_payload (a tool's name or call id of a megabyte) is refused by the server itself with a
   partial success (`server._fitting`), so that is the design, not a failure here;
4. a ``session_created`` comes before every other event of its session, and a ``turn_started`` of the
   request before every other event of its turn. Only the turns the request starts are checked: a
   turn may also be one the request does not start (an ``invoke_agent`` span of our own loop, one
   refused, a Claude Code call without a prompt), as the module docstrings and tests decide;
5. mapping the same request again gives the same events (fresh ordinals); for logs, mapping it again
   with the same ordinals (an exporter's retry) gives the same model, tool and approval event ids;
   only which turn a record follows may change, as `codex.py` documents (a record mapped before a
   prompt of an earlier request is known finds that prompt on the retry);
6. no event id twice in one `Mapped`.

Hypothesis keeps every choice of a run (the tree of what it tried) until the run ends, about 1 MB an
example of these requests: the long profile makes 10 runs of 1,000 examples of each target (each draws
afresh) rather than one of 10,000, which would hold some 10 GB.
"""

from __future__ import annotations

import uuid
from collections.abc import Coroutine
from typing import Any, Final

import pytest
from hypothesis import event as note
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from commonos.billing.projection import check_model_call
from commonos.journal_writer.projection import check_event
from commonos.otlp_gateway.common import Mapped, MemoryOrdinals, Source
from commonos.otlp_gateway.genai import map_spans
from commonos.otlp_gateway.mapping import map_logs
from commonos.proto import events as ev
from commonos.runtime.publisher import EventPublisher, EventTooLarge
from tests.fuzz import strategies as fz
from tests.fuzz.conftest import PURE_DEADLINE

SOURCE: Final = Source(profile_id="fuzz")
T0: Final = 1_764_000_000_000_000_000
S: Final = 1_000_000_000
MAX_FIXED64: Final = 2**64 - 1

# --- values --------------------------------------------------------------------------------------------

#: Integers an OTLP int_value (int64) can hold, the edges drawn often.
int64s = st.sampled_from([e for e in fz.EDGE_INTS if -(2**63) <= e < 2**63]) | st.integers(-(2**63), 2**63 - 1)
#: Strings a protobuf string can hold (no lone surrogates), nasty ones included.
strings = fz.unicode_text | fz.nasty_text
scalars = st.one_of(st.none(), st.booleans(), int64s, st.floats(), strings, st.binary(max_size=8))
#: Any AnyValue: a scalar, a list or a key-value list of them.
loose = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3), max_leaves=6
)


@st.composite
def big_text(draw: st.DrawFn) -> str:
    """A long string: around the limits the mappers cut at, or a megabyte."""
    size = draw(st.sampled_from([257, 2_001, 16_001, 70_000, 1_100_000]))
    unit = draw(st.sampled_from(["x", "é", "😀", '"'])) if size < 100_000 else "x"
    return unit * size


def sometimes_big(values: st.SearchStrategy[Any], *, typed: bool = False) -> st.SearchStrategy[Any]:
    """`values` mostly, else a loose value (unless `typed`: a string field) or a big string."""
    return st.one_of(values, values, values, values, values, values, values, values if typed else loose, big_text())


#: Token counts in every spelling: ints, strings, floats, bools, negative, beyond 64 bits as text.
counts = st.one_of(
    st.integers(0, 10**6),
    int64s,
    st.integers(0, 10**6).map(str),
    st.sampled_from(["", " 12 ", "+3", "-1", "1e3", "12.0", "0x10", "٣", str(2**64), str(10**30), "9" * 40]),
    st.sampled_from([12.0, 1.5, -0.0, float("inf"), float("nan"), 1e30]),
    st.booleans(),
    loose,
)
#: Times in nanoseconds (fixed64): unset, near each other, before the epoch's 1, the largest.
nanos = st.one_of(
    st.sampled_from([0, 1, T0, T0 + S, T0 - S, T0 + 1, MAX_FIXED64, MAX_FIXED64 - 1, 2**63]),
    st.integers(0, MAX_FIXED64),
    st.integers(T0 - 10 * S, T0 + 10 * S),
)
uuids_pool = st.sampled_from(
    ["0f8e5ea2-5a3e-4f45-9c40-8e5f2b3d1a01", "0f8e5ea2-5a3e-4f45-9c40-8e5f2b3d1a02", str(uuid.UUID(int=0))]
)
ids_or_garbage = st.one_of(uuids_pool, uuids_pool.map(lambda u: u.replace("-", "").upper()), loose)


def any_value(value: Any) -> AnyValue:
    if value is None:
        return AnyValue()
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    out = AnyValue()
    if isinstance(value, list):
        out.array_value.values.extend(any_value(v) for v in value)
    else:
        out.kvlist_value.values.extend(kvs(value))
    return out


def kvs(values: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in values.items()]


def attrs_of(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Each key absent, or with a value of its strategy (good values, loose ones, sometimes big)."""
    return st.fixed_dictionaries({}, optional=fields)


tag_values = st.one_of(fz.valid_tags.map(lambda t: t.split(":", 1)[1]), st.sampled_from(["acme", "", "a b", "x" * 80]))
resources = attrs_of(
    {
        "client": st.one_of(tag_values, loose),
        "project": tag_values,
        "cos.tag.cost-center": tag_values,
        "cos.tag.": tag_values,
        "cos.tag.Bad Key": tag_values,
        "service.name": st.sampled_from(["agent-app", "claude-code", "codex_exec"]) | loose,
    }
)

# --- spans ---------------------------------------------------------------------------------------------

OPERATIONS: Final = ("invoke_agent", "chat", "text_completion", "generate_content", "embeddings", "execute_tool")
names = st.sampled_from(["openai", "anthropic", "gcp.gemini", " AWS.Bedrock ", "", " "])
models = st.sampled_from(["gpt-4o", "claude-sonnet-4-5", "", "m" * 256, "m" * 257])
span_attrs = attrs_of(
    {
        "gen_ai.operation.name": st.one_of(st.sampled_from(OPERATIONS), st.sampled_from(OPERATIONS), loose),
        "gen_ai.provider.name": sometimes_big(names),
        "gen_ai.system": names | loose,
        "gen_ai.request.model": sometimes_big(models),
        "gen_ai.response.model": models | loose,
        "gen_ai.usage.input_tokens": counts,
        "gen_ai.usage.output_tokens": counts,
        "gen_ai.usage.prompt_tokens": counts,
        "gen_ai.usage.completion_tokens": counts,
        "gen_ai.usage.cache_read.input_tokens": counts,
        "gen_ai.usage.cache_creation.input_tokens": counts,
        "gen_ai.usage.reasoning.output_tokens": counts,
        "gen_ai.response.finish_reasons": st.one_of(st.lists(strings | st.none(), max_size=3), strings, loose),
        "gen_ai.response.id": sometimes_big(strings),
        "gen_ai.conversation.id": st.one_of(st.sampled_from(["c1", "c2", ""]), st.sampled_from([1, 0, -1]), loose),
        "cos.session_id": ids_or_garbage,
        "cos.turn_id": ids_or_garbage,
        "cos.event_id": ids_or_garbage,
        "cos.tool_call_id": ids_or_garbage,
        "cos.turn.depth": int64s | loose,
        "gen_ai.tool.name": sometimes_big(st.sampled_from(["search", "", " read "])),
        "gen_ai.tool.call.id": sometimes_big(st.sampled_from(["call_1", "call_2", ""])),
        "gen_ai.tool.call.arguments": sometimes_big(st.one_of(strings, st.just('{"q": 1}'), st.just("[1, 2]"))),
        "gen_ai.tool.call.result": sometimes_big(strings),
        "error.type": loose,
    }
)
#: Span ids from a small pool (1 to 4), and ids that are not 8 bytes or are all zeros.
span_ids = st.one_of(st.integers(1, 4).map(lambda i: i.to_bytes(8, "big")), st.sampled_from([b"", bytes(8), b"\x01"]))
parent_ids = st.one_of(
    st.none(), st.integers(1, 5).map(lambda i: i.to_bytes(8, "big")), st.sampled_from([bytes(8), b"x"])
)
trace_ids = st.one_of(st.integers(1, 2).map(lambda i: i.to_bytes(16, "big")), st.sampled_from([bytes(16), b"\x01" * 8]))
statuses = st.one_of(
    st.builds(Status),
    st.builds(Status, code=st.just(Status.STATUS_CODE_OK), message=strings),
    st.builds(Status, code=st.just(Status.STATUS_CODE_ERROR), message=sometimes_big(strings, typed=True)),
)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    start = draw(nanos)
    end = draw(st.one_of(nanos, st.just(start), st.integers(0, 10 * S).map(lambda d: min(start + d, MAX_FIXED64))))
    return Span(
        trace_id=draw(trace_ids),
        span_id=draw(span_ids),
        parent_span_id=draw(parent_ids) or b"",
        name=draw(st.one_of(st.sampled_from(["execute_tool", "execute_tool search", "chat"]), strings)),
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=kvs(draw(span_attrs)),
        status=draw(statuses),
    )


@st.composite
def trace_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        resource_spans = ResourceSpans(resource=Resource(attributes=kvs(draw(resources))))
        for _ in range(draw(st.integers(1, 2))):
            resource_spans.scope_spans.append(ScopeSpans(spans=draw(st.lists(spans(), max_size=4))))
        request.resource_spans.append(resource_spans)
    return request


# --- log records ---------------------------------------------------------------------------------------

EVENT_NAMES: Final = (
    "user_prompt",
    "api_request",
    "tool_result",
    "tool_decision",
    "assistant_response",
    "claude_code.api_request",
    "claude_code.tool_result",
    "codex.conversation_starts",
    "codex.user_prompt",
    "codex.sse_event",
    "codex.sse_event",
    "codex.tool_result",
    "codex.tool_decision",
    "codex.api_request",
)
timestamps = st.one_of(
    st.sampled_from(
        [
            "2026-12-01T20:00:00Z",
            "2026-12-01T20:00:00.635Z",
            "2026-12-01T20:00:01.000+05:30",
            "2026-12-01T20:00:00",
            "2026-12-01",
            "0001-01-01T00:00:00+01:00",
            "0001-01-01T00:30:00Z",
            "9999-12-31T23:59:59.999999Z",
            "9999-12-31T23:00:00-01:00",
            "1969-12-31T23:59:59Z",
            "20261201T200000Z",
            "not a time",
            "",
        ]
    ),
    loose,
)
durations = st.one_of(
    st.sampled_from(["10", "0", "-5", "1e300", "1e12", 1e300, 1e18, -1, 10, 2.5, "nan", "inf"]), counts
)
record_attrs = attrs_of(
    {
        # Claude Code
        "session.id": st.one_of(st.sampled_from(["s1", "s2", ""]), loose),
        "prompt.id": st.one_of(st.sampled_from(["p1", "p2", ""]), loose),
        "request_id": sometimes_big(st.sampled_from(["req_1", "req_2", ""])),
        "model": sometimes_big(models),
        "input_tokens": counts,
        "output_tokens": counts,
        "cache_read_tokens": counts,
        "cache_creation_5m_tokens": counts,
        "cache_creation_1h_tokens": counts,
        "cache_creation_tokens": counts,
        "cost_usd": st.one_of(
            st.sampled_from(["0.0123", 0.5, "-1", -0.01, "1e13", 1e20, "NaN", "inf", "1E+400", "0.1e-5"]), counts
        ),
        "duration_ms": durations,
        "speed": st.sampled_from(["normal", "fast", "ultrafast", "warp", ""]) | loose,
        "tool_use_id": sometimes_big(st.sampled_from(["toolu_1", "toolu_2", ""])),
        "tool_name": sometimes_big(st.sampled_from(["Read", "Bash", ""])),
        "success": st.sampled_from([True, False, "true", "False", "no"]) | loose,
        "error": sometimes_big(strings),
        "tool_parameters": sometimes_big(st.sampled_from(['{"a": 1}', "[1]", "{", ""])),
        "decision": st.sampled_from(["accept", "reject", "approved", "Denied", ""]) | loose,
        "source": st.sampled_from(["config", "hook", "user_temporary", "User", "Config", ""]) | loose,
        "event.sequence": counts,
        # Codex
        "conversation.id": st.one_of(st.sampled_from(["c1", "c2", ""]), loose),
        "event.kind": st.sampled_from(["response.completed", "response.created"]) | loose,
        "input_token_count": counts,
        "output_token_count": counts,
        "cached_token_count": counts,
        "cache_write_token_count": counts,
        "reasoning_token_count": counts,
        "tool_token_count": counts,
        "slug": models | loose,
        "call_id": sometimes_big(st.sampled_from(["call_1", "call_2", ""])),
        "arguments": sometimes_big(st.sampled_from(['{"cmd": "ls"}', "[1]", "ls", ""])),
        "output": sometimes_big(strings),
        # both
        "event.timestamp": timestamps,
    }
)


@st.composite
def log_records(draw: st.DrawFn) -> LogRecord:
    attrs = draw(record_attrs)
    name = draw(st.one_of(st.sampled_from(EVENT_NAMES), st.sampled_from(EVENT_NAMES), loose))
    record = LogRecord(time_unix_nano=draw(nanos), observed_time_unix_nano=draw(nanos))
    if draw(st.booleans()):
        attrs = {"event.name": name, **attrs}
    elif isinstance(name, str):
        record.event_name = name
    record.attributes.extend(kvs(attrs))
    return record


SCOPES: Final = ("com.anthropic.claude_code.events", "codex_otel.log_only", "other", "")


@st.composite
def log_requests(draw: st.DrawFn) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        resource_logs = ResourceLogs(resource=Resource(attributes=kvs(draw(resources))))
        for _ in range(draw(st.integers(1, 2))):
            scope = InstrumentationScope(name=draw(st.sampled_from(SCOPES)))
            resource_logs.scope_logs.append(
                ScopeLogs(scope=scope, log_records=draw(st.lists(log_records(), max_size=4)))
            )
        request.resource_logs.append(resource_logs)
    return request


# --- properties ----------------------------------------------------------------------------------------

PUBLISHER: Final = EventPublisher(None, "urn:commonos:fuzz")  # type: ignore[arg-type]


def run(coroutine: Coroutine[Any, Any, Mapped]) -> Mapped:
    """Run a mapping coroutine that never waits (its ordinals are in memory), without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: Mapped = done.value
        return result
    coroutine.close()
    raise AssertionError("the mapping waited on something: its ordinals are in memory")


def check(mapped: Mapped, records: int) -> None:
    assert 0 <= mapped.rejected <= records, f"{mapped.rejected} rejected of {records} records"
    assert mapped.ignored >= 0
    note(f"rejected: {mapped.rejected > 0}; events: {min(len(mapped.events), 3)}")
    ids = [e.event_id for e in mapped.events]
    assert len(ids) == len(set(ids)), f"an event id twice: {[e for e in mapped.events if ids.count(e.event_id) > 1]}"
    sessions: set[uuid.UUID] = set()
    turns: set[uuid.UUID] = set()
    created = {e.session_id for e in mapped.events if isinstance(e, ev.SessionCreated)}
    started = {e.turn_id for e in mapped.events if isinstance(e, ev.TurnStarted)}
    for event in mapped.events:
        note(f"event: {ev.event_type(event)}")
        check_event(event)  # type: ignore[arg-type]
        assert ev.decode_event(ev.encode_event(event)) == event
        if isinstance(event, ev.ModelCallCompleted):
            check_model_call(event)
        try:
            PUBLISHER.prepare(event)
        except EventTooLarge:
            note("an event too large (refused by the server)")
        if isinstance(event, ev.SessionCreated):
            sessions.add(event.session_id)
            continue
        assert event.session_id not in created or event.session_id in sessions, f"before its session: {event}"
        if isinstance(event, ev.TurnStarted):
            turns.add(event.turn_id)
            continue
        turn = getattr(event, "turn_id", None)
        assert turn not in started or turn in turns, f"before its turn_started: {event}"


#: Examples a run, and runs (see the module's docstring): the profile's examples, in runs of 1,000 at most.
EXAMPLES: Final = min(settings().max_examples, 1_000)
RUNS: Final = -(-settings().max_examples // EXAMPLES)


@pytest.mark.parametrize("part", range(RUNS))
@settings(deadline=PURE_DEADLINE * 4, max_examples=EXAMPLES)
@given(request=trace_requests())
def test_genai_spans_map_to_valid_ordered_events(part: int, request: ExportTraceServiceRequest) -> None:
    records = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    mapped = map_spans(request, SOURCE)
    check(mapped, records)
    again = map_spans(ExportTraceServiceRequest.FromString(request.SerializeToString()), SOURCE)
    assert again == mapped


@pytest.mark.parametrize("part", range(RUNS))
@settings(deadline=PURE_DEADLINE * 4, max_examples=EXAMPLES)
@given(request=log_requests())
def test_claude_code_and_codex_records_map_to_valid_ordered_events(
    part: int, request: ExportLogsServiceRequest
) -> None:
    records = sum(len(s.log_records) for r in request.resource_logs for s in r.scope_logs)
    ordinals = MemoryOrdinals()
    mapped = run(map_logs(request, SOURCE, ordinals))
    check(mapped, records)
    assert run(map_logs(request, SOURCE, MemoryOrdinals())) == mapped
    retried = run(map_logs(request, SOURCE, ordinals))
    check(retried, records)
    calls = (ev.ModelCallCompleted, ev.ToolCallRecorded, ev.ApprovalDecided)
    assert [e.event_id for e in retried.events if isinstance(e, calls)] == [
        e.event_id for e in mapped.events if isinstance(e, calls)
    ]
