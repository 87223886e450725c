"""Fuzz target: every string the loop can produce is projectable.

Strings are drawn from the whole of Unicode that UTF-8 JSON can carry (no lone surrogates: msgspec
neither writes nor reads them, so no event can hold one), weighted towards U+0000, the two symbols the
escaping uses (␀ U+2400, ␛ U+241B), backslashes and `\\u0000` written out. They go where the loop takes
text from outside: a chat text (refused at the boundary when it holds U+0000, taken otherwise), the
profile's system prompt, a model's answers, tool calls (ids, names, arguments at any nesting), a tool's
output, a delegated goal, a memory entry, an approver's name (one without U+0000: the boundary refuses
the rest) and a model's error.

A turn runs on the memory adapters with those strings; each event it records is encoded and decoded as
the journal-writer receives it, checked and planned with the core projection's pure functions (and the
Memory plugin's `memory_rows`), and every parameter is checked: no text holds U+0000 and every text and
JSON parameter decodes (`unescape_nul`, `unescape_nul_json`) back to exactly the event's value. No
event the loop can produce is one PostgreSQL would refuse, so no turn reported `completed` can leave
rows missing.

The second target stores the events of as many drawn turns through a real nats-server, journal-writer
and PostgreSQL: every row is there and nothing is dead-lettered.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import asyncpg
import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from commonos.accounting.usage import TokenUsage
from commonos.journal_writer.memory import memory_rows
from commonos.journal_writer.projection import check_event, plan_events, profiles_mentioned
from commonos.journal_writer.service import serve, writer_projections, writer_schemas
from commonos.loop.approvals import FixedApprover
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import BadRequest, Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import ApprovalPolicy, Policy, Profile
from commonos.loop.providers import ModelRequest, ModelResponse, ProviderError
from commonos.loop.tools import ToolContext, ToolOutput, builtin_tools
from commonos.proto import events as ev
from commonos.proto.identity import stored_title, title_from_text
from commonos.proto.messages import AssistantMessage, ToolCall
from commonos.proto.requests import ApprovalAnswer
from commonos.proto.text import ESCAPE_SYMBOL, NUL, NUL_SYMBOL, unescape_nul, unescape_nul_json
from commonos.runtime.dlq import list_dead_letters
from commonos.runtime.settings import Settings
from tests.fuzz.conftest import PROFILE_ENV
from tests.support import publish_all, wait_caught_up, wait_for_position

#: The characters that matter most, then any character UTF-8 JSON can hold.
_SPECIAL: Final = [NUL, NUL_SYMBOL, ESCAPE_SYMBOL, "\\", "\\u0000", '"', "\n", "\x01", "é", "😀"]
texts = st.lists(st.sampled_from(_SPECIAL) | st.text(st.characters(codec="utf-8"), max_size=8), max_size=8).map("".join)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(texts, json_values, max_size=4)


@dataclass(frozen=True)
class Case:
    """What the outside world hands the loop in one turn (and its delegated child's)."""

    chat: str
    source: str
    system_prompt: str
    first_text: str | None
    emit_id: str
    emit_args: dict[str, Any]
    output: str
    output_is_error: bool
    goal: str
    memory: str
    other_id: str
    other_name: str
    other_args: dict[str, Any]
    child_answer: str
    answer: str
    decided_by: str
    #: The model's last call fails with this, or answers.
    fails_with: str | None


cases = st.builds(
    Case,
    chat=texts,
    source=st.sampled_from(["web", "cli", "service"]),
    system_prompt=texts,
    first_text=st.none() | texts,
    emit_id=texts,
    emit_args=arguments,
    output=texts,
    output_is_error=st.booleans(),
    goal=texts,
    memory=texts,
    other_id=texts,
    other_name=texts,
    other_args=arguments,
    child_answer=texts,
    answer=texts,
    decided_by=texts.map(lambda s: s.replace(NUL, "")),
    fails_with=st.none() | texts,
)


class DrawnModel:
    """The parent's first call asks for every tool, its second answers (or fails); the child answers."""

    name = "fuzz"

    def __init__(self, case: Case) -> None:
        self.case = case

    async def complete(self, request: ModelRequest) -> ModelResponse:
        c = self.case
        child = not any(t.name == "delegate" for t in request.tools)
        step = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if child:
            message = AssistantMessage(text=c.child_answer)
        elif step == 0:
            calls = (
                ToolCall(id=c.emit_id, name="emit", args=c.emit_args),
                ToolCall(id="d", name="delegate", args={"goal": c.goal}),
                ToolCall(id="m", name="memory", args={"action": "add", "content": c.memory}),
                ToolCall(id=c.other_id, name=c.other_name, args=c.other_args),
            )
            message = AssistantMessage(text=c.first_text, tool_calls=calls)
        elif c.fails_with is not None:
            raise ProviderError("fuzz", c.fails_with)
        else:
            message = AssistantMessage(text=c.answer)
        return ModelResponse(message=message, usage=TokenUsage(input_tokens=1), provider="fuzz", model="fuzz")

    async def close(self) -> None:
        return None


class Emit:
    """A risky tool (it waits for an approval) returning the drawn output."""

    name = "emit"
    description = "returns what it was given"
    parameters: dict[str, Any] = {"type": "object"}  # noqa: RUF012
    risk = ev.Risk.HIGH

    def __init__(self, case: Case) -> None:
        self.case = case

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        return ToolOutput(self.case.output, self.case.output_is_error)


async def run_case(case: Case) -> tuple[list[ev.Event], ev.TurnStatus | None]:
    """The events the loop records for `case`, and its turn's status (None: refused at the boundary)."""
    profile = Profile(
        id="demo",
        folder=Path("/nonexistent"),
        tags=("client:acme",),
        provider="scripted",
        system_prompt=case.system_prompt,
        tools=("emit", "delegate", "memory"),
        max_delegation_depth=1,
        approval=ApprovalPolicy(tools={"emit": Policy.ASK}),
    )
    journal = MemoryJournal()
    loop = Loop(
        journal,
        {"demo": profile},
        {"demo": DrawnModel(case)},
        locks=MemorySessionLocks(),
        approver=FixedApprover(ApprovalAnswer(status=ev.ApprovalStatus.APPROVED, decided_by=case.decided_by)),
        tools={**builtin_tools(), "emit": Emit(case)},
    )
    try:
        result = await loop.run_turn(TurnRequest(profile_id="demo", text=case.chat, source=case.source))
    except BadRequest as exc:
        assert NUL in case.chat and str(exc).startswith("the chat text contains U+0000"), exc
        assert journal.events == []
        return [], None
    assert NUL not in case.chat, "a chat text holding U+0000 was taken"
    return list(journal.events), result.status


def _json_value(value: Any) -> Any:
    """`value` as JSON reads it back."""
    return json.loads(msgspec.json.encode(value))


Field = Callable[[Any], Any]
#: Per statement, the text parameters (by position) and where their original is in the event.
TEXT: Final[dict[str, dict[int, Field]]] = {
    "session_insert": {2: lambda e: e.source, 3: lambda e: stored_title(e.title) if e.title else None},
    "session_title": {1: lambda e: title_from_text(e.content.text)},
    "tool_call_insert": {4: lambda e: e.call_id, 5: lambda e: e.name, 7: lambda e: e.result},
    "approval_insert": {5: lambda e: e.decided_by},
    "turn_finish": {2: lambda e: e.error},
}
#: Per statement, the JSON parameters and their original.
JSON: Final[dict[str, dict[int, Field]]] = {
    "session_snapshot": {1: lambda e: e.context_snapshot},
    "message_insert": {6: lambda e: e.content},
    "tool_call_insert": {6: lambda e: e.args},
}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def check_projectable(event: ev.Event) -> int:
    """Plan `event` as the writer receives it and check every parameter; how many were checked."""
    received = ev.decode_event(ev.encode_event(event))
    check_event(received)
    plan = plan_events([received])
    profiles_mentioned([received])
    checked = 0
    for statement, rows in plan.rows.items():
        for row in rows:
            for index, param in enumerate(row):
                for value in param if isinstance(param, list) else [param]:
                    if isinstance(value, str):
                        assert NUL not in value, (statement, index)
                        value.encode("utf-8")  # what asyncpg sends
                        checked += 1
            for index, original in TEXT.get(statement, {}).items():
                stored = row[index]
                assert (unescape_nul(stored) if stored is not None else None) == original(received), (statement, index)
            for index, original in JSON.get(statement, {}).items():
                stored = json.loads(row[index])
                assert all(NUL not in s for s in _strings(stored)), (statement, index)  # jsonb refuses \\u0000
                assert unescape_nul_json(stored) == _json_value(original(received)), (statement, index)
    for memory in memory_rows(received):
        for value in memory.args:
            if isinstance(value, str):
                assert NUL not in value
                checked += 1
        assert isinstance(received, ev.MemoryChanged)
        if memory.sql.lstrip().startswith(("INSERT INTO memory_entries", "UPDATE memory_entries SET content")):
            assert unescape_nul(memory.args[4]) == (received.content or "")
    return checked


@given(cases)
def test_every_string_the_loop_can_produce_is_projectable(case: Case) -> None:
    events, status = asyncio.run(run_case(case))
    if status is None:
        return
    if case.fails_with is None:
        assert status is ev.TurnStatus.COMPLETED
    assert sum(check_projectable(e) for e in events) > 0


# --- through real servers ------------------------------------------------------------------------------

LONG: Final = os.environ.get(PROFILE_ENV) == "long"
TURNS: Final = 2_000 if LONG else 100


def draw_cases(n: int) -> list[Case]:
    out: list[Case] = []

    @settings(
        max_examples=n,
        phases=[Phase.generate],
        deadline=None,
        derandomize=not LONG,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases)
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    return out


async def _count(dsn: str, table: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await conn.close()


@pytest.mark.slow
async def test_drawn_turns_are_stored_whole_by_a_real_writer(
    nats_url: str, database_url: str, js: Any, fuzz_report: Callable[[str], None]
) -> None:
    events: list[ev.Event] = []
    refused = 0
    for case in draw_cases(TURNS):
        made, status = await run_case(case)
        refused += status is None
        # Each turn of its own: the memory journal makes new ids, so only the profile is shared.
        events += made
    events = [ev.ProfileUpserted(profile_id="demo", tags=("client:acme",)), *events]
    acks = await publish_all(nats_url, events)
    stop = asyncio.Event()
    writer = asyncio.create_task(
        serve(
            Settings(nats_url=nats_url, database_url=database_url, http_port=0),
            writer_projections(),
            writer_schemas(),
            "journal-writer",
            stop=stop,
        )
    )
    try:
        await wait_for_position(database_url, "journal-writer", acks[-1].seq, timeout_s=120)
        await wait_caught_up(js, database_url, "memory-writer", timeout_s=120)
    finally:
        stop.set()
        assert await asyncio.wait_for(writer, 30) == 0
    letters = await list_dead_letters(js)
    assert letters == [], letters[0].reason
    expected = {
        "sessions": sum(isinstance(e, ev.SessionCreated) for e in events),
        "turns": sum(isinstance(e, ev.TurnStarted) for e in events),
        "messages": sum(isinstance(e, ev.MessageAppended) for e in events),
        "tool_calls": sum(isinstance(e, ev.ToolCallRecorded) for e in events),
        "approvals": sum(isinstance(e, ev.ApprovalDecided) for e in events),
        "memory_changes_applied": sum(isinstance(e, ev.MemoryChanged) for e in events),
    }
    stored = {table: await _count(database_url, table) for table in expected}
    assert stored == expected
    fuzz_report(
        f"{TURNS} drawn turns ({refused} refused at the boundary), {len(events)} events: "
        f"stored {stored}, 0 dead letters"
    )
