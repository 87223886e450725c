"""deploy/nats/auth.conf on a real nats-server, the loop service running as `loop` and the console as `console`:
the console asks for a turn (with `started`: two replies reach it), reads its deltas, events and approval request,
lists the approvals waiting and decides one as web:<name>, without a permission violation on either side."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from commonos.console.pages.chat import run_turn
from commonos.loop.approvals import NatsApprover
from commonos.loop.deltas import DeltaPublisher
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.proto.events import ApprovalStatus
from commonos.proto.requests import ChatRequest
from commonos.runtime.loop_requests import list_pending, send_decision
from commonos.runtime.nats import ensure_streams
from tests.deploy.conftest import SecuredNats
from tests.loop.helpers import write_profile

SCRIPT = """
[[conversations]]

[[conversations.steps]]
tool_calls = [{ name = "shell", args = { command = "echo approved" } }]

[[conversations.steps]]
text = "approved and done"
"""

CONFIG = """
provider = "scripted"
model = "scripted-test"
system_prompt = "Be brief."

[provider_options]
script = "script.toml"

[approval]
timeout_s = 30
tools = { shell = "ask" }
"""


async def test_the_console_chats_and_decides_through_the_loop(secured_nats: SecuredNats, tmp_path: Path) -> None:
    admin = await secured_nats.connect("admin")
    await ensure_streams(admin.jetstream())
    loop_nc = await secured_nats.connect("loop")
    js = loop_nc.jetstream()
    profile = write_profile(tmp_path / "profiles", "acme", config=CONFIG, script=SCRIPT)
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(loop_nc),
        deltas=DeltaPublisher(loop_nc).for_turn,
    )
    service = LoopService(loop_nc, loop, handle_signals=False, grace_s=0.1)
    await service.start()
    serving = asyncio.create_task(service.serve())
    try:
        console = await secured_nats.connect("console")
        seen: list[dict[str, Any]] = []

        async def emit(message: dict[str, Any]) -> None:
            seen.append(message)

        turn = asyncio.create_task(
            run_turn(console, "acme", ChatRequest(text="go", tags=("client:acme",), source="web"), emit, 30)
        )
        waiting = []
        for _ in range(200):
            waiting = await list_pending(console, ("acme",))
            if waiting:
                break
            await asyncio.sleep(0.05)
        [approval] = waiting
        ack = await send_decision(console, "acme", approval.approval_id, ApprovalStatus.APPROVED, "web:abel")
        assert ack.ok, ack.error
        result = await asyncio.wait_for(turn, 30)
        assert (result.status, result.text) == ("completed", "approved and done")
        kinds = [m["type"] for m in seen]
        assert kinds[0] == "started" and {"delta", "approval", "approval_decided", "tool_call"} <= set(kinds)
        decided = next(m for m in seen if m["type"] == "approval_decided")
        assert decided["decided_by"] == "web:abel"
        assert secured_nats.violations("console") == [] and secured_nats.violations("loop") == []
        # The console publishes no event and may not ask the loop to delete a profile.
        await console.publish("cos.cmd.acme.delete.web:abel", b"{}")
        await console.flush()
        await secured_nats.refused("console", "cos.cmd.acme.delete")
    finally:
        service.stop_event.set()
        await serving
        await service.shutdown()
