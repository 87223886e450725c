"""What the console asks of the loop services over NATS: the approvals waiting, and a decision.

The messages and subjects are the loop's contract, `commonos.proto.requests`; these are the console's own
requesters (as `commonos.loop.approvals`' `list_pending` and `send_decision` are the loop's and `cos approve`'s):

* `list_pending` asks `cos.approvals.pending` and gathers every loop service's `PendingApprovals`.
* `decide` sends an `ApprovalAnswer` on `cos.approvals.decide.<profile>.<approval_id>.<approver>` and returns the
  waiting loop's `ApprovalAck` (or a not-ok one saying why there is none).

Chat requests are sent by `commonos.console.pages.chat.run_turn`.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.proto.events import ApprovalStatus
from commonos.proto.requests import (
    APPROVALS_PENDING,
    ApprovalAck,
    ApprovalAnswer,
    ApprovalRequest,
    PendingApprovals,
    PendingQuery,
    approval_decide_subject,
)


async def list_pending(
    nc: Client, profile_ids: tuple[str, ...] | None = None, timeout_s: float = 2.0, settle_s: float = 0.15
) -> list[ApprovalRequest]:
    """The approvals waiting in every loop service (of `profile_ids`, or all), soonest to expire first: the
    first answer and whatever others come within `settle_s` of it (the loop's `list_pending`)."""
    answers: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_answer(msg: Msg) -> None:
        answers.put_nowait(msg)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_answer)
    found: dict[uuid.UUID, ApprovalRequest] = {}
    try:
        await nc.publish(APPROVALS_PENDING, msgspec.json.encode(PendingQuery(profile_ids=profile_ids)), reply=inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        first = True
        while (left := deadline - loop.time()) > 0:
            try:
                msg = await asyncio.wait_for(answers.get(), left if first else min(left, settle_s))
            except TimeoutError:
                break
            if msg.headers and msg.headers.get("Status") == "503":
                break
            first = False
            with contextlib.suppress(msgspec.DecodeError):
                for request in msgspec.json.decode(msg.data, type=PendingApprovals).approvals:
                    found[request.approval_id] = request
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    wanted = [r for r in found.values() if profile_ids is None or r.profile_id in profile_ids]
    return sorted(wanted, key=lambda r: (r.expires_at, str(r.approval_id)))


async def decide(
    nc: Client, profile_id: str, approval_id: uuid.UUID, status: ApprovalStatus, approver: str, timeout_s: float = 5.0
) -> ApprovalAck:
    """`cos approve` / `cos deny` (the loop's `send_decision`): the waiting loop's ack."""
    subject = approval_decide_subject(profile_id, approval_id, approver)
    answer = ApprovalAnswer(status=status, decided_by=approver)
    try:
        reply = await nc.request(subject, msgspec.json.encode(answer), timeout=timeout_s)
    except nats.errors.NoRespondersError:
        return ApprovalAck(ok=False, error=f"no approval {approval_id} is waiting (decided, timed out, or unknown)")
    except nats.errors.TimeoutError:
        return ApprovalAck(ok=False, error=f"no answer from the loop within {timeout_s:.0f}s")
    try:
        return msgspec.json.decode(reply.data, type=ApprovalAck)
    except msgspec.DecodeError as exc:
        return ApprovalAck(ok=False, error=f"the loop's answer was not understood: {exc}")
