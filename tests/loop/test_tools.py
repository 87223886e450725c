"""The tools themselves: confined to the workspace, bounded in time and size."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import Profile
from commonos.loop.search import MemoryMessageSearch, NoSearch
from commonos.loop.tools import MAX_RESULT_CHARS, ToolContext, ToolFailed, ToolOutput, builtin_tools
from commonos.proto.events import Risk
from commonos.proto.identity import NewSession, TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.messages import UserMessage


async def no_delegation(turn: TurnInfo, goal: str) -> str:
    raise AssertionError("not expected")


def context(profile: Profile, journal: MemoryJournal | None = None) -> ToolContext:
    journal = journal or MemoryJournal()
    turn = TurnInfo(profile_id=profile.id, session_id=new_id(), turn_id=new_id())
    return ToolContext(
        turn=turn, profile=profile, journal=journal, search=MemoryMessageSearch(journal), delegate=no_delegation
    )


async def run(profile: Profile, name: str, args: Mapping[str, Any], journal: MemoryJournal | None = None) -> ToolOutput:
    return await builtin_tools()[name].run(context(profile, journal), args)


def test_risks() -> None:
    risks = {name: tool.risk for name, tool in builtin_tools().items()}
    assert {n for n, r in risks.items() if r is Risk.HIGH} == {"shell", "write_file"}


async def test_files_stay_inside_the_workspace(profile: Profile) -> None:
    assert (await run(profile, "write_file", {"path": "a/b.txt", "content": "hé"})).content == (
        "wrote 3 bytes to a/b.txt"
    )
    assert (await run(profile, "read_file", {"path": "a/b.txt"})).content == "hé"
    assert (await run(profile, "list_dir", {})).content == "a/"
    for name, args in (("read_file", {"path": "../config.toml"}), ("write_file", {"path": "/etc/x", "content": ""})):
        with pytest.raises(ToolFailed, match="outside the workspace"):
            await run(profile, name, args)
    with pytest.raises(ToolFailed, match="missing argument 'path'"):
        await run(profile, "read_file", {})
    with pytest.raises(ToolFailed, match=r"cannot read nothing\.txt"):
        await run(profile, "read_file", {"path": "nothing.txt"})


async def test_shell_reports_exit_code_and_is_bounded_in_time(profile: Profile) -> None:
    ok = await run(profile, "shell", {"command": "pwd"})
    assert ok == ToolOutput(f"exit code 0\n{profile.workspace.resolve()}\n")
    failed = await run(profile, "shell", {"command": "echo oops >&2; exit 3"})
    assert failed == ToolOutput("exit code 3\noops\n", is_error=True)
    with pytest.raises(ToolFailed, match=r"timed out after 0\.2s"):
        await run(profile, "shell", {"command": "sleep 30", "timeout_s": 0.2})
    # the whole output: the loop cuts it to what a model is shown, saying how large it was
    long = await run(profile, "shell", {"command": f"head -c {MAX_RESULT_CHARS + 100} /dev/zero | tr '\\0' a"})
    assert long.content == "exit code 0\n" + "a" * (MAX_RESULT_CHARS + 100)


async def test_a_cancelled_shell_call_kills_its_command(profile: Profile, tmp_path: Path) -> None:
    fifo = tmp_path / "started"
    os.mkfifo(fifo)
    task = asyncio.create_task(run(profile, "shell", {"command": f"echo $$ > {fifo}; exec sleep 30"}))
    pid = int(await asyncio.to_thread(fifo.read_text))  # returns once the command runs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_session_search_finds_other_sessions_messages(profile: Profile) -> None:
    journal = MemoryJournal()
    session = await journal.create_session(NewSession(profile_id=profile.id, source="cli"))
    turn = TurnInfo(profile_id=profile.id, session_id=session, turn_id=new_id())
    await journal.append_message(turn, UserMessage(text="The umbrella is in the hall"))
    found = await run(profile, "session_search", {"query": "umbrella hall"}, journal)
    assert found.content == f"[session {session} #1 user] The umbrella is in the hall"
    assert (await run(profile, "session_search", {"query": "bicycle"}, journal)).content == "no matching messages"
    ctx = context(profile)
    ctx.search = NoSearch()
    with pytest.raises(ToolFailed, match="needs a database"):
        await builtin_tools()["session_search"].run(ctx, {"query": "x"})
