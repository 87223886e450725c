"""Codex's log events -> our events, rule by rule, on small records of the recorded shape (pure)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from commonos.otlp_gateway.codex import turn_key
from commonos.otlp_gateway.common import MemoryOrdinals, gateway_id, tool_call_id_of
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
from commonos.proto.graph.ids import mint_id, usage_call_event_id
from tests.otlp_gateway.logs import at, codex, mapped, record

#: The vendor part of the ids of the tests' profile (`vendor_scope("codex", "otlp-test")`).
SCOPE = "codex@otlp-test"
#: The usage of `completed()`'s call in our buckets: (input, output, cache read, cache write).
USAGE = (1020, 42, 120000, 0)
CONVERSATION = "01a23336-3758-7411-aba1-63247723f280"
BASE = {"conversation.id": CONVERSATION, "app.version": "0.171.0", "model": "gpt-5-codex", "slug": "gpt-5-codex"}


def codex_record(name: str, attrs: dict[str, Any], seconds: float) -> Any:
    # Codex leaves time_unix_nano 0: the time is event.timestamp only.
    return record(name, {**BASE, **attrs}, seconds, nanos=False)


def starts(seconds: float = 0.0) -> Any:
    return codex_record("codex.conversation_starts", {"provider_name": "fake", "approval_policy": "never"}, seconds)


def prompt(seconds: float = 0.5) -> Any:
    return codex_record("codex.user_prompt", {"prompt_length": "69", "prompt": "[REDACTED]"}, seconds)


def completed(seconds: float = 1.0, *, with_counts: bool = True, **counts: Any) -> Any:
    attrs: dict[str, Any] = {"event.kind": "response.completed", "duration_ms": "0"}
    if with_counts:
        attrs |= {
            "input_token_count": "121020",
            "output_token_count": "42",
            "cached_token_count": "120000",
            "cache_write_token_count": "0",
            "reasoning_token_count": "0",
            "tool_token_count": "121062",
            "ttft_ms": "0",
        }
        attrs |= {k: str(v) for k, v in counts.items()}
    return codex_record("codex.sse_event", attrs, seconds)


def tool_result(seconds: float = 2.0, **overrides: Any) -> Any:
    attrs = {
        "tool_result_seq": "1",
        "tool_name": "exec_command",
        "call_id": "call_1",
        "duration_ms": "13",
        "success": "true",
        "output_truncated": False,
        "arguments": '{"cmd": "cat notes.txt"}',
        "output": "alpha\n",
    }
    attrs.update(overrides)
    return codex_record("codex.tool_result", {k: v for k, v in attrs.items() if v is not None}, seconds)


def tool_decision(seconds: float = 1.5, **overrides: Any) -> Any:
    attrs = {"tool_name": "exec_command", "call_id": "call_1", "decision": "approved", "source": "Config"}
    attrs.update(overrides)
    return codex_record("codex.tool_decision", attrs, seconds)


def of(events: list[EventBase], kind: type[EventBase]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


def roundtrip(events: list[EventBase]) -> None:
    for event in events:
        assert decode_event(encode_event(event)) == event


def turn_id(seconds: float) -> uuid.UUID:
    return gateway_id("turn", SCOPE, CONVERSATION, turn_key(at(seconds)))


async def test_session_and_turn() -> None:
    result = await mapped(codex(starts(), prompt(), resource={"project": "site"}))
    session, turn = result.events
    assert isinstance(session, SessionCreated) and isinstance(turn, TurnStarted)
    assert session.session_id == uuid.UUID(mint_id("session", SCOPE, CONVERSATION))  # the importer's
    assert session.source == "codex" and session.tags == ("project:site", "vendor:codex") == turn.tags
    assert session.occurred_at == at(0) and turn.occurred_at == at(0.5) and turn.turn_id == turn_id(0.5)
    roundtrip(result.events)


async def test_a_completed_response_with_counts_is_a_model_call_in_disjoint_buckets() -> None:
    result = await mapped(codex(prompt(), completed(with_counts=False), completed()))
    assert result.ignored == 1  # Codex logs each completed response twice, once without counts
    (call,) = of(result.events, ModelCallCompleted)
    assert call.event_id == usage_call_event_id(SCOPE, CONVERSATION, USAGE, 0)
    assert (call.input_tokens, call.cache_read_tokens, call.cache_write_5m_tokens) == (1020, 120000, 0)
    assert (call.output_tokens, call.reasoning_tokens, call.cache_write_1h_tokens) == (42, 0, 0)
    assert call.provider == "openai" and call.model == "gpt-5-codex" and call.request_id is None
    assert call.occurred_at == at(1) and call.turn_id == turn_id(0.5) and call.tags == ("vendor:codex",)
    roundtrip(result.events)


async def test_cache_writes_and_reasoning() -> None:
    # Input includes cached and written tokens; reasoning is inside the output (total = input + output).
    inside = completed(
        input_token_count=1000,
        cached_token_count=600,
        cache_write_token_count=100,
        output_token_count=57,
        reasoning_token_count=8,
        tool_token_count=1057,
    )
    (call,) = of((await mapped(codex(inside))).events, ModelCallCompleted)
    assert (call.input_tokens, call.cache_read_tokens, call.cache_write_5m_tokens) == (300, 600, 100)
    assert (call.output_tokens, call.reasoning_tokens) == (57, 8)
    # Figures showing reasoning beside the output: it is added, as the importer does.
    beside = completed(output_token_count=10, reasoning_token_count=30, tool_token_count=0)
    (call,) = of((await mapped(codex(beside))).events, ModelCallCompleted)
    assert (call.output_tokens, call.reasoning_tokens) == (40, 30)
    # Counts all 0: no call.
    zero = completed(input_token_count=0, cached_token_count=0, output_token_count=0, tool_token_count=0)
    nothing = await mapped(codex(zero))
    assert of(nothing.events, ModelCallCompleted) == [] and nothing.ignored == 1


async def test_a_calls_id_is_its_usage_and_repeats_of_a_usage_count_across_requests_and_retries() -> None:
    ordinals = MemoryOrdinals()
    first = codex(prompt(), completed(1.0), completed(2.0, output_token_count=47))
    second = codex(completed(3.0, output_token_count=52), completed(4.0))  # the last: the usage of the first
    a = of((await mapped(first, ordinals)).events, ModelCallCompleted)
    b = of((await mapped(second, ordinals)).events, ModelCallCompleted)
    retried = of((await mapped(first, ordinals)).events, ModelCallCompleted)
    ids = [
        usage_call_event_id(SCOPE, CONVERSATION, USAGE, 0),
        usage_call_event_id(SCOPE, CONVERSATION, (1020, 47, 120000, 0), 0),
        usage_call_event_id(SCOPE, CONVERSATION, (1020, 52, 120000, 0), 0),
        usage_call_event_id(SCOPE, CONVERSATION, USAGE, 1),
    ]
    assert [c.event_id for c in a + b] == ids and retried == a
    # The second request names no prompt: its calls belong to the turn begun before them, in the first.
    assert {c.turn_id for c in b} == {turn_id(0.5)}
    assert [type(e) for e in (await mapped(second, ordinals)).events] == [
        SessionCreated,
        TurnStarted,
        ModelCallCompleted,
        ModelCallCompleted,
    ]


async def test_call_ids_do_not_depend_on_the_order_of_arrival() -> None:
    """The same records, request by request and record by record in the reverse order: the same ids (a
    repeated usage's two calls may swap their occurrences, never add one)."""
    requests = [
        codex(starts(), prompt(0.5), completed(1.0), tool_decision(1.5), tool_result(2.0)),
        codex(prompt(5.0), completed(6.0, output_token_count=47), completed(7.0)),
    ]
    in_order: list[EventBase] = []
    ordinals = MemoryOrdinals()
    for req in requests:
        in_order += (await mapped(req, ordinals)).events
    reversed_: list[EventBase] = []
    ordinals = MemoryOrdinals()
    for req in reversed(requests):
        records = req.resource_logs[0].scope_logs[0].log_records
        backwards = list(reversed(records))
        del records[:]
        records.extend(backwards)
        reversed_ += (await mapped(req, ordinals)).events
    assert {e.event_id for e in reversed_} == {e.event_id for e in in_order}

    def calls(events: list[EventBase]) -> dict[uuid.UUID, tuple[int, int, int]]:
        return {
            e.event_id: (e.input_tokens, e.output_tokens, e.cache_read_tokens)
            for e in events
            if isinstance(e, ModelCallCompleted)
        }

    # Each id names the same call (the same tokens) both ways.
    assert calls(reversed_) == calls(in_order) and len(calls(in_order)) == 3
    # Each record found its turn: the prompts of a request are read before its other records.
    assert {(type(e).__name__, getattr(e, "turn_id", None)) for e in reversed_} == {
        (type(e).__name__, getattr(e, "turn_id", None)) for e in in_order
    }


async def test_records_follow_the_turn_begun_last_before_them() -> None:
    ordinals = MemoryOrdinals()
    await mapped(codex(prompt(0.5), prompt(10.0)), ordinals)
    # A late request with a record between the two prompts: the first turn, though the second began since.
    late = await mapped(codex(tool_result(5.0)), ordinals)
    (tool,) = of(late.events, ToolCallRecorded)
    assert tool.turn_id == turn_id(0.5)
    (turn,) = of(late.events, TurnStarted)
    assert turn.turn_id == turn_id(0.5) and turn.occurred_at == at(0.5)  # the turn's own start, not the record's


async def test_before_any_prompt_a_call_has_no_turn_and_a_tool_the_no_prompt_turn() -> None:
    result = await mapped(codex(completed(1.0), tool_result(2.0)))
    (call,) = of(result.events, ModelCallCompleted)
    assert call.turn_id is None
    (turn,) = of(result.events, TurnStarted)
    assert turn.turn_id == gateway_id("turn", SCOPE, CONVERSATION, "no-prompt")
    assert of(result.events, ToolCallRecorded)[0].turn_id == turn.turn_id


async def test_tool_result_is_a_tool_call() -> None:
    result = await mapped(codex(prompt(), tool_result()))
    (tool,) = of(result.events, ToolCallRecorded)
    assert tool.call_id == "call_1" and tool.name == "exec_command" and not tool.is_error
    assert tool.args == {"cmd": "cat notes.txt"} and tool.result == "alpha\n" and tool.result_bytes is None
    assert tool.finished_at == at(2) and tool.started_at == at(2) - timedelta(milliseconds=13)
    assert tool.tool_call_id == tool_call_id_of(SCOPE, CONVERSATION, "call_1") and tool.turn_id == turn_id(0.5)
    assert tool.event_id == gateway_id("tool_call_recorded", SCOPE, CONVERSATION, "call_1")
    roundtrip(result.events)


async def test_a_failed_tool_a_long_output_and_arguments_that_are_not_an_object() -> None:
    long = "x" * 20_000 + "é"
    failed = tool_result(success="false", arguments="ls -la", output=long)
    (tool,) = of((await mapped(codex(failed))).events, ToolCallRecorded)
    assert tool.is_error and tool.args == {"input": "ls -la"}
    assert tool.result == "x" * 16_000 and tool.result_bytes == 20_002
    (plain,) = of((await mapped(codex(tool_result(arguments=None, output=None)))).events, ToolCallRecorded)
    assert plain.args == {} and plain.result is None


async def test_arguments_sent_as_an_otlp_map_are_stored_as_json_reads_them() -> None:
    """A map holding bytes (base64 in JSON) or a float no JSON holds (NaN: null): args are what the stored event
    decodes to, so the event round-trips; arguments over 64 KiB of JSON are left out, the call kept."""
    sent = tool_result(arguments={"input": b"\x00\x01", "n": float("nan"), "list": [1, "a"]})
    (tool,) = of((await mapped(codex(sent))).events, ToolCallRecorded)
    assert tool.args == {"input": "AAE=", "n": None, "list": [1, "a"]}
    roundtrip([tool])
    (big,) = of((await mapped(codex(tool_result(arguments={"input": "x" * 70_000})))).events, ToolCallRecorded)
    assert big.args == {} and big.call_id == "call_1"


async def test_tool_decision_is_an_approval() -> None:
    result = await mapped(
        codex(
            prompt(),
            tool_decision(),
            tool_decision(call_id="call_2", decision="denied", source="User"),
            tool_decision(call_id="call_3", decision="approved_for_session", source="User"),
            tool_decision(call_id="call_4", decision="abort", source="User"),
        )
    )
    approvals = of(result.events, ApprovalDecided)
    assert [(a.call_id, a.status, a.decided_by) for a in approvals] == [
        ("call_1", ApprovalStatus.APPROVED, "policy"),
        ("call_2", ApprovalStatus.DENIED, "user"),
        ("call_3", ApprovalStatus.APPROVED, "user"),
        ("call_4", ApprovalStatus.DENIED, "user"),
    ]
    assert approvals[0].tool_call_id == tool_call_id_of(SCOPE, CONVERSATION, "call_1")
    assert approvals[0].turn_id == turn_id(0.5) and approvals[0].decided_at == at(1.5)
    roundtrip(result.events)


async def test_other_events_are_ignored_and_bad_records_refused() -> None:
    no_conversation = record("codex.user_prompt", {"prompt_length": "3"}, 1.0, nanos=False)
    result = await mapped(
        codex(
            codex_record("codex.api_request", {"duration_ms": "10"}, 0.1),
            codex_record("codex.sse_event", {"event.kind": "response.created"}, 0.2),
            codex_record("codex.turn_ttft", {"duration_ms": "54"}, 0.3),
            codex_record("codex.something_new", {}, 0.4),
            no_conversation,
            tool_result(call_id=None),
        )
    )
    assert result.ignored == 4 and result.rejected == 2 and result.events == []
    assert result.errors == ["codex.user_prompt without conversation.id", "codex.tool_result without call_id"]


async def test_invalid_resource_tags_refuse_the_resources_records() -> None:
    result = await mapped(codex(prompt(), completed(), resource={"cos.tag.Team": "x"}))
    assert result.events == [] and result.rejected == 2 and "upper case in the key" in result.errors[0]


async def test_a_retry_maps_to_the_same_events() -> None:
    ordinals = MemoryOrdinals()
    req = codex(starts(), prompt(), completed(), tool_decision(), tool_result())
    first, second = await mapped(req, ordinals), await mapped(req, ordinals)
    assert first.events == second.events and len({e.event_id for e in first.events}) == len(first.events)


async def test_a_duration_no_datetime_can_subtract_leaves_the_start_at_the_end() -> None:
    result = await mapped(codex(tool_result(duration_ms="1e300")))
    (call,) = of(result.events, ToolCallRecorded)
    assert call.started_at == call.finished_at


async def test_a_call_billing_cannot_store_is_refused_before_it_takes_an_ordinal() -> None:
    """A model name over 256 characters or a count beyond 64 bits: refused, and the next call is occurrence 0."""
    ordinals = MemoryOrdinals()
    result = await mapped(
        codex(
            completed(1.0, input_token_count=str(10**30)),
            codex_record(
                "codex.sse_event",
                {"event.kind": "response.completed", "model": "m" * 257, "output_token_count": "1"},
                2.0,
            ),
            completed(3.0),
        ),
        ordinals,
    )
    assert result.rejected == 2 and len(result.errors) == 2
    (call,) = of(result.events, ModelCallCompleted)
    assert call.event_id == usage_call_event_id(SCOPE, CONVERSATION, USAGE, 0)


async def test_the_same_call_twice_in_a_request_is_one_event() -> None:
    """Identical records (same time and counts; same call id) made two events of one id in a request."""
    result = await mapped(codex(completed(), completed(), tool_result(), tool_result()))
    ids = [e.event_id for e in result.events]
    assert len(ids) == len(set(ids)) == 4 and result.ignored == 2
