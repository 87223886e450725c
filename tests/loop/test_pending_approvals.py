"""Pending approvals asked of the loop services (`cos.approvals.pending`), and a chat request's `started` reply."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from commonos.loop.approvals import NatsApprover
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.proto.events import ApprovalStatus
from commonos.proto.requests import ApprovalRequest, ChatReply, ChatRequest, chat_subject
from commonos.runtime.loop_requests import ask_loops, list_pending, send_decision
from commonos.runtime.nats import ensure_streams
from tests.loop.helpers import write_profile


@pytest.fixture
async def services(nc: Client, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[list[LoopService]]:
    """Two loop services of profile demo (as two replicas), each with its own approver."""
    await ensure_streams(js)
    profile = write_profile(tmp_path / "profiles", timeout_s=60)
    out: list[LoopService] = []
    tasks = []
    for _ in range(2):
        loop = Loop(
            NatsJournal(js),
            {profile.id: profile},
            {profile.id: build_provider(profile)},
            locks=NatsSessionLocks(js),
            approver=NatsApprover(nc),
        )
        svc = LoopService(nc, loop, handle_signals=False, grace_s=0.1)
        await svc.start()
        tasks.append(asyncio.create_task(svc.serve()))
        out.append(svc)
    yield out
    for svc in out:
        svc.stop_event.set()
    await asyncio.gather(*tasks)
    for svc in out:
        await svc.shutdown()


async def test_no_loop_service_means_none_pending_at_once(nc: Client) -> None:
    started = time.monotonic()
    assert await list_pending(nc, timeout_s=5) == []
    assert time.monotonic() - started < 2


async def test_the_loop_services_say_which_profiles_they_serve(nc: Client, services: list[LoopService]) -> None:
    """What the console's Chat page offers: the profiles a loop answers for (none when no loop runs)."""
    answers = await ask_loops(nc, ())
    assert (answers.served, answers.approvals) == (("demo",), [])
    for svc in services:
        svc.stop_event.set()
        await svc.shutdown()
    assert (await ask_loops(nc)).served == ()


async def chat_with_started(nc: Client, request: ChatRequest) -> tuple[asyncio.Queue[ChatReply], object]:
    replies: asyncio.Queue[ChatReply] = asyncio.Queue()

    async def on_reply(msg: Msg) -> None:
        replies.put_nowait(msgspec.json.decode(msg.data, type=ChatReply))

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_reply)
    await nc.publish(chat_subject("demo"), msgspec.json.encode(request), reply=inbox)
    return replies, sub


async def test_waiting_approvals_are_listed_until_decided(nc: Client, services: list[LoopService]) -> None:
    # Two turns, one per service (queue group), both waiting for an approval of `shell`.
    first, _ = await chat_with_started(nc, ChatRequest(text="wait", started=True, source="web", tags=("client:x",)))
    second, _ = await chat_with_started(nc, ChatRequest(text="wait", started=True))
    a = await asyncio.wait_for(first.get(), 10)
    b = await asyncio.wait_for(second.get(), 10)
    assert a.status == b.status == "started" and a.session_id and a.turn_id and a.session_id != b.session_id
    pending: list[ApprovalRequest] = []
    for _ in range(100):
        pending = await list_pending(nc)
        if len(pending) == 2:
            break
        await asyncio.sleep(0.05)
    assert {(p.session_id, p.turn_id, p.tool) for p in pending} == {
        (a.session_id, a.turn_id, "shell"),
        (b.session_id, b.turn_id, "shell"),
    }
    assert await list_pending(nc, ("other",)) == []
    assert len(await list_pending(nc, ("demo",))) == 2
    mine = next(p for p in pending if p.session_id == a.session_id)
    ack = await send_decision(nc, "demo", mine.approval_id, ApprovalStatus.APPROVED, "web:abel")
    assert ack.ok
    done = await asyncio.wait_for(first.get(), 10)
    assert (done.status, done.text, done.session_id, done.turn_id) == ("completed", "waited", a.session_id, a.turn_id)
    assert [p.session_id for p in await list_pending(nc)] == [b.session_id]
    other = next(p for p in pending if p.session_id == b.session_id)
    assert (await send_decision(nc, "demo", other.approval_id, ApprovalStatus.DENIED, "web:abel")).ok
    assert (await asyncio.wait_for(second.get(), 10)).status == "completed"
    assert await list_pending(nc) == []


async def test_without_started_one_reply_as_before(nc: Client, services: list[LoopService]) -> None:
    replies, _ = await chat_with_started(nc, ChatRequest(text="hello"))
    reply = await asyncio.wait_for(replies.get(), 10)
    assert (reply.status, reply.text) == ("completed", "hello")
    await asyncio.sleep(0.2)
    assert replies.empty()
    refused, _ = await chat_with_started(nc, ChatRequest(text="x", tags=("Bad:tag",), started=True))
    bad = await asyncio.wait_for(refused.get(), 10)
    assert bad.status == "rejected" and "upper case in the key" in (bad.error or "")
