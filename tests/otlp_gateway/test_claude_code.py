"""Claude Code's log events -> our events, rule by rule, on small records of the recorded shape (pure)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from commonos.otlp_gateway.common import MemoryOrdinals, Source, gateway_id, tool_call_id_of
from commonos.proto.events import (
    ApprovalDecided,
    ApprovalStatus,
    EventBase,
    ModelCallCompleted,
    SessionCreated,
    ToolCallRecorded,
    TurnStarted,
    decode_event,
    encode_event,
)
from commonos.proto.graph.ids import mint_id, request_call_event_id
from tests.otlp_gateway.logs import CLAUDE_SCOPE, at, claude, kvs, mapped, record, request

#: The vendor part of the ids of the tests' profile (`vendor_scope("claude-code", "otlp-test")`).
SCOPE = "claude-code@otlp-test"
SESSION = "a1797583-09eb-4d28-bc67-0b054c1eb402"
PROMPT = "8864e351-8cf7-49b4-810e-6cd84cf3d8dc"
BASE = {"session.id": SESSION, "user.id": "u", "terminal.type": "non-interactive"}


def prompt(seconds: float = 0.0, prompt_id: str = PROMPT) -> Any:
    return record("user_prompt", {**BASE, "prompt.id": prompt_id, "prompt_length": "67"}, seconds)


def api_request(seconds: float = 1.0, extra: dict[str, Any] | None = None, **overrides: Any) -> Any:
    attrs = {
        **BASE,
        "prompt.id": PROMPT,
        "model": "claude-sonnet-4-5",
        "input_tokens": 5,
        "output_tokens": 22,
        "cache_read_tokens": 200017,
        "cache_creation_tokens": 2340,
        "cache_creation_5m_tokens": 2300,
        "cache_creation_1h_tokens": 40,
        "cost_usd": 0.0692151,
        "cost_usd_micros": 69215,
        "duration_ms": 23,
        "ttft_ms": 11,
        "request_id": "req_fake02000tools",
        "speed": "normal",
        "query_source": "sdk",
    }
    attrs.update(overrides | (extra or {}))
    return record("api_request", {k: v for k, v in attrs.items() if v is not None}, seconds)


def tool_result(seconds: float = 2.0, extra: dict[str, Any] | None = None, **overrides: Any) -> Any:
    attrs = {
        **BASE,
        "prompt.id": PROMPT,
        "tool_name": "Write",
        "tool_use_id": "toolu_1",
        "success": "true",
        "duration_ms": "10",
        "request_id": "req_fake02000tools",
    }
    attrs.update(overrides | (extra or {}))
    return record("tool_result", {k: v for k, v in attrs.items() if v is not None}, seconds)


def tool_decision(seconds: float = 1.5, **overrides: Any) -> Any:
    attrs = {
        **BASE,
        "prompt.id": PROMPT,
        "decision": "accept",
        "source": "config",
        "tool_name": "Write",
        "tool_use_id": "toolu_1",
        "permission_mode": "bypassPermissions",
    }
    attrs.update(overrides)
    return record("tool_decision", attrs, seconds)


def of(events: list[EventBase], kind: type[EventBase]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def roundtrip(events: list[EventBase]) -> None:
    """Every event is valid on the wire (the constraints msgspec checks on decoding)."""
    for event in events:
        assert decode_event(encode_event(event)) == event


async def test_session_and_turn_from_a_prompt() -> None:
    result = await mapped(claude(prompt(), resource={"client": "acme"}))
    assert (result.rejected, result.ignored) == (0, 0)
    session, turn = result.events
    assert isinstance(session, SessionCreated) and isinstance(turn, TurnStarted)
    # The importer's root session id of the same Claude Code session.
    assert session.session_id == uuid.UUID(mint_id("session", SCOPE, SESSION))
    assert session.source == "claude-code" and session.profile_id == "otlp-test"
    assert session.tags == ("client:acme", "vendor:claude-code") == turn.tags
    assert turn.session_id == session.session_id and turn.occurred_at == at(0)
    assert turn.turn_id == gateway_id("turn", SCOPE, SESSION, PROMPT)
    assert (turn.depth, turn.parent_turn_id, turn.context_snapshot) == (0, None, None)
    roundtrip(result.events)


async def test_api_request_is_a_model_call_with_disjoint_buckets_and_the_reported_cost() -> None:
    result = await mapped(claude(prompt(), api_request()))
    (call,) = of(result.events, ModelCallCompleted)
    assert call.event_id == request_call_event_id(SCOPE, "req_fake02000tools")
    assert call.request_id == "req_fake02000tools" and call.provider == "anthropic"
    assert call.model == "claude-sonnet-4-5" and call.occurred_at == at(1)
    assert (call.input_tokens, call.output_tokens, call.cache_read_tokens) == (5, 22, 200017)
    assert (call.cache_write_5m_tokens, call.cache_write_1h_tokens, call.reasoning_tokens) == (2300, 40, 0)
    assert call.reported_cost_usd == Decimal("0.0692151") and call.latency_s == 0.023 and call.speed == "standard"
    assert call.turn_id == gateway_id("turn", SCOPE, SESSION, PROMPT)
    assert call.tags == ("vendor:claude-code",) and not call.usage_estimated
    roundtrip(result.events)


async def test_cache_writes_without_the_split_are_five_minute_ones() -> None:
    record_ = api_request(cache_creation_5m_tokens=None, cache_creation_1h_tokens=None, cache_creation_tokens="100")
    (call,) = of((await mapped(claude(record_))).events, ModelCallCompleted)
    assert (call.cache_write_5m_tokens, call.cache_write_1h_tokens) == (100, 0)
    record_ = api_request(cache_creation_5m_tokens=None, cache_creation_1h_tokens=30, cache_creation_tokens=100)
    (call,) = of((await mapped(claude(record_))).events, ModelCallCompleted)
    assert (call.cache_write_5m_tokens, call.cache_write_1h_tokens) == (70, 30)


async def test_an_api_request_in_a_later_request_announces_its_session_and_turn_again() -> None:
    ordinals = MemoryOrdinals()
    first = await mapped(claude(prompt()), ordinals)
    later = await mapped(claude(api_request(), api_request(2.0, request_id="req_2")), ordinals)
    # Once per request, with the same ids: the journal-writer keeps the first (ON CONFLICT DO NOTHING).
    assert [type(e) for e in later.events] == [SessionCreated, TurnStarted, ModelCallCompleted, ModelCallCompleted]
    assert [e.event_id for e in later.events[:2]] == [e.event_id for e in first.events]


async def test_a_call_without_a_prompt_has_no_turn_and_one_without_a_request_id_a_gateway_id() -> None:
    result = await mapped(claude(api_request(extra={"prompt.id": None, "request_id": None, "event.sequence": 6})))
    assert [type(e) for e in result.events] == [SessionCreated, ModelCallCompleted]
    call = of(result.events, ModelCallCompleted)[0]
    assert call.turn_id is None and call.request_id is None
    again = await mapped(claude(api_request(extra={"prompt.id": None, "request_id": None, "event.sequence": 6})))
    assert again.events[1].event_id == call.event_id  # still deterministic: a retry publishes the same id
    other = await mapped(claude(api_request(extra={"prompt.id": None, "request_id": None, "event.sequence": 7})))
    assert other.events[1].event_id != call.event_id


async def test_tool_result_is_a_tool_call() -> None:
    result = await mapped(claude(prompt(), tool_result()))
    (tool,) = of(result.events, ToolCallRecorded)
    assert tool.call_id == "toolu_1" and tool.name == "Write" and not tool.is_error and tool.result is None
    assert tool.finished_at == at(2) and tool.started_at == at(2) - timedelta(milliseconds=10)
    assert tool.turn_id == gateway_id("turn", SCOPE, SESSION, PROMPT)
    assert tool.tool_call_id == tool_call_id_of(SCOPE, SESSION, "toolu_1")
    assert tool.event_id == gateway_id("tool_call_recorded", SCOPE, SESSION, "toolu_1")
    assert tool.approval is None and tool.args == {}
    roundtrip(result.events)


async def test_a_failed_tool_keeps_its_error_and_details_its_parameters() -> None:
    failed = tool_result(success="false", error="No such file", tool_parameters='{"file_path": "/x"}')
    (tool,) = of((await mapped(claude(failed))).events, ToolCallRecorded)
    assert tool.is_error and tool.result == "No such file" and tool.args == {"file_path": "/x"}


async def test_a_tool_result_without_a_prompt_gets_the_sessions_no_prompt_turn() -> None:
    result = await mapped(claude(tool_result(extra={"prompt.id": None})))
    turn = of(result.events, TurnStarted)[0]
    assert turn.turn_id == gateway_id("turn", SCOPE, SESSION, "no-prompt")
    assert of(result.events, ToolCallRecorded)[0].turn_id == turn.turn_id


async def test_tool_decision_is_an_approval() -> None:
    result = await mapped(
        claude(
            prompt(),
            tool_decision(),
            tool_decision(tool_use_id="toolu_2", decision="reject", source="user_reject"),
            tool_decision(tool_use_id="toolu_3", source="hook"),
            tool_decision(tool_use_id="toolu_4", source="user_temporary"),
        )
    )
    approvals = of(result.events, ApprovalDecided)
    assert [(a.call_id, a.status, a.decided_by) for a in approvals] == [
        ("toolu_1", ApprovalStatus.APPROVED, "policy"),
        ("toolu_2", ApprovalStatus.DENIED, "user"),
        ("toolu_3", ApprovalStatus.APPROVED, "hook"),
        ("toolu_4", ApprovalStatus.APPROVED, "user"),
    ]
    first = approvals[0]
    assert first.tool_call_id == tool_call_id_of(SCOPE, SESSION, "toolu_1") and first.decided_at == at(1.5)
    assert first.turn_id == gateway_id("turn", SCOPE, SESSION, PROMPT)
    roundtrip(result.events)


async def test_other_events_are_ignored_and_bad_records_refused() -> None:
    result = await mapped(
        claude(
            record("assistant_response", {**BASE, "prompt.id": PROMPT}),
            record("plugin_loaded", BASE),
            record("claude_code.something_new", BASE),
            record("api_request", {"prompt.id": PROMPT, "input_tokens": 3}),  # no session.id
            tool_result(tool_use_id=None),
        )
    )
    assert result.ignored == 3 and result.rejected == 2
    assert result.errors == [
        "claude_code.api_request without session.id",
        "claude_code.tool_result without tool_use_id",
    ]


async def test_names_with_the_claude_code_prefix_and_records_found_by_service_name() -> None:
    named = record("claude_code.api_request", {**BASE, "request_id": "req_x", "input_tokens": 1})
    result = await mapped(request(({"service.name": "claude-code"}, "another.scope", [named])))
    assert [type(e) for e in result.events] == [SessionCreated, ModelCallCompleted]


async def test_a_record_without_a_time_is_refused() -> None:
    timeless = LogRecord(attributes=kvs({**BASE, "event.name": "api_request", "request_id": "req_x"}))
    result = await mapped(request(({"service.name": "claude-code"}, CLAUDE_SCOPE, [timeless])))
    assert result.rejected == 1 and "without a time" in result.errors[0]


async def test_invalid_resource_tags_refuse_the_resources_records() -> None:
    result = await mapped(claude(prompt(), api_request(), resource={"client": "acme corp"}))
    assert result.events == [] and result.rejected == 2
    assert result.errors and "resource attribute 'client'" in result.errors[0] and "no spaces" in result.errors[0]
    # Another configured key list: the same attribute is then not a tag at all.
    fine = await map_with(
        Source(profile_id="otlp-test", tag_attributes=()), claude(prompt(), resource={"client": "a b"})
    )
    assert fine.rejected == 0 and len(fine.events) == 2


async def map_with(source: Source, req: Any) -> Any:
    return await mapped(req, source=source)


async def test_a_retry_maps_to_the_same_events() -> None:
    req = claude(prompt(), api_request(), tool_decision(), tool_result())
    first, second = await mapped(req), await mapped(req)
    assert first.events == second.events and len({e.event_id for e in first.events}) == len(first.events)


async def test_a_duration_before_the_year_1_leaves_the_start_at_the_end() -> None:
    """A duration_ms no datetime can subtract (1e300 ms, or 10 s before the year 1) raised OverflowError."""
    moment = {"event.timestamp": "0001-01-01T00:00:05Z"}
    early = record("tool_result", {**BASE, "tool_use_id": "toolu_2", "duration_ms": "10000", **moment}, nanos=False)
    result = await mapped(claude(tool_result(duration_ms="1e300"), early))
    calls = of(result.events, ToolCallRecorded)
    assert len(calls) == 2 and all(c.started_at == c.finished_at for c in calls)
    assert result.rejected == 0


async def test_a_call_billing_cannot_store_is_refused_or_keeps_no_reported_cost() -> None:
    """A model name over 256 characters, a count beyond 64 bits: refused (billing would dead-letter the call);
    a reported cost that is negative or above 1e12: the call without it."""
    result = await mapped(
        claude(
            api_request(model="m" * 257, request_id="req_long"),
            api_request(input_tokens=str(2**63), request_id="req_huge"),
            api_request(cost_usd="-1", request_id="req_negative"),
            api_request(cost_usd="1e13", request_id="req_dear"),
        )
    )
    assert result.rejected == 2
    assert any("257" in e or "256" in e for e in result.errors) and any("input_tokens" in e for e in result.errors)
    calls = of(result.events, ModelCallCompleted)
    assert [c.request_id for c in calls] == ["req_negative", "req_dear"]
    assert [c.reported_cost_usd for c in calls] == [None, None]


async def test_the_same_call_twice_in_a_request_is_one_event() -> None:
    """Two records of one request id (or tool use id) made two events of one id in a request."""
    result = await mapped(claude(api_request(), api_request(2.0), tool_result(), tool_result(3.0)))
    ids = [e.event_id for e in result.events]
    assert len(ids) == len(set(ids)) == 4 and result.ignored == 2
