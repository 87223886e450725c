"""Sizes on the memory adapters: a text too large for one message is refused before anything of its
turn is recorded, a model's message too large fails its turn."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from commonos.loop.journal import MessageTooLarge
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import ModelRequest, ModelResponse, build_provider
from commonos.loop.tools import Tool, ToolContext, ToolFailed, ToolOutput, builtin_tools
from commonos.proto.events import MessageAppended, ModelCallCompleted, TurnFinished, TurnStatus
from commonos.proto.identity import TurnInfo
from commonos.proto.ids import new_id
from tests.loop.helpers import of_type, write_profile
from tests.loop.test_loop import ByCommand

LIMIT = 8192


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
