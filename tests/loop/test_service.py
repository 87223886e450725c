"""The loop service: chat over NATS, typed refusals, graceful stop; the process and its CLI."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from commonos.loop.approvals import NatsApprover, new_request
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.proto.events import ApprovalStatus, ProfileUpserted, Risk, TurnFinished, TurnStatus
from commonos.proto.ids import new_id
from commonos.proto.requests import ApprovalRequest, ChatReply, ChatRequest, approval_request_subject, chat_subject
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.embedded import free_port
from commonos.runtime.loop_requests import send_decision
from commonos.runtime.nats import ensure_streams
from tests.loop.helpers import of_type, write_profile


async def chat(nc: Client, request: ChatRequest | bytes, profile: str = "demo") -> ChatReply:
    data = request if isinstance(request, bytes) else msgspec.json.encode(request)
    msg = await nc.request(chat_subject(profile), data, timeout=20)
    return msgspec.json.decode(msg.data, type=ChatReply)


async def first_approval_request(nc: Client, profile: str = "demo") -> asyncio.Future[ApprovalRequest]:
    future: asyncio.Future[ApprovalRequest] = asyncio.get_running_loop().create_future()

    async def on_request(msg: Msg) -> None:
        if not future.done():
            future.set_result(msgspec.json.decode(msg.data, type=ApprovalRequest))
            await sub.unsubscribe()

    sub = await nc.subscribe(approval_request_subject(profile), cb=on_request)
    return future


@pytest.fixture
async def slow_profile(tmp_path: Path) -> Profile:
    return write_profile(tmp_path / "profiles", timeout_s=60)


@pytest.fixture
async def service(nc: Client, js: JetStreamContext, slow_profile: Profile) -> AsyncIterator[LoopService]:
    await ensure_streams(js)
    loop = Loop(
        NatsJournal(js),
        {slow_profile.id: slow_profile},
        {slow_profile.id: build_provider(slow_profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
    )
    svc = LoopService(nc, loop, handle_signals=False, grace_s=0.1)
    await svc.start()
    serving = asyncio.create_task(svc.serve())
    yield svc
    svc.stop_event.set()
    await serving
    await svc.shutdown()


async def test_chat_requests_and_refusals(nc: Client, js: JetStreamContext, service: LoopService) -> None:
    first = await chat(nc, ChatRequest(text="hello", tags=("client:acme",)))
    assert (first.status, first.text, first.error) == ("completed", "hello", None)
    again = await chat(nc, ChatRequest(text="hello again", session_id=first.session_id))
    assert again.status == "completed" and again.session_id == first.session_id

    waiting = await first_approval_request(nc)
    running = asyncio.create_task(chat(nc, ChatRequest(text="wait")))
    request = await asyncio.wait_for(waiting, 10)
    busy = await chat(nc, ChatRequest(text="me too", session_id=request.session_id))
    assert busy.status == "busy" and busy.session_id == request.session_id and "busy" in (busy.error or "")
    assert (await send_decision(nc, request.profile_id, request.approval_id, ApprovalStatus.APPROVED, "cli:ann")).ok
    assert (await running).text == "waited"

    bad = await chat(nc, b"{not json")
    assert bad.status == "rejected" and bad.error is not None and bad.error.startswith("bad chat request")
    missing = await chat(nc, ChatRequest(text="x", session_id=new_id()))
    assert missing.status == "rejected" and "not found" in (missing.error or "")
    bad_tag = await chat(nc, ChatRequest(text="x", tags=("Bad:tag",)))
    assert bad_tag.status == "rejected" and "upper case in the key" in (bad_tag.error or "")
    events = await NatsJournal(js).events([EVENTS_ALL])
    [profile] = of_type(events, ProfileUpserted)
    assert profile.profile_id == "demo" and profile.tags == ("team:core", "area:work")


async def test_stopping_interrupts_a_running_turn_and_tells_its_requester(
    nc: Client, js: JetStreamContext, service: LoopService
) -> None:
    waiting = await first_approval_request(nc)
    running = asyncio.create_task(chat(nc, ChatRequest(text="wait")))
    request = await asyncio.wait_for(waiting, 10)
    service.stop_event.set()
    await service.shutdown()
    reply = await running
    assert (reply.status, reply.turn_id, reply.session_id) == ("interrupted", request.turn_id, request.session_id)
    [finished] = of_type(await NatsJournal(js).events([EVENTS_ALL]), TurnFinished)
    assert (finished.turn_id, finished.status) == (request.turn_id, TurnStatus.INTERRUPTED)
    assert finished.error == "the service stopped during the turn"


async def run_cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "commonos.loop",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cos_approve_and_deny(nc: Client, nats_url: str) -> None:
    env = {"COS_NATS_URL": nats_url}
    approver = NatsApprover(nc)
    for command, status in (("approve", ApprovalStatus.APPROVED), ("deny", ApprovalStatus.DENIED)):
        request = new_request(
            approval_id=new_id(),
            profile_id="demo",
            session_id=new_id(),
            turn_id=new_id(),
            call_id="c1",
            tool="shell",
            args={"command": "ls"},
            risk=Risk.HIGH,
            timeout_s=30,
        )
        asked = asyncio.create_task(approver.ask(request, 30))
        code, out, err = await run_cli(
            command, "--profile", "demo", str(request.approval_id), "--by", "cli:ann", env=env
        )
        assert (code, out, err) == (0, f"{status.value} {request.approval_id}\n", "")
        answer = await asked
        assert (answer.status, answer.decided_by) == (status, "cli:ann")
    code, _, err = await run_cli("approve", str(new_id()), env=env)
    assert code == 2 and "is waiting (decided, timed out, or unknown)" in err
    code, _, err = await run_cli("approve", "not-a-uuid", env=env)
    assert code == 2 and "'not-a-uuid' is not a UUID" in err
    code, _, err = await run_cli("approve", str(new_id()), "--by", "a name", env=env)
    assert code == 2 and "error: --by: approver 'a name' is not a name" in err.splitlines()[0], err


async def test_cos_chat_talks_to_the_service_and_runs_here_without_one(
    nats_url: str, service: LoopService, slow_profile: Profile
) -> None:
    env = {"COS_NATS_URL": nats_url, "COS_PROFILES_DIR": str(slow_profile.folder.parent)}
    code, out, err = await run_cli("chat", "--profile", "demo", "--tag", "client:acme", "hello", env=env)
    assert (code, out) == (0, "hello\n") and err.startswith("[session ")
    code, out, err = await run_cli("chat", "--profile", "demo", "-v", "--yes", "make a plan", env=env)
    assert (code, out) == (0, "Done: 42.\n")
    assert re.search(r'\[approved by cli:\S+: shell \{"command":"echo approved"\}; running it\]', err), err
    assert '[write_file {"path":"x.txt","content":"x"} → not run: denied by policy]' in err
    assert "[delegate" in err and "→ 42]" in err
    service.stop_event.set()
    await service.shutdown()
    code, out, err = await run_cli("chat", "--profile", "demo", "hello", env=env)
    assert (code, out) == (0, "hello\n") and "running the turn here" in err
    code, _, err = await run_cli("chat", "--profile", "demo", "--tag", "Bad:x", "hello", env=env)
    assert code == 2 and "upper case in the key" in err


@pytest.fixture
async def quick_service(nc: Client, js: JetStreamContext, tmp_path: Path) -> AsyncIterator[LoopService]:
    """The service of profile demo whose approvals wait 4 s."""
    await ensure_streams(js)
    profile = write_profile(tmp_path / "quick", timeout_s=4)
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
    )
    svc = LoopService(nc, loop, handle_signals=False, grace_s=0.1)
    await svc.start()
    serving = asyncio.create_task(svc.serve())
    yield svc
    svc.stop_event.set()
    await serving
    await svc.shutdown()


async def test_cos_chat_says_which_call_waits_where_to_decide_and_how_it_ended(
    nc: Client, nats_url: str, quick_service: LoopService
) -> None:
    """While the turn waits, `cos chat` says so at once (the tool, the commands, the console, the deadline), then
    how each wait ended: approved by whom, or expired and not run."""
    asked: asyncio.Queue[ApprovalRequest] = asyncio.Queue()

    async def on_request(msg: Msg) -> None:
        asked.put_nowait(msgspec.json.decode(msg.data, type=ApprovalRequest))

    await nc.subscribe(approval_request_subject("demo"), cb=on_request)
    env = {"COS_NATS_URL": nats_url, "COS_CONSOLE_ORIGINS": "https://console.example.com"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "commonos.loop",
        "chat",
        "--profile",
        "demo",
        "make a plan",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    said: list[str] = []

    async def line(timeout_s: float) -> str:
        got = (await asyncio.wait_for(stderr.readline(), timeout_s)).decode()
        assert got, f"cos chat ended early: {said}"
        said.append(got.rstrip("\n"))
        return said[-1]

    async def said_next(start: str) -> list[str]:
        """The line `cos chat` prints on stderr starting with `start` (and the four after a wait's first)."""
        while not (await line(30)).startswith(start):
            pass
        if start.startswith("[waiting"):
            for _ in range(4):
                await line(5)
            return said[-5:]
        return said[-1:]

    try:
        first = await asyncio.wait_for(asked.get(), 30)
        which = f"--profile demo {first.approval_id}"
        waiting = await said_next("[waiting for approval: ")
        assert waiting[:4] == [
            '[waiting for approval: shell {"command":"echo approved"}]',
            f"  approve: cos approve {which}",
            f"  deny:    cos deny {which}",
            "  or on the console: https://console.example.com/approvals",
        ], said
        deadline = rf"  unanswered by {first.expires_at:%H:%M:%S} UTC \(in [34] s\), it is denied and not run"
        assert re.fullmatch(deadline, waiting[4]), said
        assert proc.returncode is None  # said while the call waits, not after
        ack = await send_decision(nc, "demo", first.approval_id, ApprovalStatus.APPROVED, "cli:ann")
        assert ack.ok
        assert await said_next("[approved") == ['[approved by cli:ann: shell {"command":"echo approved"}; running it]']

        second = await asyncio.wait_for(asked.get(), 30)
        waiting = await said_next("[waiting for approval: ")
        assert waiting[0] == '[waiting for approval: shell {"command":"echo unanswered"}]'
        assert waiting[4].startswith(f"  unanswered by {second.expires_at:%H:%M:%S} UTC")
        assert proc.returncode is None
        expired = await said_next("[approval expired")
        assert re.fullmatch(
            r'\[approval expired at \d\d:\d\d:\d\d UTC: nobody decided on shell \{"command":"echo unanswered"\} '
            r"in time; it was not run\]",
            expired[0],
        ), expired
        out, rest = await asyncio.wait_for(proc.communicate(), 30)
        code = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert (code, out.decode()) == (0, "Done: 42.\n"), said + rest.decode().splitlines()


async def test_the_service_process_serves_http_and_stops_gracefully(
    nc: Client, js: JetStreamContext, nats_url: str, slow_profile: Profile
) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "commonos.loop",
        "serve",
        env={
            **os.environ,
            "COS_NATS_URL": nats_url,
            "COS_PROFILES_DIR": str(slow_profile.folder.parent),
            "COS_HTTP_PORT": str(port),
            "COS_DRAIN_TIMEOUT_S": "1",
        },
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            while b"loop serving profiles demo" not in await proc.stderr.readline():
                assert proc.returncode is None
        async with aiohttp.ClientSession() as http:
            for path, expected in (("/healthz", 200), ("/readyz", 200), ("/metrics", 200)):
                async with http.get(f"http://127.0.0.1:{port}{path}") as resp:
                    assert resp.status == expected, path
                    if path == "/metrics":
                        assert "cos_loop_turns_total" in await resp.text()
        waiting = await first_approval_request(nc)
        running = asyncio.create_task(chat(nc, ChatRequest(text="wait")))
        request = await asyncio.wait_for(waiting, 10)
        proc.send_signal(signal.SIGTERM)
        reply = await running
        assert (reply.status, reply.turn_id) == ("interrupted", request.turn_id)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    [finished] = of_type(await NatsJournal(js).events([EVENTS_ALL]), TurnFinished)
    assert finished.status is TurnStatus.INTERRUPTED


async def test_a_bad_profile_stops_the_service_with_one_line(tmp_path: Path, nats_url: str) -> None:
    config = tmp_path / "demo" / "config.toml"
    config.parent.mkdir()
    config.write_text('tags = ["Area:x"]\n')
    code, _, err = await run_cli("serve", env={"COS_NATS_URL": nats_url, "COS_PROFILES_DIR": str(tmp_path)})
    assert code == 2
    assert err.startswith(f"error: {config}: tags: invalid tag 'Area:x': upper case in the key")
    assert err.count("\n") == 1
