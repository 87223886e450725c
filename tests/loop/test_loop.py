"""The loop on memory adapters: every path of a turn, recorded as events."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from commonos.loop.approvals import TIMED_OUT, FixedApprover
from commonos.loop.journal import SessionNotFound
from commonos.loop.locks import MemorySessionLocks, SessionBusy
from commonos.loop.loop import Loop, TurnRequest, UnknownProfile
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import ModelRequest, ModelResponse, ProviderError, ScriptedProvider, build_provider
from commonos.loop.search import MemoryMessageSearch
from commonos.loop.tools import ToolContext, builtin_tools
from commonos.proto.events import (
    ApprovalDecided,
    ApprovalStatus,
    MemoryChanged,
    MessageAppended,
    ModelCallCompleted,
    Risk,
    SessionCreated,
    ToolCallRecorded,
    TurnFinished,
    TurnStarted,
    TurnStatus,
)
from commonos.proto.identity import TurnInfo
from commonos.proto.messages import (
    INTERRUPTED_RESULT,
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    close_open_tool_calls,
)
from commonos.proto.requests import ApprovalAnswer, ApprovalRequest
from tests.loop.helpers import of_type, write_profile


class ByCommand:
    """Approves `echo approved`, denies nothing, leaves everything else unanswered (timed out)."""

    def __init__(self) -> None:
        self.asked: list[ApprovalRequest] = []

    async def ask(self, request: ApprovalRequest, timeout_s: float) -> ApprovalAnswer:
        self.asked.append(request)
        if request.args.get("command") == "echo approved":
            return ApprovalAnswer(status=ApprovalStatus.APPROVED, decided_by="cli:ann")
        return TIMED_OUT


def make_loop(
    profile: Profile, journal: MemoryJournal | None = None, approver: Any = None, provider: Any = None
) -> Loop:
    journal = journal if journal is not None else MemoryJournal()
    return Loop(
        journal,
        {profile.id: profile},
        {profile.id: provider if provider is not None else build_provider(profile)},
        locks=MemorySessionLocks(),
        approver=approver if approver is not None else ByCommand(),
        search=MemoryMessageSearch(journal),
    )


async def test_a_turn_with_tools_approvals_and_a_delegation(profile: Profile) -> None:
    journal = MemoryJournal()
    approver = ByCommand()
    loop = make_loop(profile, journal, approver)
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="make a plan", tags=("client:acme",)))
    assert (result.status, result.text, result.error) == (TurnStatus.COMPLETED, "Done: 42.", None)
    events = journal.events

    parent_session, child_session = of_type(events, SessionCreated)
    assert (parent_session.source, parent_session.title, parent_session.tags) == (
        "cli",
        "make a plan",
        ("client:acme",),
    )
    assert (child_session.source, child_session.title, child_session.parent_session_id) == (
        "subagent",
        "Find the answer",
        parent_session.session_id,
    )
    parent_turn, child_turn = of_type(events, TurnStarted)
    resolved = ("area:work", "client:acme", "team:core")
    assert parent_turn.tags == child_turn.tags == resolved
    assert (parent_turn.depth, parent_turn.parent_turn_id) == (0, None)
    assert (child_turn.depth, child_turn.parent_turn_id, child_turn.session_id) == (
        1,
        parent_turn.turn_id,
        child_session.session_id,
    )
    assert parent_turn.context_snapshot == {"system_prompt": "Be brief.", "memory": [], "user": []}

    tools = {(t.session_id, t.name, t.args.get("command")): t for t in of_type(events, ToolCallRecorded)}
    p = parent_session.session_id
    listing = tools[(p, "list_dir", None)]
    assert (listing.approval, listing.risk, listing.is_error) == (None, Risk.LOW, False)
    approved = tools[(p, "shell", "echo approved")]
    assert (approved.approval, approved.risk, approved.is_error) == (ApprovalStatus.APPROVED, Risk.HIGH, False)
    assert approved.result == "exit code 0\napproved\n"
    denied = tools[(p, "write_file", None)]
    assert (denied.approval, denied.is_error, denied.result) == (
        ApprovalStatus.DENIED,
        True,
        "not run: denied by policy",
    )
    late = tools[(p, "shell", "echo unanswered")]
    assert (late.approval, late.is_error) == (ApprovalStatus.TIMED_OUT, True)
    delegated = tools[(p, "delegate", None)]
    assert (delegated.result, delegated.is_error) == ("42", False)
    assert not (profile.workspace / "x.txt").exists()

    decisions = {d.tool_call_id: d for d in of_type(events, ApprovalDecided)}
    assert {(d.status, d.decided_by) for d in decisions.values()} == {
        (ApprovalStatus.APPROVED, "cli:ann"),
        (ApprovalStatus.DENIED, "policy"),
        (ApprovalStatus.TIMED_OUT, "timeout"),
    }
    for tool in (approved, denied, late):
        assert decisions[tool.tool_call_id].call_id == tool.call_id
    assert [r.tool for r in approver.asked] == ["shell", "shell"]

    parent_messages = [m for m in of_type(events, MessageAppended) if m.session_id == p]
    assert [m.seq for m in parent_messages] == list(range(1, 13))
    assert [m.role for m in parent_messages] == ["user"] + ["assistant", "tool_result"] * 5 + ["assistant"]
    calls = of_type(events, ModelCallCompleted)
    assert len(calls) == 7 and {c.tags for c in calls} == {resolved}
    assert (calls[0].input_tokens, calls[0].cache_read_tokens, calls[0].cache_write_5m_tokens) == (100, 50, 5)
    finished = of_type(events, TurnFinished)
    assert [(f.turn_id, f.status) for f in finished] == [
        (child_turn.turn_id, TurnStatus.COMPLETED),
        (parent_turn.turn_id, TurnStatus.COMPLETED),
    ]


async def test_a_session_continues_with_its_history_and_frozen_snapshot(profile: Profile) -> None:
    seen: list[ModelRequest] = []
    scripted = build_provider(profile)

    class Recording:
        name = "scripted"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            seen.append(request)
            return await scripted.complete(request)

        async def close(self) -> None:
            return None

    journal = MemoryJournal()
    loop = make_loop(profile, journal, provider=Recording())
    remember = ToolCall(id="m1", name="memory", args={"action": "add", "target": "user", "content": "likes tea"})
    first = await loop.run_turn(TurnRequest(profile_id="demo", text="hello"))
    turn = of_type(journal.events, TurnStarted)[0]
    ctx = ToolContext(
        turn=loop_turn(turn), profile=profile, journal=journal, search=loop.search, delegate=loop._run_child
    )
    await builtin_tools()["memory"].run(ctx, remember.args)

    second = await loop.run_turn(TurnRequest(profile_id="demo", text="again", session_id=first.session_id))
    assert second.status is TurnStatus.COMPLETED and second.session_id == first.session_id
    # the running session keeps its snapshot; its history comes back
    assert seen[1].system == seen[0].system == "Be brief."
    assert [type(m) for m in seen[1].messages] == [UserMessage, AssistantMessage, UserMessage]
    # a new session sees the memory
    await loop.run_turn(TurnRequest(profile_id="demo", text="new"))
    assert seen[2].system == "Be brief.\n\n## About the user\n- likes tea"
    starts = of_type(journal.events, TurnStarted)
    assert [s.context_snapshot is not None for s in starts] == [True, False, True]
    [change] = of_type(journal.events, MemoryChanged)
    assert (change.target, change.op, change.position, change.content) == ("user", "add", 0, "likes tea")


def loop_turn(started: TurnStarted) -> TurnInfo:
    return TurnInfo(
        profile_id=started.profile_id, session_id=started.session_id, turn_id=started.turn_id, tags=started.tags
    )


async def test_memory_tool_adds_replaces_and_removes_in_order(profile: Profile) -> None:
    script = """
    [[conversations]]
    [[conversations.steps]]
    tool_calls = [
      { name = "memory", args = { action = "add", content = "b" } },
      { name = "memory", args = { action = "add", content = "a", position = 0 } },
      { name = "memory", args = { action = "replace", match = "b", content = "B" } },
      { name = "memory", args = { action = "remove", position = 0 } },
      { name = "memory", args = { action = "remove", position = 7 } },
    ]
    [[conversations.steps]]
    text = "ok"
    """
    p = write_profile(profile.folder.parent, "mem", script=script)
    journal = MemoryJournal()
    await make_loop(p, journal).run_turn(TurnRequest(profile_id="mem", text="remember"))
    assert (await journal.load_memory("mem")).memory == ("B",)
    results = [m.content for m in of_type(journal.events, MessageAppended) if isinstance(m.content, ToolResultMessage)]
    assert results[-1].is_error and "no entry at position 7" in results[-1].content
    assert results[0] == ToolResultMessage(call_id="call_0_0", content="memory entry added at position 0; now:\n0. b")
    assert [(c.op, c.position) for c in of_type(journal.events, MemoryChanged)] == [
        ("add", 0),
        ("add", 0),
        ("replace", 1),
        ("remove", 0),
    ]


async def test_step_limit_fails_the_turn(profile: Profile) -> None:
    journal = MemoryJournal()
    loop = make_loop(dataclasses.replace(profile, max_steps=2), journal)
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="plan"))
    assert result.status is TurnStatus.FAILED and result.error == "no final answer within max_steps=2 model calls"
    assert of_type(journal.events, TurnFinished)[-1].error == result.error


async def test_a_provider_failure_fails_the_turn_with_its_error(profile: Profile) -> None:
    class Broken:
        name = "broken"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            raise ProviderError("broken", "HTTP 500: overloaded (after 5 attempts)", status=500, retryable=True)

        async def close(self) -> None:
            return None

    journal = MemoryJournal()
    result = await make_loop(profile, journal, provider=Broken()).run_turn(TurnRequest(profile_id="demo", text="x"))
    assert result.status is TurnStatus.FAILED
    assert result.error == "model call failed: broken: HTTP 500: overloaded (after 5 attempts)"
    assert [type(e).__name__ for e in journal.events] == [
        "SessionCreated",
        "TurnStarted",
        "MessageAppended",
        "TurnFinished",
    ]


async def test_delegation_stops_at_the_profiles_depth(profile: Profile) -> None:
    script = """
    [[conversations]]
    [[conversations.steps]]
    tool_calls = [{ name = "delegate", args = { goal = "go deeper" } }]
    [[conversations.steps]]
    text = "stopped"
    """
    p = write_profile(profile.folder.parent, "deep", script=script)
    journal = MemoryJournal()
    result = await make_loop(p, journal).run_turn(TurnRequest(profile_id="deep", text="go"))
    assert result.status is TurnStatus.COMPLETED
    depths = [t.depth for t in of_type(journal.events, TurnStarted)]
    assert depths == [0, 1]
    child_call, parent_call = of_type(journal.events, ToolCallRecorded)
    # the child (depth 1 = max) is refused; the parent gets the child's answer
    assert (child_call.result, child_call.is_error) == ("delegation is limited to depth 1", True)
    assert (parent_call.result, parent_call.is_error) == ("stopped", False)


async def test_busy_session_and_bad_requests_are_typed_errors(profile: Profile) -> None:
    journal = MemoryJournal()
    loop = make_loop(profile, journal)
    first = await loop.run_turn(TurnRequest(profile_id="demo", text="hi"))
    lease = await loop.locks.acquire(first.session_id, "someone-else")
    with pytest.raises(SessionBusy) as busy:
        await loop.run_turn(TurnRequest(profile_id="demo", text="again", session_id=first.session_id))
    assert busy.value.holder == "someone-else"
    await lease.release()
    with pytest.raises(UnknownProfile):
        await loop.run_turn(TurnRequest(profile_id="nobody", text="x"))
    with pytest.raises(SessionNotFound):
        await loop.run_turn(TurnRequest(profile_id="demo", text="x", session_id=first.turn_id))
    other = dataclasses.replace(profile, id="other")
    loop.profiles["other"] = other
    loop.providers["other"] = ScriptedProvider.from_file(profile.folder / "script.toml")
    with pytest.raises(SessionNotFound, match="for profile 'other'"):
        await loop.run_turn(TurnRequest(profile_id="other", text="x", session_id=first.session_id))


@pytest.mark.parametrize("shutting_down", [False, True])
async def test_a_cancelled_turn_is_recorded_as_cancelled_or_interrupted(profile: Profile, shutting_down: bool) -> None:
    asked = asyncio.Event()

    class Waiting:
        async def ask(self, request: ApprovalRequest, timeout_s: float) -> ApprovalAnswer:
            asked.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    journal = MemoryJournal()
    loop = make_loop(profile, journal, approver=Waiting())
    task = asyncio.create_task(loop.run_turn(TurnRequest(profile_id="demo", text="wait")))
    await asyncio.wait_for(asked.wait(), 5)
    loop.shutting_down = shutting_down
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [finished] = of_type(journal.events, TurnFinished)
    assert finished.status is (TurnStatus.INTERRUPTED if shutting_down else TurnStatus.CANCELLED)
    # the session is free again, and its open tool call gets a result in the next request
    session_id = finished.session_id
    loop.approver = FixedApprover(ApprovalAnswer(status=ApprovalStatus.APPROVED, decided_by="t"))
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="more", session_id=session_id))
    assert result.status is TurnStatus.COMPLETED


def test_open_tool_calls_get_an_error_result() -> None:
    call = ToolCall(id="c1", name="shell", args={})
    history: list[Message] = [UserMessage(text="a"), AssistantMessage(tool_calls=(call,)), UserMessage(text="b")]
    closed = close_open_tool_calls(history)
    assert closed == [
        UserMessage(text="a"),
        AssistantMessage(tool_calls=(call,)),
        ToolResultMessage(call_id="c1", content=INTERRUPTED_RESULT, is_error=True),
        UserMessage(text="b"),
    ]
    done: list[Message] = [*history[:2], ToolResultMessage(call_id="c1", content="ok")]
    assert close_open_tool_calls(done) == done


async def test_unknown_tools_and_scripted_usage_estimates(profile: Profile) -> None:
    script = """
    [[conversations]]
    [[conversations.steps]]
    tool_calls = [{ name = "teleport", args = {} }]
    [[conversations.steps]]
    text = "fine"
    """
    p = write_profile(profile.folder.parent, "odd", script=script)
    journal = MemoryJournal()
    await make_loop(p, journal).run_turn(TurnRequest(profile_id="odd", text="go"))
    [record] = of_type(journal.events, ToolCallRecorded)
    assert record.is_error and record.result is not None and record.result.startswith("unknown tool 'teleport'")
    assert all(c.usage_estimated for c in of_type(journal.events, ModelCallCompleted))
