"""The GenAI spans mapping (`commonos.otlp_gateway.genai`): one test per rule of its table, on spans built
by hand; then split traces published in both orders through the real journal-writer (NATS + PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import nats
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from commonos.billing.projection import check_model_call
from commonos.otlp_gateway.common import Source
from commonos.otlp_gateway.genai import MAX_ERROR_CHARS, MAX_RESULT_CHARS, map_spans, provider_name
from commonos.proto import events as ev
from commonos.proto.events import MAX_NAME_CHARS
from commonos.proto.graph.ids import mint_id
from commonos.proto.subjects import DLQ_STREAM
from tests.otlp_gateway.genai_spans import T0, agent, chat, checked, of_type, request, span, tool
from tests.support import journal_writer, publish_all, wait_caught_up

SOURCE = Source("acme")
TRACE_HEX = (1).to_bytes(16, "big").hex()


def span_hex(n: int) -> str:
    return n.to_bytes(8, "big").hex()


def turn_of(n: int, profile: str = "acme") -> uuid.UUID:
    return uuid.UUID(mint_id("turn", "otel", profile, TRACE_HEX, span_hex(n)))


def one_agent_trace() -> list[Span]:
    """invoke_agent (1) -> chat (2), execute_tool (3); a non-GenAI HTTP span (4) in the agent too."""
    return [
        span(1, None, agent(1, **{"gen_ai.conversation.id": "conv-1"}), start=0, end=10),
        span(2, 1, chat(**{"gen_ai.response.id": "msg_1"}), start=1, end=3),
        span(3, 1, tool(), start=4, end=5),
        span(4, 3, {"http.request.method": "GET"}, start=4.1, end=4.9),
    ]


# --- the table, row by row ----------------------------------------------------------------------------


def test_an_agent_span_is_a_turn_with_its_calls() -> None:
    mapped = checked(map_spans(request(*one_agent_trace()), SOURCE))
    assert (mapped.rejected, mapped.ignored) == (0, 1)
    kinds = [ev.event_type(e) for e in mapped.events]
    assert kinds == ["session_created", "turn_started", "model_call_completed", "tool_call_recorded", "turn_finished"]
    session = uuid.UUID(mint_id("session", "otel", "acme", "conv-1"))
    assert {e.session_id for e in mapped.events} == {session}
    (created,) = of_type(mapped, ev.SessionCreated)
    assert (created.source, created.parent_session_id) == ("otel", None)
    (started,) = of_type(mapped, ev.TurnStarted)
    (finished,) = of_type(mapped, ev.TurnFinished)
    assert started.turn_id == finished.turn_id == turn_of(1)
    assert (started.depth, started.parent_turn_id) == (0, None)
    assert started.occurred_at == ev.decode_event(ev.encode_event(started)).occurred_at
    assert finished.occurred_at - started.occurred_at == timedelta(seconds=10)
    assert (finished.status, finished.error) == (ev.TurnStatus.COMPLETED, None)
    (call,) = of_type(mapped, ev.ModelCallCompleted)
    assert call.turn_id == turn_of(1)
    assert (call.provider, call.model, call.request_id, call.latency_s) == (
        "anthropic",
        "claude-sonnet-4-5",
        "msg_1",
        2,
    )
    (recorded,) = of_type(mapped, ev.ToolCallRecorded)
    assert (recorded.turn_id, recorded.call_id, recorded.name, recorded.is_error) == (
        turn_of(1),
        "call_1",
        "search",
        False,
    )
    assert (recorded.args, recorded.result) == ({}, None)  # no content recorded
    assert recorded.finished_at - recorded.started_at == timedelta(seconds=1)


def test_every_id_is_deterministic_so_a_retried_request_changes_nothing() -> None:
    first = map_spans(request(*one_agent_trace()), SOURCE)
    again = map_spans(request(*one_agent_trace()), SOURCE)
    assert [ev.encode_event(e) for e in first.events] == [ev.encode_event(e) for e in again.events]
    # Another profile's identical spans are other sessions, turns and events.
    other = map_spans(request(*one_agent_trace()), Source("other"))
    assert not {e.event_id for e in first.events} & {e.event_id for e in other.events}
    assert not {e.session_id for e in first.events} & {e.session_id for e in other.events}


def test_input_tokens_include_the_cache_and_our_buckets_do_not() -> None:
    usage = {
        "gen_ai.usage.input_tokens": 1000,
        "gen_ai.usage.cache_read.input_tokens": 600,
        "gen_ai.usage.cache_creation.input_tokens": 150,
        "gen_ai.usage.output_tokens": 300,
        "gen_ai.usage.reasoning.output_tokens": 120,
    }
    mapped = checked(map_spans(request(span(1, None, agent(1)), span(2, 1, chat(**usage))), SOURCE))
    (call,) = of_type(mapped, ev.ModelCallCompleted)
    assert (call.input_tokens, call.cache_read_tokens, call.cache_write_5m_tokens, call.cache_write_1h_tokens) == (
        250,
        600,
        150,
        0,
    )
    assert (call.output_tokens, call.reasoning_tokens) == (300, 120)
    check_model_call(call)  # billing takes it
    # All of the input cached: no uncached input.
    mapped = map_spans(request(span(2, None, chat(**{"gen_ai.usage.cache_read.input_tokens": 100}))), SOURCE)
    assert of_type(mapped, ev.ModelCallCompleted)[0].input_tokens == 0
    # The deprecated names, when the new ones are absent.
    old: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o"}
    old |= {"gen_ai.usage.prompt_tokens": 7, "gen_ai.usage.completion_tokens": 3}
    (call,) = of_type(map_spans(request(span(5, None, old)), SOURCE), ev.ModelCallCompleted)
    assert (call.provider, call.input_tokens, call.output_tokens) == ("openai", 7, 3)


@pytest.mark.parametrize(
    ("usage", "reason"),
    [
        ({"gen_ai.usage.cache_read.input_tokens": 90, "gen_ai.usage.cache_creation.input_tokens": 20}, "exceed"),
        ({"gen_ai.usage.reasoning.output_tokens": 11}, "reasoning.output_tokens (11) exceeds"),
        ({"gen_ai.usage.output_tokens": -1}, "not a count"),
        ({"gen_ai.usage.input_tokens": "lots"}, "not a count"),
        ({"gen_ai.usage.input_tokens": 1.5}, "not a count"),
    ],
)
def test_counts_that_do_not_add_up_are_refused_with_the_reason(usage: dict[str, Any], reason: str) -> None:
    good = span(3, 1, chat(), start=2, end=3)
    mapped = checked(map_spans(request(span(1, None, agent(1)), span(2, 1, chat(**usage)), good), SOURCE))
    assert mapped.rejected == 1
    assert len(mapped.errors) == 1 and reason in mapped.errors[0] and span_hex(2) in mapped.errors[0]
    (call,) = of_type(mapped, ev.ModelCallCompleted)  # the rest of the request is mapped
    assert call.latency_s == 1
    assert len(of_type(mapped, ev.TurnStarted)) == 1


def test_model_name_provider_and_stop_reason() -> None:
    attrs = chat(
        **{
            "gen_ai.operation.name": "generate_content",
            "gen_ai.provider.name": "gcp.gemini",
            "gen_ai.request.model": "gemini-2.5-pro",
            "gen_ai.response.model": "gemini-2.5-pro-001",
            "gen_ai.response.finish_reasons": ["stop", "length"],
        }
    )
    (call,) = of_type(map_spans(request(span(1, None, attrs)), SOURCE), ev.ModelCallCompleted)
    assert (call.provider, call.model, call.stop_reason) == ("google", "gemini-2.5-pro-001", "stop,length")
    assert [provider_name(p) for p in ("aws.bedrock", "mistral_ai", "x_ai", "OpenAI", "groq")] == [
        "aws",
        "mistral",
        "x-ai",
        "openai",
        "groq",
    ]
    for op in ("text_completion", "embeddings"):
        assert of_type(
            map_spans(request(span(1, None, chat(**{"gen_ai.operation.name": op}))), SOURCE), ev.ModelCallCompleted
        )
    # A name billing cannot store is refused.
    mapped = map_spans(request(span(1, None, chat(**{"gen_ai.response.model": "m" * (MAX_NAME_CHARS + 1)}))), SOURCE)
    assert mapped.rejected == 1 and "longer than 256" in mapped.errors[0]
    # A model call without a provider or a model is refused.
    bare = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}
    mapped = map_spans(request(span(1, None, bare), span(2, None, {**chat(), "gen_ai.request.model": ""})), SOURCE)
    assert mapped.rejected == 2 and not mapped.events
    assert "gen_ai.provider.name" in mapped.errors[0] and "gen_ai.request.model" in mapped.errors[1]


def test_error_statuses() -> None:
    spans = [
        span(1, None, agent(1), end=10, error="the model refused"),
        span(2, 1, chat(**{"gen_ai.usage.input_tokens": 5}), start=1, end=2),
        span(3, 1, {k: v for k, v in chat().items() if not k.startswith("gen_ai.usage")}, start=2, end=3, error=""),
        span(4, 1, tool(**{"error.type": "TimeoutError"}), start=3, end=4, error=""),
    ]
    mapped = checked(map_spans(request(*spans), SOURCE))
    (finished,) = of_type(mapped, ev.TurnFinished)
    assert (finished.status, finished.error) == (ev.TurnStatus.FAILED, "the model refused")
    assert len(of_type(mapped, ev.ModelCallCompleted)) == 1  # the failed call used nothing: ignored
    assert mapped.ignored == 1
    (recorded,) = of_type(mapped, ev.ToolCallRecorded)
    assert recorded.is_error
    # An agent span failing without a message: its error.type.
    mapped = map_spans(request(span(1, None, agent(1, **{"error.type": "Cancelled"}), error="")), SOURCE)
    assert of_type(mapped, ev.TurnFinished)[0].error == "Cancelled"
    mapped = map_spans(request(span(1, None, agent(1), error="e" * 5000)), SOURCE)
    assert of_type(mapped, ev.TurnFinished)[0].error == "e" * MAX_ERROR_CHARS


def test_tool_content_only_when_recorded_and_a_long_result_is_cut() -> None:
    long = "x" * (MAX_RESULT_CHARS + 10)
    spans = [
        span(1, None, agent(1), end=9),
        span(2, 1, tool(**{"gen_ai.tool.call.arguments": '{"q": "otel"}', "gen_ai.tool.call.result": "found"})),
        span(3, 1, tool(**{"gen_ai.tool.call.arguments": {"n": 2}, "gen_ai.tool.call.result": {"ok": True}})),
        span(4, 1, tool(**{"gen_ai.tool.call.arguments": "not json", "gen_ai.tool.call.result": long})),
        span(5, 1, {"gen_ai.operation.name": "execute_tool"}, name="execute_tool lookup"),
        span(6, 1, {"gen_ai.operation.name": "execute_tool"}, name="execute_tool"),
    ]
    mapped = checked(map_spans(request(*spans), SOURCE))
    calls = of_type(mapped, ev.ToolCallRecorded)
    assert [(c.args, c.result, c.result_bytes) for c in calls[:2]] == [
        ({"q": "otel"}, "found", None),
        ({"n": 2}, '{"ok":true}', None),
    ]
    assert calls[2].args == {"arguments": "not json"}
    assert (len(calls[2].result or ""), calls[2].result_bytes) == (MAX_RESULT_CHARS, len(long))
    assert (calls[3].name, calls[3].call_id) == ("lookup", span_hex(5))  # no tool name or id: from the span
    assert mapped.rejected == 1 and "gen_ai.tool.name" in mapped.errors[0]


def test_other_spans_are_ignored() -> None:
    spans = [
        span(1, None, {"gen_ai.operation.name": "create_agent", "gen_ai.agent.name": "a"}),
        span(2, None, {"gen_ai.operation.name": "retrieval"}),
        span(3, None, {"http.request.method": "POST"}),
    ]
    mapped = map_spans(request(*spans), SOURCE)
    assert (mapped.events, mapped.ignored, mapped.rejected) == ([], 3, 0)


# --- sessions -----------------------------------------------------------------------------------------


def test_sessions_by_conversation_our_own_and_per_trace() -> None:
    ours = uuid.uuid4()
    spans = [
        span(1, None, chat(**{"gen_ai.conversation.id": "conv-9"}), trace=1),
        span(2, None, chat(**{"cos.session_id": str(ours), "gen_ai.conversation.id": "x"}), trace=2),
        span(3, None, chat(), trace=3),
        span(4, None, chat(**{"gen_ai.conversation.id": "conv-9"}), trace=4),  # another trace, same conversation
    ]
    mapped = checked(map_spans(request(*spans), SOURCE))
    calls = of_type(mapped, ev.ModelCallCompleted)
    conv = uuid.UUID(mint_id("session", "otel", "acme", "conv-9"))
    per_trace = uuid.UUID(mint_id("session", "otel-trace", "acme", (3).to_bytes(16, "big").hex()))
    assert [c.session_id for c in calls] == [conv, ours, per_trace, conv]
    created = of_type(mapped, ev.SessionCreated)
    assert sorted(str(c.session_id) for c in created) == sorted([str(conv), str(per_trace)])  # ours exists
    # Split over two requests, the conversation's session_created is the same event.
    first = of_type(map_spans(request(spans[0]), SOURCE), ev.SessionCreated)
    second = of_type(map_spans(request(spans[3]), SOURCE), ev.SessionCreated)
    assert first[0].event_id == second[0].event_id


def test_a_span_takes_the_session_its_nearest_ancestor_names() -> None:
    spans = [
        span(1, None, {"http.route": "/chat", "gen_ai.conversation.id": "from-root"}, end=10),
        span(2, 1, agent(2), start=1, end=9),
        span(3, 2, chat(), start=2, end=3),
    ]
    mapped = checked(map_spans(request(*spans), SOURCE))
    assert {e.session_id for e in mapped.events} == {uuid.UUID(mint_id("session", "otel", "acme", "from-root"))}


def test_resource_tags_and_an_invalid_one_refuses_the_resource() -> None:
    spans = one_agent_trace()
    resource = {"service.name": "app", "client": "acme", "cos.tag.cost-center": "cc42", "other": "x"}
    mapped = checked(map_spans(request(*spans, resource=resource), SOURCE))
    for event in mapped.events:
        if isinstance(event, ev.SessionCreated | ev.TurnStarted | ev.ModelCallCompleted):
            assert event.tags == ("client:acme", "cost-center:cc42")
    mapped = map_spans(request(*spans, resource={"client": "Acme Corp"}), SOURCE)
    assert (mapped.events, mapped.rejected) == ([], 4)
    assert "resource attribute 'client'" in mapped.errors[0]
    mapped = map_spans(request(*spans, resource={"team": "a"}), Source("acme", tag_attributes=()))
    assert of_type(mapped, ev.TurnStarted)[0].tags == ()


# --- delegation ---------------------------------------------------------------------------------------


def test_a_nested_agent_is_a_child_turn() -> None:
    spans = [
        span(1, None, agent(1, **{"gen_ai.conversation.id": "parent"}), end=20),
        span(2, 1, tool("delegate"), start=1, end=19),
        span(3, 2, agent(3), start=2, end=18),  # same conversation (inherited)
        span(4, 3, {"framework.step": 1}, start=3, end=17),
        span(5, 4, agent(5, **{"gen_ai.conversation.id": "child"}), start=4, end=16),
        span(6, 5, chat(), start=5, end=6),
    ]
    mapped = checked(map_spans(request(*spans), SOURCE))
    turns = {t.turn_id: t for t in of_type(mapped, ev.TurnStarted)}
    assert [(turns[turn_of(n)].parent_turn_id, turns[turn_of(n)].depth) for n in (1, 3, 5)] == [
        (None, 0),
        (turn_of(1), 1),
        (turn_of(3), 2),
    ]
    parent = uuid.UUID(mint_id("session", "otel", "acme", "parent"))
    child = uuid.UUID(mint_id("session", "otel", "acme", "child"))
    assert turns[turn_of(3)].session_id == parent and turns[turn_of(5)].session_id == child
    sessions = {s.session_id: s for s in of_type(mapped, ev.SessionCreated)}
    assert (sessions[parent].parent_session_id, sessions[child].parent_session_id) == (None, parent)
    (call,) = of_type(mapped, ev.ModelCallCompleted)
    assert (call.turn_id, call.session_id) == (turn_of(5), child)
    (delegate,) = of_type(mapped, ev.ToolCallRecorded)
    assert delegate.turn_id == turn_of(1)


def test_a_loop_of_parents_ends() -> None:
    spans = [span(1, 2, agent(1)), span(2, 1, agent(2)), span(3, 3, chat())]
    mapped = checked(map_spans(request(*spans), SOURCE))
    assert len(of_type(mapped, ev.TurnStarted)) == 3  # two agents, and the placeholder of the self-parented chat


# --- spans without an agent, and spans split across requests -----------------------------------------


def test_a_call_without_an_agent_is_a_turn_of_its_trace_root() -> None:
    spans = [span(1, None, {"http.route": "/ask"}, end=5), span(2, 1, chat(), start=1, end=2)]
    mapped = checked(map_spans(request(*spans), SOURCE))
    (started,) = of_type(mapped, ev.TurnStarted)
    (finished,) = of_type(mapped, ev.TurnFinished)
    assert started.turn_id == finished.turn_id == turn_of(1) == of_type(mapped, ev.ModelCallCompleted)[0].turn_id
    assert finished.occurred_at - started.occurred_at == timedelta(seconds=5)
    # A lone root chat span is its own turn.
    mapped = checked(map_spans(request(span(7, None, chat())), SOURCE))
    assert of_type(mapped, ev.TurnStarted)[0].turn_id == turn_of(7)
    # Split: the chat first gets a placeholder of the same turn, the same turn_started event id.
    alone = checked(map_spans(request(spans[1]), SOURCE))
    assert of_type(alone, ev.TurnStarted)[0].event_id == started.event_id
    assert not of_type(alone, ev.TurnFinished)


def split_trace(conversation_on_children: bool = True) -> list[Span]:
    conversation = {"gen_ai.conversation.id": "split"}
    named = conversation if conversation_on_children else {}
    return [
        span(1, None, agent(1, **conversation), start=0, end=10, error="boom"),
        span(2, 1, chat(**named), start=1, end=2),
        span(3, 1, tool(**named), start=3, end=4),
    ]


def test_children_before_their_agent_get_a_placeholder_the_agent_duplicates() -> None:
    whole = checked(map_spans(request(*split_trace()), SOURCE))
    agent_span, *children = split_trace()
    early = checked(map_spans(request(*children), SOURCE))
    late = checked(map_spans(request(agent_span), SOURCE))
    (placeholder,) = of_type(early, ev.TurnStarted)
    (real,) = of_type(late, ev.TurnStarted)
    assert (
        (placeholder.event_id, placeholder.turn_id)
        == (real.event_id, real.turn_id)
        == (
            of_type(whole, ev.TurnStarted)[0].event_id,
            turn_of(1),
        )
    )
    assert placeholder.occurred_at - real.occurred_at == timedelta(seconds=1)  # its earliest child's start
    assert not of_type(early, ev.TurnFinished)
    # Every call and tool call is the same event whatever the split; the events of the split trace are
    # the whole trace's (the placeholder's payload aside).
    body = (ev.ModelCallCompleted, ev.ToolCallRecorded, ev.TurnFinished, ev.SessionCreated)
    split_ids = {e.event_id for e in early.events + late.events}
    assert split_ids == {e.event_id for e in whole.events}
    assert [ev.encode_event(e) for e in whole.events if isinstance(e, body[:3])] == [
        ev.encode_event(e) for e in early.events + late.events if isinstance(e, body[:3])
    ]
    # Children naming no conversation, split from the agent that does: their trace's session (documented).
    agent_span, *children = split_trace(conversation_on_children=False)
    early = checked(map_spans(request(*children), SOURCE))
    per_trace = uuid.UUID(mint_id("session", "otel-trace", "acme", TRACE_HEX))
    assert {e.session_id for e in early.events} == {per_trace}
    assert {e.event_id for e in early.events if not isinstance(e, ev.SessionCreated)} <= {
        e.event_id for e in whole.events
    }


def test_our_own_loops_spans_map_to_nothing() -> None:
    """The loop published its events itself: its spans, received by our gateway, change nothing."""
    session, turn, call, tool_event, tool_call = (uuid.uuid4() for _ in range(5))
    ours = {"cos.session_id": str(session), "cos.turn_id": str(turn), "gen_ai.conversation.id": str(session)}
    spans = [
        span(1, None, agent(1, **ours, **{"cos.turn.depth": 0}), end=10),
        span(2, 1, chat(**ours, **{"cos.event_id": str(call)}), start=1, end=2),
        span(3, 1, tool(**ours, **{"cos.event_id": str(tool_event), "cos.tool_call_id": str(tool_call)})),
        span(4, 1, chat(**ours), start=5, end=6),
    ]
    for requests in ([spans], [spans[1:], spans[:1]]):
        each = [map_spans(request(*spans_), SOURCE) for spans_ in requests]
        assert [e for m in each for e in m.events] == []
        assert sum(m.ignored for m in each) == 4 and sum(m.rejected for m in each) == 0
    # An id of ours that is no UUID is a broken span, refused with the reason.
    mapped = map_spans(request(span(2, None, chat(**{**ours, "cos.event_id": "nope"}))), SOURCE)
    assert mapped.rejected == 1 and "cos.event_id 'nope' is not a UUID" in mapped.errors[0]
    # The same spans without our ids are another agent's: they are mapped.
    theirs = [span(1, None, agent(1), end=10), span(2, 1, chat(), start=1, end=2)]
    assert any(isinstance(e, ev.ModelCallCompleted) for e in map_spans(request(*theirs), SOURCE).events)


def test_malformed_spans_are_refused() -> None:
    bad_trace = span(1, None, chat())
    bad_trace.trace_id = b"\0" * 16
    bad_span = span(2, None, chat())
    bad_span.span_id = b"\1\2"
    backwards = span(3, None, chat(), start=5, end=4)
    unset = span(4, None, chat())
    unset.start_time_unix_nano = 0
    mapped = map_spans(request(bad_trace, bad_span, backwards, unset), SOURCE)
    assert (mapped.rejected, mapped.events) == (4, [])
    assert any("trace id" in e for e in mapped.errors) and any("ends before it starts" in e for e in mapped.errors)


def test_an_agent_without_a_time_is_refused_and_its_calls_still_mapped() -> None:
    """The agent (no start time) is refused; its call keeps the agent's turn, which it starts, and the session's
    time is the call's, never the agent's missing one (a session_created must have a time)."""
    untimed = span(1, None, agent(1, **{"gen_ai.conversation.id": "conv-u"}), start=0, end=10)
    untimed.start_time_unix_nano = 0
    mapped = map_spans(request(span(2, 1, chat(), start=1, end=3), untimed), SOURCE)
    assert mapped.rejected == 1 and any("no start or end time" in e for e in mapped.errors)
    (created,) = of_type(mapped, ev.SessionCreated)
    assert created.occurred_at == datetime.fromtimestamp((T0 + 1_000_000_000) / 1e9, UTC)
    (call,) = of_type(mapped, ev.ModelCallCompleted)
    assert call.turn_id == turn_of(1)
    # The agent's turn is started by its call (a placeholder, as for a parent not in the request), so a
    # tool call of it is not dead-lettered for a turn that never starts.
    (started,) = of_type(mapped, ev.TurnStarted)
    assert (started.turn_id, started.occurred_at) == (turn_of(1), created.occurred_at)
    checked(mapped)


# --- through the journal-writer -----------------------------------------------------------------------


@pytest.mark.parametrize("order", ["children_first", "agent_first"])
async def test_a_split_trace_is_accepted_by_the_journal_writer_in_either_order(
    order: str, nats_url: str, database_url: str
) -> None:
    agent_span, *children = split_trace()
    nested = [
        span(5, 3, agent(5), start=3.1, end=3.9),  # a delegated agent under the tool call
        span(6, 5, chat(), start=3.2, end=3.3),
    ]
    parts = [request(*children), request(agent_span, *nested)]
    if order == "agent_first":
        parts.reverse()
    events: list[ev.EventBase] = []
    for part in parts:
        mapped = checked(map_spans(part, SOURCE))
        assert mapped.rejected == 0
        events += mapped.events
    retried = map_spans(parts[0], SOURCE).events  # an exporter's retry of the first request
    acks = await publish_all(nats_url, [*events, *retried])  # type: ignore[list-item]
    assert sum(1 for a in acks if a.duplicate) >= len(retried)

    nc = await nats.connect(nats_url)
    try:
        async with journal_writer(nats_url, database_url):
            await wait_caught_up(nc.jetstream(), database_url, "journal-writer")
        assert (await nc.jetstream().stream_info(DLQ_STREAM)).state.messages == 0
    finally:
        await nc.close()
    conn = await asyncpg.connect(database_url)
    try:
        turns = await conn.fetch("SELECT id, status, error, depth, parent_turn_id, finished_at FROM turns")
        by_id = {r["id"]: r for r in turns}
        assert set(by_id) == {turn_of(1), turn_of(5)}
        assert (by_id[turn_of(1)]["status"], by_id[turn_of(1)]["error"]) == ("failed", "boom")
        assert by_id[turn_of(5)]["status"] == "completed"
        assert all(r["finished_at"] is not None for r in turns)
        assert await conn.fetchval("SELECT count(*) FROM tool_calls WHERE turn_id = $1", turn_of(1)) == 1
        # The conversation's, and the trace's: the delegated agent names none and is cut from its parent.
        assert await conn.fetchval("SELECT count(*) FROM sessions") == 2
        started = await conn.fetchval("SELECT started_at FROM turns WHERE id = $1", turn_of(1))
        # The turn's row is the first turn_started published: the placeholder when the children came first.
        expected = datetime.fromtimestamp(T0 // 10**9, UTC) + timedelta(seconds=order == "children_first")
        assert started == expected
    finally:
        await conn.close()


def test_a_count_beyond_64_bits_is_refused() -> None:
    """A usage count billing cannot store (above 2**63 - 1) made a call billing dead-letters: refused."""
    mapped = map_spans(request(span(1, None, chat(**{"gen_ai.usage.input_tokens": str(2**63)}))), SOURCE)
    assert mapped.rejected == 1 and "not a count" in mapped.errors[0]
    assert of_type(mapped, ev.ModelCallCompleted) == []
