"""The loop's hooks (`commonos.loop.hooks`), through both Journal adapters (memory, NATS JetStream): every point
is called with the turn's TurnInfo in the documented order, hooks run in the profile's order, a refusing
`before_tool_call` is recorded as a refusal of that call, a raising hook fails its turn (recorded, naming the
hook) and never the loop, and `before_model_call` can replace the history the turn goes on from."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from commonos.accounting.usage import TokenUsage
from commonos.loop.approvals import FixedApprover
from commonos.loop.event_journal import EventJournal
from commonos.loop.hooks import POINTS, Hook, HookSetup, Refusal
from commonos.loop.journal import ToolCallRecord
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import ModelRequest, ModelResponse, build_provider
from commonos.proto.events import (
    ApprovalDecided,
    ApprovalStatus,
    Event,
    MessageAppended,
    ToolCallRecorded,
    TurnFinished,
    TurnStarted,
    TurnStatus,
)
from commonos.proto.identity import TurnInfo
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage
from commonos.proto.requests import ApprovalAnswer
from tests.loop.helpers import of_type, write_profile

SCRIPT = """
[[conversations]]
match = "tools"

[[conversations.steps]]
text = "Looking."
tool_calls = [
  { name = "list_dir", args = { path = "." } },
  { name = "shell", args = { command = "echo hi" } },
]

[[conversations.steps]]
text = "done"

[[conversations]]

[[conversations.steps]]
text = "hello"
"""

CONFIG = """
tags = ["team:core"]
provider = "scripted"
model = "scripted-test"
system_prompt = "Be brief."
max_steps = 5

[provider_options]
script = "script.toml"
"""

#: What a hook sees of the turn "tools", point by point.
TOOLS_TURN = [
    "turn_started",
    "message_appended",  # the user's text
    "before_model_call",
    "after_model_call",
    "message_appended",  # the assistant's tool calls
    "before_tool_call",  # list_dir
    "after_tool_call",
    "message_appended",
    "before_tool_call",  # shell
    "after_tool_call",
    "message_appended",
    "before_model_call",
    "after_model_call",
    "message_appended",  # the answer
    "turn_finished",
]


async def stored(journal: EventJournal) -> list[Event]:
    if isinstance(journal, MemoryJournal):
        return list(journal.events)
    assert isinstance(journal, NatsJournal)
    return await journal.events()


Calls = list[tuple[str, str, tuple[Any, ...]]]


class Recorder(Hook):
    """Notes (hook, point, arguments) of every call in a list shared by the test's hooks."""

    calls: Calls

    async def turn_started(self, turn: TurnInfo) -> None:
        self.calls.append((self.name, "turn_started", (turn,)))

    async def message_appended(self, turn: TurnInfo, message: Message, seq: int) -> None:
        self.calls.append((self.name, "message_appended", (turn, message, seq)))

    async def before_model_call(self, turn: TurnInfo, request: ModelRequest) -> ModelRequest | None:
        self.calls.append((self.name, "before_model_call", (turn, request)))
        return None

    async def after_model_call(self, turn: TurnInfo, request: ModelRequest, response: ModelResponse) -> None:
        self.calls.append((self.name, "after_model_call", (turn, request, response)))

    async def before_tool_call(self, turn: TurnInfo, call: ToolCall) -> Refusal | None:
        self.calls.append((self.name, "before_tool_call", (turn, call)))
        return None

    async def after_tool_call(self, turn: TurnInfo, call: ToolCall, record: ToolCallRecord) -> None:
        self.calls.append((self.name, "after_tool_call", (turn, call, record)))

    async def turn_finished(self, turn: TurnInfo, status: TurnStatus, error: str | None) -> None:
        self.calls.append((self.name, "turn_finished", (turn, status, error)))


def recorder(calls: Calls) -> Callable[[HookSetup], Hook]:
    def build(setup: HookSetup) -> Hook:
        hook = Recorder(setup)
        hook.calls = calls
        return hook

    return build


class RefuseShell(Hook):
    async def before_tool_call(self, turn: TurnInfo, call: ToolCall) -> Refusal | None:
        return Refusal("no shell here") if call.name == "shell" else None


def raising_at(point: str) -> Callable[[HookSetup], Hook]:
    class Raising(Hook):
        pass

    async def boom(self: Hook, *args: Any) -> Any:
        raise RuntimeError(f"boom at {point}")

    setattr(Raising, point, boom)
    return Raising


