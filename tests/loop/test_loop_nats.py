"""The loop on real NATS: events on the stream, approvals over NATS, one turn per session across
processes, and a NATS restart in the middle of a turn."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from commonos.loop.approvals import NatsApprover
from commonos.loop.locks import NatsSessionLocks, SessionBusy
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.loop.tools import Tool, ToolContext, ToolOutput, builtin_tools
from commonos.proto.events import (
    ApprovalDecided,
    ApprovalStatus,
    Event,
    MessageAppended,
    ModelCallCompleted,
    Risk,
    SessionCreated,
    ToolCallRecorded,
    TurnFinished,
    TurnStarted,
    TurnStatus,
)
from commonos.proto.requests import ApprovalRequest, approval_request_subject
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.embedded import NatsServer
from commonos.runtime.loop_requests import send_decision
from tests.harness import ExternalServer
from tests.loop.helpers import of_type, write_profile


def nats_loop(nc: Client, profile: Profile, *, tools: Mapping[str, Tool] | None = None, owner: str = "test") -> Loop:
    js = nc.jetstream()
    return Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
        tools=tools,
        owner=owner,
    )


async def stream_events(js: JetStreamContext) -> list[Event]:
    return await NatsJournal(js).events([EVENTS_ALL])


def assert_stored_once(events: list[Event]) -> None:
    """No event twice, and every session's messages numbered 1..n, each once."""
    assert len({e.event_id for e in events}) == len(events)
    by_session: dict[Any, list[int]] = {}
    for m in of_type(events, MessageAppended):
        by_session.setdefault(m.session_id, []).append(m.seq)
    for seqs in by_session.values():
        assert seqs == list(range(1, len(seqs) + 1))


