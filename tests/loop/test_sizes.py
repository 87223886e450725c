"""Sizes on the memory adapters: a text too large for one message is refused before anything of its
turn is recorded, a tool result is cut to fit (saying so), a model's message too large fails its turn."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from commonos.loop.journal import MessageTooLarge, ToolCallRecord
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import ModelRequest, ModelResponse, build_provider
from commonos.loop.tools import (
    MAX_RESULT_CHARS,
    Tool,
    ToolContext,
    ToolFailed,
    ToolOutput,
    builtin_tools,
    fit_result,
)
from commonos.proto.events import (
    MessageAppended,
    ModelCallCompleted,
    Risk,
    ToolCallRecorded,
    TurnFinished,
    TurnStarted,
    TurnStatus,
)
from commonos.proto.identity import TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.messages import ToolResultMessage
from tests.loop.helpers import of_type, write_profile
from tests.loop.test_loop import ByCommand

LIMIT = 8192

TOOL_SCRIPT = """
[[conversations]]
[[conversations.steps]]
tool_calls = [{ name = "emit" }]
[[conversations.steps]]
text = "seen"
"""


class Emit:
    """A tool whose output the test sets."""

    name = "emit"
    description = "say what the test wants"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012
    risk = Risk.LOW

    def __init__(self, output: str = "") -> None:
        self.output = output

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        return ToolOutput(self.output)


class Recording:
    """The scripted provider, keeping every request it was sent."""

    name = "scripted"

    def __init__(self, profile: Profile) -> None:
        self.inner = build_provider(profile)
        self.seen: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.seen.append(request)
        return await self.inner.complete(request)

    async def close(self) -> None:
        return None


def sized_loop(profile: Profile, journal: MemoryJournal, tools: Mapping[str, Tool] | None = None) -> Loop:
    return Loop(
        journal,
        {profile.id: profile},
        {profile.id: Recording(profile)},
        locks=MemorySessionLocks(),
        approver=ByCommand(),
        tools=tools,
    )


def with_emit(root: Path, output: str) -> tuple[Profile, dict[str, Tool]]:
    profile = write_profile(root, "emit", script=TOOL_SCRIPT)
    profile = dataclasses.replace(profile, tools=(*profile.tools, "emit"))
    return profile, {**builtin_tools(), "emit": Emit(output)}


async def test_a_chat_text_too_large_is_refused_before_anything_is_recorded(profile: Profile) -> None:
    journal = MemoryJournal(max_message_bytes=LIMIT)
    loop = sized_loop(profile, journal)
    with pytest.raises(MessageTooLarge, match=r"^the chat text is \d+ bytes as an event .* limit of 8192 bytes"):
        await loop.run_turn(TurnRequest(profile_id="demo", text="é" * LIMIT))
    assert journal.events == []
    # a text that fits is taken, and the same session refuses the next one that does not
    first = await loop.run_turn(TurnRequest(profile_id="demo", text="hello"))
    assert first.status is TurnStatus.COMPLETED
    recorded = list(journal.events)
    quotes = '"' * (LIMIT // 2)  # JSON writes each as two bytes
    with pytest.raises(MessageTooLarge, match=r"^the chat text is"):
        await loop.run_turn(TurnRequest(profile_id="demo", text=quotes, session_id=first.session_id))
    assert journal.events == recorded
    # and the session is free for the next turn
    again = await loop.run_turn(TurnRequest(profile_id="demo", text="hello", session_id=first.session_id))
    assert again.status is TurnStatus.COMPLETED


async def test_a_model_message_too_large_fails_the_turn_and_its_end_is_recorded(profile: Profile) -> None:
    script = f'[[conversations]]\n[[conversations.steps]]\ntext = "{"y" * LIMIT}"\n'
    p = write_profile(profile.folder.parent, "big", script=script)
    journal = MemoryJournal(max_message_bytes=LIMIT)
    result = await sized_loop(p, journal).run_turn(TurnRequest(profile_id="big", text="talk"))
    assert result.status is TurnStatus.FAILED and result.text == ""
    assert result.error is not None and result.error.startswith("the assistant message is ")
    assert "over the limit of 8192 bytes" in result.error
    [finished] = of_type(journal.events, TurnFinished)
    assert (finished.status, finished.error) == (TurnStatus.FAILED, result.error)
    # the model call happened and is billed; its message is not recorded
    assert len(of_type(journal.events, ModelCallCompleted)) == 1
    assert [m.role for m in of_type(journal.events, MessageAppended)] == ["user"]


async def test_a_delegated_goal_too_large_is_refused_before_the_child_starts(profile: Profile) -> None:
    # A goal comes in a model's message that fitted, so it fits as the child's first message too,
    # unless the limit went down since (a server with a smaller max_payload): the child refuses it.
    journal = MemoryJournal(max_message_bytes=LIMIT)
    loop = sized_loop(profile, journal)
    parent = TurnInfo(profile_id="demo", session_id=new_id(), turn_id=new_id())
    ctx = ToolContext(turn=parent, profile=profile, journal=journal, search=loop.search, delegate=loop._run_child)
    with pytest.raises(ToolFailed, match=r"^not delegated: the goal is \d+ bytes .* limit of 8192 bytes"):
        await builtin_tools()["delegate"].run(ctx, {"goal": "g" * LIMIT})
    assert journal.events == []
    assert await builtin_tools()["delegate"].run(ctx, {"goal": "Find the answer"}) == ToolOutput("42")


@pytest.mark.parametrize(
    "output",
    [
        pytest.param("a" * (MAX_RESULT_CHARS + 5000), id="more characters than a model is shown"),
        pytest.param("\x01" * 4000, id="control characters, six bytes each in JSON"),
        pytest.param('"é€😀\n' * 900, id="quotes, multi-byte characters, line breaks"),
    ],
)
async def test_a_tool_result_is_cut_to_fit_saying_so(tmp_path: Path, output: str) -> None:
    profile, tools = with_emit(tmp_path / "profiles", output)
    journal = MemoryJournal(max_message_bytes=LIMIT)
    loop = sized_loop(profile, journal, tools)
    result = await loop.run_turn(TurnRequest(profile_id="emit", text="go"))
    assert (result.status, result.text) == (TurnStatus.COMPLETED, "seen")

    [call] = of_type(journal.events, ToolCallRecorded)
    full = len(output.encode())
    assert call.result_bytes == full
    assert call.result is not None
    shown, marker = call.result.rsplit("\n", 1)
    assert output.startswith(shown) and len(shown) < len(output) and len(shown) <= MAX_RESULT_CHARS
    assert marker == f"[truncated: showing {len(shown.encode())} of {full} bytes]"
    # the model saw the same text as was recorded, in a message that fits
    [message] = [m for m in of_type(journal.events, MessageAppended) if isinstance(m.content, ToolResultMessage)]
    assert message.content.content == call.result
    provider = loop.providers["emit"]
    assert isinstance(provider, Recording)
    assert provider.seen[1].messages[-1] == message.content
    turn = _turn_of(journal)
    assert journal.check_message(turn, message.content) <= LIMIT
    assert journal.tool_call_bytes(turn, _record_of(call, call.result)) <= LIMIT
    # and it is as much as fits: one more character would not
    if len(shown) < MAX_RESULT_CHARS:
        more = output[: len(shown) + 1]
        longer = ToolResultMessage(
            call_id=message.content.call_id,
            content=more + f"\n[truncated: showing {len(more.encode())} of {full} bytes]",
        )
        assert (
            journal.message_bytes(turn, longer) > LIMIT
            or journal.tool_call_bytes(turn, _record_of(call, longer.content)) > LIMIT
        )


async def test_a_tool_result_that_fits_is_kept_whole(tmp_path: Path) -> None:
    output = "é" * 1000
    profile, tools = with_emit(tmp_path / "profiles", output)
    journal = MemoryJournal(max_message_bytes=LIMIT)
    await sized_loop(profile, journal, tools).run_turn(TurnRequest(profile_id="emit", text="go"))
    [call] = of_type(journal.events, ToolCallRecorded)
    assert (call.result, call.result_bytes) == (output, None)


def test_fit_result_takes_the_longest_prefix_that_fits() -> None:
    def under(n: int) -> Any:
        return lambda text: len(text.encode()) <= n

    assert fit_result("short", under(100)) == ("short", None)
    text, full = fit_result("ab" * 100, under(60))
    assert (text, full) == (("ab" * 12)[:23] + "\n[truncated: showing 23 of 200 bytes]", 200)
    assert len(text.encode()) == 60
    text, full = fit_result("€" * 100, under(44))
    assert text == "€" * 2 + "\n[truncated: showing 6 of 300 bytes]" and full == 300
    # not even the marker fits: the marker alone
    assert fit_result("x" * 100, under(3)) == ("\n[truncated: showing 0 of 100 bytes]", 100)
    # the character cap applies even when the whole text would fit
    assert fit_result("x" * 50, under(1000), max_chars=10) == ("x" * 10 + "\n[truncated: showing 10 of 50 bytes]", 50)


def _turn_of(journal: MemoryJournal) -> TurnInfo:
    [started] = of_type(journal.events, TurnStarted)
    return TurnInfo(profile_id=started.profile_id, session_id=started.session_id, turn_id=started.turn_id)


def _record_of(call: ToolCallRecorded, result: str) -> ToolCallRecord:
    return ToolCallRecord(
        tool_call_id=call.tool_call_id,
        call_id=call.call_id,
        name=call.name,
        args=call.args,
        result=result,
        is_error=call.is_error,
        risk=call.risk,
        started_at=call.started_at,
        finished_at=call.finished_at,
        result_bytes=call.result_bytes,
    )
