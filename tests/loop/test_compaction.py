"""The built-in `compaction` hook (`commonos.loop.compaction`), through both Journal adapters (memory, NATS
JetStream) and, for the projection, the journal-writer on real PostgreSQL: a session over its budget is
compacted (a billed summary call with the turn's tags, the summary appended, the older messages deactivated),
the next turn's model request holds the summary and not what it replaced, tool calls and their results are
never split, and a profile that does not list the hook never compacts."""

from __future__ import annotations

import uuid
from pathlib import Path

import asyncpg
import pytest
from nats.js import JetStreamContext

from commonos.loop.approvals import FixedApprover
from commonos.loop.compaction import SUMMARY_PREFIX, estimate_tokens, message_tokens, split_point
from commonos.loop.event_journal import EventJournal
from commonos.loop.journal import HistoryEntry
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import ModelRequest, ModelResponse, build_provider
from commonos.loop.providers.base import COMPACTION_SYSTEM
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.proto.requests import ApprovalAnswer
from tests.loop.helpers import of_type, write_profile
from tests.support import journal_writer

T1 = "first question " + "a" * 1600
T2 = "second question " + "b" * 1600
T3 = "third question"

SCRIPT = """
summary = "SUMMARY: the user sent a long first question; a list_dir ran; answered one."

[[conversations]]
match = "compacted"
[[conversations.steps]]
text = "answer two"
[[conversations.steps]]
text = "answer three"

[[conversations]]
[[conversations.steps]]
text = "Looking."
tool_calls = [{ name = "list_dir", args = { path = "." } }]
[[conversations.steps]]
text = "answer one"
[[conversations.steps]]
text = "answer two"
[[conversations.steps]]
text = "answer three"
"""

CONFIG = """
tags = ["team:core"]
provider = "scripted"
model = "scripted-test"
system_prompt = "Be brief."
tools = ["list_dir"]
max_steps = 5
hooks = {hooks}

[provider_options]
script = "script.toml"

[compaction]
max_tokens = 700
context_window = 100000
"""


class Recording:
    """The profile's scripted provider, keeping every request it is given."""

    name = "scripted"

    def __init__(self, profile: Profile) -> None:
        self.inner = build_provider(profile)
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        return await self.inner.complete(request)

    async def close(self) -> None:
        await self.inner.close()


async def stored(journal: EventJournal) -> list[ev.Event]:
    if isinstance(journal, MemoryJournal):
        return list(journal.events)
    assert isinstance(journal, NatsJournal)
    return await journal.events()


def make_loop(journal: EventJournal, tmp_path: Path, hooks: str = '["compaction"]') -> tuple[Loop, Recording]:
    profile = write_profile(tmp_path / "profiles", config=CONFIG.format(hooks=hooks), script=SCRIPT)
    provider = Recording(profile)
    loop = Loop(
        journal,
        {profile.id: profile},
        {profile.id: provider},
        locks=MemorySessionLocks(),
        approver=FixedApprover(ApprovalAnswer(status=ev.ApprovalStatus.APPROVED, decided_by="cli:ann")),
    )
    return loop, provider


async def three_turns(loop: Loop) -> uuid.UUID:
    first = await loop.run_turn(TurnRequest(profile_id="demo", text=T1))
    assert (first.status, first.text) == (ev.TurnStatus.COMPLETED, "answer one")
    second = await loop.run_turn(TurnRequest(profile_id="demo", session_id=first.session_id, text=T2))
    assert (second.status, second.text) == (ev.TurnStatus.COMPLETED, "answer two"), second.error
    third = await loop.run_turn(TurnRequest(profile_id="demo", session_id=first.session_id, text=T3))
    assert (third.status, third.text) == (ev.TurnStatus.COMPLETED, "answer three"), third.error
    return first.session_id


def texts(request: ModelRequest) -> list[str]:
    return [m.text for m in request.messages if isinstance(m, UserMessage)]


async def test_a_session_over_its_budget_is_compacted_and_the_next_turn_sees_the_summary(
    journal: EventJournal, tmp_path: Path
) -> None:
    loop, provider = make_loop(journal, tmp_path)
    session_id = await three_turns(loop)

    # Turn 1: two calls under the budget; turn 2: over it, so a summary call, then the turn's own; turn 3: one.
    summary_calls = [r for r in provider.requests if r.system == COMPACTION_SYSTEM]
    assert len(provider.requests) == 5 and len(summary_calls) == 1
    assert estimate_tokens(provider.requests[2]) <= 700  # the summary call's transcript is not a turn's request
    [summarised] = summary_calls
    assert T1 in texts(summarised)[0] and "list_dir" in texts(summarised)[0] and T2 not in texts(summarised)[0]

    # Turn 2 goes on from the summary and its own text; turn 3 from the summary, turn 2's messages and its own.
    turn2, turn3 = provider.requests[3], provider.requests[4]
    summary = SUMMARY_PREFIX + "SUMMARY: the user sent a long first question; a list_dir ran; answered one."
    assert texts(turn2) == [summary, T2]
    assert texts(turn3) == [summary, T2, T3]
    assert [m.text for m in turn3.messages if isinstance(m, AssistantMessage)] == ["answer two"]
    assert not any(isinstance(m, ToolResultMessage) for m in turn3.messages)

    events = await stored(journal)
    appended = of_type(events, ev.MessageAppended)
    [deactivated] = of_type(events, ev.MessageDeactivated)
    by_id = {m.message_id: m for m in appended}
    # The user's first text, the tool call, its result and the answer: compacted together.
    assert [by_id[i].role for i in deactivated.message_ids] == ["user", "assistant", "tool_result", "assistant"]
    assert [by_id[i].seq for i in deactivated.message_ids] == [1, 2, 3, 4]

    # The summary call is billed like every call of the turn: a model_call_completed with the turn's tags.
    calls = of_type(events, ev.ModelCallCompleted)
    turns = [t.turn_id for t in of_type(events, ev.TurnStarted)]
    assert [c.turn_id for c in calls] == [turns[0], turns[0], turns[1], turns[1], turns[2]]
    assert all(c.tags == ("team:core",) for c in calls)

    # load_history: the summary and what came after it; the entries (history, search) keep everything.
    history = await journal.load_history(session_id, "demo")
    # (in the journal's order: the summary was appended after turn 2's text; the hook puts it first)
    assert [getattr(m, "text", None) for m in history] == [T2, summary, "answer two", T3, "answer three"]
    entries = await journal.load_entries(session_id, "demo")
    assert len(entries) == len(appended) == 9
    assert [e.seq for e in entries if not e.active] == [1, 2, 3, 4]


