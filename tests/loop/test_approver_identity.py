"""Who decided an approval is who NATS let answer, never what the answer says.

The answer's subject is `cos.approvals.decide.<profile>.<approval id>.<approver>`: the loop records the
last token as `decided_by` and refuses `policy` and `timeout`, which only the loop itself writes. NATS
permissions can therefore allow an approver to answer for some profiles only, and only as itself.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client

from commonos.loop.approvals import NatsApprover, new_request
from commonos.proto.events import ApprovalStatus, Risk
from commonos.proto.requests import ApprovalAck, ApprovalAnswer, ApprovalRequest
from commonos.runtime.embedded import NatsServer
from commonos.runtime.loop_requests import send_decision
from commonos.runtime.nats import inbox_prefix


def _request(profile: str) -> ApprovalRequest:
    return new_request(
        approval_id=uuid.uuid4(),
        profile_id=profile,
        session_id=uuid.uuid4(),
        turn_id=uuid.uuid4(),
        call_id="c1",
        tool="shell",
        args={"command": "ls"},
        risk=Risk.HIGH,
        timeout_s=10,
    )


async def _waiting(nc: Client, profile: str) -> tuple[ApprovalRequest, asyncio.Task[ApprovalAnswer]]:
    request = _request(profile)
    asking = asyncio.create_task(NatsApprover(nc).ask(request, 10))
    await asyncio.sleep(0.2)  # the loop subscribes before it publishes the request
    return request, asking


async def test_the_answer_cannot_claim_to_be_the_policy_or_the_timeout(nc: Client) -> None:
    request, asking = await _waiting(nc, "acme")
    for reserved in ("policy", "timeout"):
        ack = await send_decision(nc, "acme", request.approval_id, ApprovalStatus.APPROVED, reserved)
        assert not ack.ok and "reserved" in (ack.error or "")
    ack = await send_decision(nc, "acme", request.approval_id, ApprovalStatus.APPROVED, "cli:ann")
    assert ack.ok
    answer = await asking
    assert (answer.status, answer.decided_by) == (ApprovalStatus.APPROVED, "cli:ann")


async def test_a_body_naming_someone_else_does_not_change_who_decided(nc: Client) -> None:
    request, asking = await _waiting(nc, "acme")
    subject = f"cos.approvals.decide.acme.{request.approval_id}.cli:ann"
    reply = await nc.request(subject, b'{"status": "approved", "decided_by": "policy"}', timeout=5)
    assert msgspec.json.decode(reply.data, type=ApprovalAck) == ApprovalAck(ok=True)
    assert (await asking).decided_by == "cli:ann"


def test_an_approver_name_that_is_not_one_subject_token_is_refused_before_sending() -> None:
    for bad in ("", "a.b", "a b", "*", ">", "ann\x00"):
        with pytest.raises(ValueError, match="approver"):
            asyncio.run(send_decision(None, "acme", uuid.uuid4(), ApprovalStatus.APPROVED, bad))  # type: ignore[arg-type]


async def test_nats_permissions_scope_an_approver_to_its_profiles(tmp_path: Path) -> None:
    config = tmp_path / "auth.conf"
    config.write_text(
        """authorization { users: [
  { user: loop, password: l }
  { user: ann, password: a, permissions: {
      publish: { allow: ["cos.approvals.decide.acme.*.ann"] }
      subscribe: { allow: ["_INBOX_ann.>"] } } }
] }
"""
    )
    server = NatsServer(tmp_path / "nats", config_file=config).start()
    try:
        loop = await nats.connect(server.url, user="loop", password="l")
        ann = await nats.connect(server.url, user="ann", password="a", inbox_prefix=inbox_prefix("ann"))
        try:
            request, asking = await _waiting(loop, "acme")
            ack = await send_decision(ann, "acme", request.approval_id, ApprovalStatus.DENIED, "ann")
            assert ack.ok and (await asking).decided_by == "ann"
            other, other_asking = await _waiting(loop, "globex")
            for profile, approver in (("globex", "ann"), ("acme", "bob"), ("acme", "policy")):
                refused = await send_decision(
                    ann,
                    profile,
                    other.approval_id,
                    ApprovalStatus.APPROVED,
                    approver,
                    timeout_s=0.5,
                )
                assert not refused.ok
            other_asking.cancel()
        finally:
            await ann.close()
            await loop.close()
    finally:
        server.kill()
