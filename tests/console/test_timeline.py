"""The turn timeline (pages/timeline.py): the spans of what was stored, over the JSON API on the real servers, and
the live view's changes for each event (pure: events in, operations on the page out)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from commonos.console.pages.timeline import Known, LiveSession, Op, Span, lay_out
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.proto.requests import ApprovalRequest
from tests.console.conftest import RunningConsole
from tests.factories import Clock, SessionBuilder

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def span(key: str, start_s: float, end_s: float | None) -> Span:
    return Span(
        key=key,
        kind="tool",
        label=key,
        started_at=T0 + timedelta(seconds=start_s),
        finished_at=None if end_s is None else T0 + timedelta(seconds=end_s),
        status="completed",
    )


def test_bars_are_thousandths_of_the_turns_axis() -> None:
    first, second, running, instant = span("a", 0, 2), span("b", 5, 10), span("c", 8, None), span("d", 10, 10)
    lay_out([first, second, running, instant], T0, T0 + timedelta(seconds=10))
    assert (first.x, first.width) == (0, 200)
    assert (second.x, second.width) == (500, 500)
    # A running span reaches the axis' end; an instant stays visible, within the axis.
    assert (running.x, running.width) == (800, 200)
    assert instant.width == 4 and instant.x + instant.width <= 1000


async def test_the_api_gives_each_turns_spans(
    console: RunningConsole, hostile: tuple[SessionBuilder, SessionBuilder]
) -> None:
    parent, child = hostile
    client, _ = await console.signed_in("olivia")
    async with client.get(f"/api/sessions/{parent.session_id}/timeline") as r:
        assert r.status == 200, await r.text()
        [turn] = await r.json()
    kinds = [(s["kind"], s["key"].split(":")[0]) for s in turn["spans"]]
    assert sorted(k for k, _ in kinds) == ["child", "model", "tool"], kinds
    assert turn["status"] == "completed" and turn["number"] == 1
    assert turn["model_calls"] == 1 and turn["tool_calls"] == 1 and turn["input_tokens"] == 1200
    spans = {s["kind"]: s for s in turn["spans"]}
    assert spans["tool"]["label"] == "delegate" and spans["tool"]["args"] == {"goal": "look"}
    assert spans["child"]["session_id"] == str(child.session_id) and spans["child"]["input_tokens"] == 500
    assert spans["model"]["cost_usd"] is not None and spans["model"]["cost_status"] == "priced"
    for s in turn["spans"]:
        assert 0 <= s["x"] <= 1000 and 4 <= s["width"] <= 1000 - s["x"], s

    # The child's own timeline: its risky call approved by a person is a wait under the call.
    async with client.get(f"/api/sessions/{child.session_id}/timeline") as r:
        [child_turn] = await r.json()
    assert [s["key"] for s in child_turn["spans"] if s["kind"] != "model"] == ["tool:s1", "approval:s1"]
    wait = child_turn["spans"][-1]
    assert wait["nested"] and wait["approval"] == "approved" and wait["decided_by"] == "cli:tester"
    async with client.get(f"/api/sessions/{uuid.uuid4()}/timeline") as r:
        assert r.status == 404


def puts(ops: list[Op], into: str | None = None) -> list[str]:
    return [o.key or o.id or "" for o in ops if o.op == "put" and (into is None or o.into == into)]


def test_a_tool_call_is_one_element_whose_state_changes() -> None:
    s = SessionBuilder("acme", Clock())
    view = LiveSession(s.session_id, Known())
    t = s.start_turn()
    s.message(t, UserMessage(text="go"))
    s.model_call(t)
    s.message(t, AssistantMessage(tool_calls=(ToolCall(id="c1", name="shell", args={"cmd": "ls"}),)))
    ops: list[list[Op]] = [view.apply(e) for e in s.events]
    started, user, model, asked = ops
    assert puts(started) == [f"turn-{t}", f"tl-{t}"]
    assert puts(user, f"turn-{t}") == ["msg:1"]
    assert puts(model, f"tl-{t}-spans") == [f"model:{s.events[2].event_id}"]
    assert [(o.id, o.n) for o in model if o.op == "add"] == [
        ("total-model-calls", 1),
        ("total-input-tokens", 1000),
        ("total-output-tokens", 200),
    ]
    assert puts(asked, f"turn-{t}") == ["msg:2"] and puts(asked, f"tl-{t}-spans") == ["tool:c1"]

    # A person is asked; then decides; the call runs; its result comes back: the same keys each time.
    request = ApprovalRequest(
        approval_id=uuid.uuid4(),
        profile_id="acme",
        session_id=s.session_id,
        turn_id=t,
        call_id="c1",
        tool="shell",
        expires_at=datetime.now(UTC) + timedelta(minutes=1),
    )
    waiting = view.apply(request)
    assert puts(waiting, f"turn-{t}") == ["call:c1"]
    assert puts(waiting, f"tl-{t}-spans") == ["tool:c1", "approval:c1"]
    assert "waiting for approval" in html_of(waiting, "call:c1")
    s.events.clear()
    s.tool_call(t, "c1", "shell", {"cmd": "ls"}, "a b", approval=ev.ApprovalStatus.APPROVED)
    s.message(t, ToolResultMessage(call_id="c1", content="a b"))
    decided, recorded, result = (view.apply(e) for e in s.events)
    assert puts(decided, f"turn-{t}") == ["call:c1"] and "approved by cli:tester" in html_of(decided, "call:c1")
    assert puts(recorded, f"turn-{t}") == ["call:c1"]
    assert puts(recorded, f"tl-{t}-spans") == ["tool:c1", "approval:c1"]
    assert 'class="status approved"' in html_of(recorded, "approval:c1")
    assert "details" in html_of(recorded, "call:c1") and "a b" in html_of(recorded, "call:c1")
    # The result is already in the call: nothing new.
    assert puts(result) == []

    s.events.clear()
    s.finish(t)
    [finished] = s.events
    statuses = {o.id: o.status for o in view.apply(finished) if o.op == "status"}
    assert statuses == {f"turn-status-{t}": "completed", f"tl-status-{t}": "completed", "session-status": "completed"}
    # The same event through the second subscription changes nothing.
    assert view.apply(finished) == []


def html_of(ops: list[Op], key: str) -> str:
    [html] = [o.html for o in ops if o.key == key]
    assert html is not None
    return html


def test_a_delegated_child_turn_is_a_span_of_its_parent_turn_and_others_are_not() -> None:
    clock = Clock()
    s = SessionBuilder("acme", clock)
    t = s.start_turn()
    view = LiveSession(s.session_id, Known(turns=[t]))
    child = SessionBuilder("acme", clock).create(source="delegate", parent_session_id=s.session_id)
    ct = child.start_turn(parent_turn_id=t, depth=1)
    child.model_call(ct, input_tokens=10, output_tokens=5)
    child.finish(ct)
    stranger = SessionBuilder("acme", clock).create()
    st = stranger.start_turn()
    stranger.model_call(st)
    stranger.finish(st)
    applied: list[tuple[ev.Event, list[Op]]] = [(e, view.apply(e)) for e in child.events + stranger.events]
    by_type: dict[str, list[Op]] = {}
    for e, ops in applied:
        if e.session_id == child.session_id:
            by_type.setdefault(type(e).__name__, []).extend(ops)
        else:
            assert ops == [], e
    assert puts(by_type["TurnStarted"], f"tl-{t}-spans") == [f"child:{ct}"]
    # The child's model call counts in the header (its totals include delegated sessions) and in its span.
    model_ops = by_type["ModelCallCompleted"]
    assert ("total-model-calls", 1) in [(o.id, o.n) for o in model_ops if o.op == "add"]
    assert 'data-in="10"' in html_of(model_ops, f"child:{ct}")
    assert 'class="status completed"' in html_of(by_type["TurnFinished"], f"child:{ct}")


def op_json(ops: list[Op]) -> list[dict[str, Any]]:
    return [o.json() for o in ops]


def test_an_operation_says_only_what_it_sets() -> None:
    assert op_json([Op("add", id="total-model-calls", n=2)]) == [{"op": "add", "id": "total-model-calls", "n": 2}]
    assert op_json([Op("put", into="conversation", id="turn-1", html="<article></article>", mode="create")]) == [
        {"op": "put", "into": "conversation", "id": "turn-1", "html": "<article></article>", "mode": "create"}
    ]
    assert op_json([Op("status", id="session-status", status="running")]) == [
        {"op": "status", "id": "session-status", "status": "running"}
    ]