@pytest.fixture
async def second_nc(nats_url: str) -> AsyncIterator[Client]:
    """Another connection: what a second loop process would have."""
    client = await nats.connect(nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    yield client
    await client.close()


async def test_a_turn_on_nats_records_every_step_on_the_stream(
    nc: Client, streams: JetStreamContext, profile: Profile
) -> None:
    async def approve_only_the_first(msg: Msg) -> None:
        request = msgspec.json.decode(msg.data, type=ApprovalRequest)
        if request.args.get("command") == "echo approved":
            ack = await send_decision(nc, request.profile_id, request.approval_id, ApprovalStatus.APPROVED, "cli:ann")
            assert ack.ok

    sub = await nc.subscribe(approval_request_subject("demo"), cb=approve_only_the_first)
    try:
        result = await nats_loop(nc, profile).run_turn(
            TurnRequest(profile_id="demo", text="plan it", tags=("client:acme",))
        )
    finally:
        await sub.unsubscribe()
    assert (result.status, result.text) == (TurnStatus.COMPLETED, "Done: 42.")

    events = await stream_events(streams)
    assert_stored_once(events)
    parent, child = of_type(events, SessionCreated)
    assert child.parent_session_id == parent.session_id and child.title == "Find the answer"
    parent_turn, child_turn = of_type(events, TurnStarted)
    assert child_turn.depth == 1 and child_turn.parent_turn_id == parent_turn.turn_id
    assert child_turn.tags == parent_turn.tags == ("area:work", "client:acme", "team:core")
    decisions = sorted((d.status, d.decided_by) for d in of_type(events, ApprovalDecided))
    assert decisions == [("approved", "cli:ann"), ("denied", "policy"), ("timed_out", "timeout")]
    tools = [(t.name, t.approval, t.is_error) for t in of_type(events, ToolCallRecorded)]
    assert tools == [
        ("list_dir", None, False),
        ("shell", ApprovalStatus.APPROVED, False),
        ("write_file", ApprovalStatus.DENIED, True),
        ("shell", ApprovalStatus.TIMED_OUT, True),
        ("delegate", None, False),
    ]
    assert {c.tags for c in of_type(events, ModelCallCompleted)} == {parent_turn.tags}
    assert [f.status for f in of_type(events, TurnFinished)] == [TurnStatus.COMPLETED, TurnStatus.COMPLETED]
    # every event of a session is on its own subject: the history reads back from the stream
    history = await NatsJournal(streams).load_history(parent.session_id)
    assert len(history) == 12 and history[-1] == of_type(events, MessageAppended)[-1].content


async def test_one_turn_per_session_across_processes(
    nc: Client, second_nc: Client, streams: JetStreamContext, tmp_path: Any
) -> None:
    profile = write_profile(tmp_path / "profiles", timeout_s=30)
    first, second = nats_loop(nc, profile, owner="process-a"), nats_loop(second_nc, profile, owner="process-b")
    waiting: asyncio.Future[ApprovalRequest] = asyncio.get_running_loop().create_future()

    async def on_request(msg: Msg) -> None:
        if not waiting.done():
            waiting.set_result(msgspec.json.decode(msg.data, type=ApprovalRequest))

    sub = await nc.subscribe(approval_request_subject("demo"), cb=on_request)
    running = asyncio.create_task(first.run_turn(TurnRequest(profile_id="demo", text="wait for me")))
    request = await asyncio.wait_for(waiting, 10)
    await sub.unsubscribe()

    with pytest.raises(SessionBusy) as busy:
        await second.run_turn(TurnRequest(profile_id="demo", text="me too", session_id=request.session_id))
    assert busy.value.holder == "process-a"

    assert (
        await send_decision(second_nc, request.profile_id, request.approval_id, ApprovalStatus.APPROVED, "cli:ann")
    ).ok
    done = await running
    assert (done.status, done.text) == (TurnStatus.COMPLETED, "waited")

    # once free, the other process continues the session where the first left it
    again = await second.run_turn(TurnRequest(profile_id="demo", text="and now?", session_id=request.session_id))
    assert again.status is TurnStatus.COMPLETED
    events = await stream_events(streams)
    assert_stored_once(events)
    assert [m.seq for m in of_type(events, MessageAppended)] == [1, 2, 3, 4, 5, 6]
    assert [s.turn_id for s in of_type(events, TurnStarted)] == [done.turn_id, again.turn_id]


class RestartNats:
    """A tool that kills the NATS server and starts it again, in the middle of a turn."""

    name = "restart_nats"
    description = "kill and restart NATS"
    parameters: dict[str, Any] = {"type": "object", "properties": {}}  # noqa: RUF012
    risk = Risk.LOW

    def __init__(self, server: NatsServer | ExternalServer) -> None:
        self.server = server

    async def run(self, ctx: ToolContext, args: Mapping[str, Any]) -> ToolOutput:
        def restart() -> None:
            self.server.kill()
            self.server.start()

        await asyncio.to_thread(restart)
        return ToolOutput("restarted")


RESTART_SCRIPT = """
[[conversations]]
[[conversations.steps]]
text = "restarting"
tool_calls = [{ name = "restart_nats" }]
[[conversations.steps]]
tool_calls = [{ name = "list_dir" }]
[[conversations.steps]]
text = "still here"
"""


async def test_a_nats_restart_during_a_turn_loses_and_duplicates_nothing(
    nc: Client, streams: JetStreamContext, nats_server: NatsServer | ExternalServer, tmp_path: Any
) -> None:
    profile = write_profile(tmp_path / "profiles", script=RESTART_SCRIPT)
    profile = dataclasses.replace(profile, tools=(*profile.tools, "restart_nats"))
    tools: dict[str, Tool] = {**builtin_tools(), "restart_nats": RestartNats(nats_server)}
    result = await nats_loop(nc, profile, tools=tools).run_turn(TurnRequest(profile_id="demo", text="go"))
    assert (result.status, result.text) == (TurnStatus.COMPLETED, "still here")
    events = await stream_events(streams)
    assert_stored_once(events)
    kinds = Counter(type(e).__name__ for e in events)
    assert kinds == {
        "SessionCreated": 1,
        "TurnStarted": 1,
        "MessageAppended": 6,
        "ModelCallCompleted": 3,
        "ToolCallRecorded": 2,
        "TurnFinished": 1,
    }


async def test_a_nats_kill_at_any_moment_completes_or_fails_clearly(
    nc: Client, streams: JetStreamContext, nats_server: NatsServer | ExternalServer, tmp_path: Any
) -> None:
    steps = "".join('[[conversations.steps]]\ntool_calls = [{ name = "list_dir" }]\n' for _ in range(40))
    script = f'[[conversations]]\n{steps}[[conversations.steps]]\ntext = "finished"\n'
    profile = write_profile(tmp_path / "profiles", script=script)
    profile = dataclasses.replace(profile, max_steps=50)
    restarted = asyncio.Event()
    seen = 0

    async def kill_after_some_calls(msg: Msg) -> None:
        nonlocal seen
        seen += 1
        if seen == 7:
            # Not awaited here: the loop goes on publishing while the server dies.
            asyncio.get_running_loop().run_in_executor(None, restart)

    def restart() -> None:
        nats_server.kill()
        nats_server.start()
        loop.call_soon_threadsafe(restarted.set)

    loop = asyncio.get_running_loop()
    sub = await nc.subscribe("cos.events.demo.*.tool_call_recorded", cb=kill_after_some_calls)
    result = await nats_loop(nc, profile).run_turn(TurnRequest(profile_id="demo", text="go"))
    await asyncio.wait_for(restarted.wait(), 30)
    await sub.unsubscribe()
    events = await stream_events(streams)
    assert_stored_once(events)
    finished = of_type(events, TurnFinished)
    if result.status is TurnStatus.COMPLETED:
        assert result.text == "finished"
        assert len(of_type(events, ToolCallRecorded)) == 40
    else:
        assert result.status is TurnStatus.FAILED and result.error and "could not record" in result.error
    assert [f.status for f in finished] == [result.status]