def make_loop(
    journal: EventJournal, tmp_path: Path, hooks: dict[str, Callable[[HookSetup], Hook]], provider: Any = None
) -> tuple[Loop, FixedApprover]:
    profile = write_profile(tmp_path / "profiles", config=CONFIG, script=SCRIPT)
    profile = dataclasses.replace(profile, hooks=tuple(hooks))
    approver = FixedApprover(ApprovalAnswer(status=ApprovalStatus.APPROVED, decided_by="cli:ann"))
    loop = Loop(
        journal,
        {profile.id: profile},
        {profile.id: provider if provider is not None else build_provider(profile)},
        locks=MemorySessionLocks(),
        approver=approver,
        hook_factories=hooks,
    )
    return loop, approver


async def test_every_point_gets_the_turn_info_in_order_and_hooks_run_in_the_profiles_order(
    journal: EventJournal, tmp_path: Path
) -> None:
    calls: Calls = []
    loop, _ = make_loop(journal, tmp_path, {"second": recorder(calls), "first": recorder(calls)})
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="tools please"))
    assert result.status is TurnStatus.COMPLETED and result.text == "done"

    # At each point the hooks run in the order the profile lists them ("second" is listed first).
    assert [(name, point) for name, point, _ in calls] == [
        (name, point) for point in TOOLS_TURN for name in ("second", "first")
    ]
    events = await stored(journal)
    [started] = of_type(events, TurnStarted)
    turn = calls[0][2][0]
    assert isinstance(turn, TurnInfo)
    assert (turn.turn_id, turn.session_id, turn.tags, turn.depth) == (
        started.turn_id,
        started.session_id,
        started.tags,
        0,
    )
    assert all(args[0] == turn for _, _, args in calls)
    mine = [args for name, _, args in calls if name == "first"]
    by_point = {point: [a for (n, p, a) in calls if n == "first" and p == point] for point in POINTS}
    assert len(mine) == len(TOOLS_TURN)
    # message_appended: each recorded message with its seq, as the journal stored it
    appended = of_type(events, MessageAppended)
    assert [(a[1], a[2]) for a in by_point["message_appended"]] == [(m.content, m.seq) for m in appended]
    # tool calls: the call before, its record (as stored) after
    assert [a[1].name for a in by_point["before_tool_call"]] == ["list_dir", "shell"]
    recorded = of_type(events, ToolCallRecorded)
    assert [a[2].tool_call_id for a in by_point["after_tool_call"]] == [r.tool_call_id for r in recorded]
    # model calls: the request the model got, then its response
    first_request = by_point["before_model_call"][0][1]
    assert first_request.messages == (UserMessage(text="tools please"),) and first_request.system == "Be brief."
    assert by_point["after_model_call"][1][2].message.text == "done"
    # the end: its status and error, before `turn_finished` is stored with them
    assert by_point["turn_finished"] == [(turn, TurnStatus.COMPLETED, None)]
    [finished] = of_type(events, TurnFinished)
    assert (finished.status, finished.error) == (TurnStatus.COMPLETED, None)


async def test_a_refusing_hook_is_recorded_as_a_refusal_of_that_call(journal: EventJournal, tmp_path: Path) -> None:
    calls: Calls = []
    loop, approver = make_loop(journal, tmp_path, {"no-shell": RefuseShell, "after": recorder(calls)})
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="tools please"))
    assert result.status is TurnStatus.COMPLETED

    events = await stored(journal)
    tools = {t.name: t for t in of_type(events, ToolCallRecorded)}
    shell = tools["shell"]
    assert (shell.approval, shell.is_error, shell.result) == (
        ApprovalStatus.DENIED,
        True,
        "not run: refused by hook 'no-shell': no shell here",
    )
    [decision] = of_type(events, ApprovalDecided)
    assert (decision.tool_call_id, decision.status, decision.decided_by) == (
        shell.tool_call_id,
        ApprovalStatus.DENIED,
        "hook:no-shell",
    )
    assert (tools["list_dir"].approval, tools["list_dir"].is_error) == (None, False)
    assert approver.asked == []  # refused before the policy would have asked anyone
    # The first refusal decides: the hook after it is not asked, but sees the call recorded.
    assert [a[1].name for _, p, a in calls if p == "before_tool_call"] == ["list_dir"]
    assert [a[2].result for _, p, a in calls if p == "after_tool_call"][1] == shell.result
    # The model sees the refusal as the call's error result.
    results = [m.content for m in of_type(events, MessageAppended) if m.role == "tool_result"]
    assert isinstance(results[1], ToolResultMessage) and results[1].content == shell.result