async def test_a_profile_without_the_hook_never_compacts(journal: EventJournal, tmp_path: Path) -> None:
    loop, provider = make_loop(journal, tmp_path, hooks="[]")
    await three_turns(loop)
    assert len(provider.requests) == 4 and all(r.system != COMPACTION_SYSTEM for r in provider.requests)
    assert estimate_tokens(provider.requests[-1]) > 700  # over the budget, and still whole
    assert all(T1 in texts(r) for r in provider.requests)
    events = await stored(journal)
    assert of_type(events, ev.MessageDeactivated) == []


def entry(seq: int, message: UserMessage | AssistantMessage | ToolResultMessage) -> HistoryEntry:
    return HistoryEntry(seq=seq, message_id=uuid.uuid4(), turn_id=uuid.uuid4(), message=message)


def test_the_split_never_falls_between_a_tool_call_and_its_results() -> None:
    big = "x" * 2000
    entries = [
        entry(1, UserMessage(text="go")),
        entry(2, AssistantMessage(tool_calls=(ToolCall(id="a", name="list_dir"), ToolCall(id="b", name="shell")))),
        entry(3, ToolResultMessage(call_id="a", content=big)),
        entry(4, ToolResultMessage(call_id="b", content="small")),
        entry(5, AssistantMessage(text="done")),
        entry(6, UserMessage(text="next")),
    ]
    # The tail from the small result fits, but a tail cannot start at a result: it starts at "done".
    keep = sum(message_tokens(e.message) for e in entries[3:])
    assert sum(message_tokens(e.message) for e in entries[2:]) > keep
    assert split_point(entries, keep) == 4
    # With room for everything after the first message, the tail starts at the tool call, its results with it.
    assert split_point(entries, 10_000) == 1
    # Only tool results after the first message: nothing can be compacted.
    assert split_point(entries[1:4], 10) is None


@pytest.mark.slow
async def test_the_projection_shows_the_inactive_messages_and_the_summary(
    streams: JetStreamContext, nats_url: str, database_url: str, tmp_path: Path
) -> None:
    from commonos.billing.service import CONSUMER_NAME
    from tests.billing.support import POSITIONS, billing
    from tests.support import wait_caught_up, wait_for_position

    journal = NatsJournal(streams)
    loop, _ = make_loop(journal, tmp_path)
    session_id = await three_turns(loop)
    last = (await streams.stream_info("COS_EVENTS")).state.last_seq
    async with journal_writer(nats_url, database_url), billing(nats_url, database_url):
        await wait_for_position(database_url, "journal-writer", last, timeout_s=30)
        await wait_caught_up(streams, database_url, CONSUMER_NAME, table=POSITIONS, timeout_s=30)
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT seq, role, active, content->>'text' AS text FROM messages WHERE session_id = $1 ORDER BY seq",
            session_id,
        )
        turns = await conn.fetch("SELECT id FROM turns WHERE session_id = $1 ORDER BY started_at", session_id)
        calls = await conn.fetch(
            "SELECT turn_id, tags FROM model_calls WHERE session_id = $1 ORDER BY created_at", session_id
        )
    finally:
        await conn.close()
    # Billing: the summary call is turn 2's, with its tags, like the turn's own call.
    second = turns[1]["id"]
    assert [(c["turn_id"], list(c["tags"])) for c in calls].count((second, ["team:core"])) == 2
    assert len(calls) == 5 and all(list(c["tags"]) == ["team:core"] for c in calls)
    assert [(r["seq"], r["role"], r["active"]) for r in rows] == [
        (1, "user", False),
        (2, "assistant", False),
        (3, "tool_result", False),
        (4, "assistant", False),
        (5, "user", True),
        (6, "user", True),
        (7, "assistant", True),
        (8, "user", True),
        (9, "assistant", True),
    ]
    assert rows[5]["text"].startswith(SUMMARY_PREFIX) and rows[0]["text"] == T1
