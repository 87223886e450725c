"""A decision's ack that is not an `ApprovalAck` is a not-ok ack saying so, for `cos approve` as for the console.

Both send decisions through one client of the loop's request subjects; an answer on the decide subject that
cannot be decoded (another program answering there, a loop of another version) used to raise out of
`cos approve` while the console's copy of the same request turned it into a refusal.
"""

from __future__ import annotations

import uuid

from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.proto.events import ApprovalStatus
from commonos.proto.requests import approval_decide_subject
from commonos.runtime.loop_requests import send_decision


async def test_an_undecodable_ack_is_a_refusal_saying_so(nc: Client) -> None:
    approval_id = uuid.uuid4()

    async def answer_garbage(msg: Msg) -> None:
        await msg.respond(b"not json")

    sub = await nc.subscribe(approval_decide_subject("acme", approval_id, "cli:ann"), cb=answer_garbage)
    await nc.flush()
    try:
        ack = await send_decision(nc, "acme", approval_id, ApprovalStatus.APPROVED, "cli:ann", timeout_s=5)
    finally:
        await sub.unsubscribe()
    assert not ack.ok
    assert "not understood" in (ack.error or "")