@pytest.mark.parametrize("point", POINTS)
async def test_a_raising_hook_fails_its_turn_naming_the_hook_and_the_loop_goes_on(
    journal: EventJournal, tmp_path: Path, point: str
) -> None:
    calls: Calls = []
    loop, _ = make_loop(journal, tmp_path, {"boom": raising_at(point), "after": recorder(calls)})
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="tools please"))
    error = f"hook 'boom' failed in {point}: RuntimeError: boom at {point}"
    assert (result.status, result.error, result.text) == (TurnStatus.FAILED, error, "")
    events = await stored(journal)
    [finished] = of_type(events, TurnFinished)
    assert (finished.turn_id, finished.status, finished.error) == (result.turn_id, TurnStatus.FAILED, error)
    # The turn stopped at the failing point: the hook listed after it was not called there, nor later, but
    # for the end, of which every hook is told.
    points = [p for _, p, _ in calls]
    if point == "turn_finished":
        assert points == TOOLS_TURN
    else:
        assert points == [*TOOLS_TURN[: TOOLS_TURN.index(point)], "turn_finished"]
    told = (TurnStatus.COMPLETED, None) if point == "turn_finished" else (TurnStatus.FAILED, error)
    assert calls[-1][2][1:] == told
    if point == "before_tool_call":
        assert of_type(events, ToolCallRecorded) == []  # the call never ran, nor was it recorded

    # The loop is fine: the same session takes another turn.
    again = await loop.run_turn(TurnRequest(profile_id="demo", text="hi", session_id=result.session_id))
    assert again.status in (TurnStatus.COMPLETED, TurnStatus.FAILED)
    assert again.status is TurnStatus.COMPLETED or "hook 'boom'" in (again.error or "")
    assert len(of_type(await stored(journal), TurnFinished)) == 2


class ListThenAnswer:
    """A model that lists the workspace when the last message is the user's, and answers otherwise."""

    name = "scripted"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if isinstance(request.messages[-1], UserMessage):
            message = AssistantMessage(tool_calls=(ToolCall(id="c1", name="list_dir", args={"path": "."}),))
        else:
            message = AssistantMessage(text="done")
        usage = TokenUsage(input_tokens=1, output_tokens=1)
        return ModelResponse(message=message, usage=usage, provider="scripted", model=request.model)

    async def close(self) -> None:
        return None


async def test_before_model_call_can_replace_the_history_the_turn_goes_on_from(
    journal: EventJournal, tmp_path: Path
) -> None:
    """What a compaction hook needs: the model gets the replaced messages, and the turn goes on from them."""
    seen: list[ModelRequest] = []

    class Compact(Hook):
        async def before_model_call(self, turn: TurnInfo, request: ModelRequest) -> ModelRequest | None:
            if len(request.messages) < 2:
                return None
            summary = UserMessage(text=f"[summary of {len(request.messages) - 1} messages]")
            return msgspec.structs.replace(request, messages=(summary, request.messages[-1]))

    class Seen(Hook):
        async def before_model_call(self, turn: TurnInfo, request: ModelRequest) -> ModelRequest | None:
            seen.append(request)
            return None

    loop, _ = make_loop(journal, tmp_path, {"compact": Compact, "seen": Seen}, provider=ListThenAnswer())
    first = await loop.run_turn(TurnRequest(profile_id="demo", text="first"))
    assert (first.status, first.text) == (TurnStatus.COMPLETED, "done")
    second = await loop.run_turn(TurnRequest(profile_id="demo", text="second", session_id=first.session_id))
    assert (second.status, second.text) == (TurnStatus.COMPLETED, "done")

    # Each hook gets the request as the hooks before it left it; the turn goes on from the replaced history.
    summaries = [m.text if isinstance(m, UserMessage) else type(m).__name__ for r in seen for m in r.messages]
    assert summaries == [
        "first",
        "[summary of 2 messages]",
        "ToolResultMessage",
        "[summary of 4 messages]",  # the whole history of the session and the new text, at the turn's start
        "second",
        "[summary of 3 messages]",  # not 6: the turn went on from the compacted history
        "ToolResultMessage",
    ]
    # The journal is unchanged by it: every message stored, in order.
    appended = [m for m in of_type(await stored(journal), MessageAppended) if m.session_id == first.session_id]
    assert [m.seq for m in appended] == list(range(1, 9))
