"""The one client of the loop services' request subjects: the approvals waiting, and a decision on one.

The messages and subjects are the loop's contract (`commonos.proto.requests`); the loop answers them
(`commonos.loop.approvals.NatsApprover`, `commonos.loop.service`), and `cos approve` / `cos deny` and the
console ask them here:

* `ask_loops` asks `cos.approvals.pending` and gathers every loop service's `PendingApprovals`: the approvals
  waiting and the profiles the loops serve; `list_pending` is its approvals.
* `send_decision` sends an `ApprovalAnswer` on `cos.approvals.decide.<profile>.<approval_id>.<approver>` and
  returns the waiting loop's `ApprovalAck`, or a not-ok one saying why there is none (nobody waiting, no answer
  in time, an answer that is not an ack).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass

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

log = logging.getLogger(__name__)


async def send_decision(
    nc: Client,
    profile_id: str,
    approval_id: uuid.UUID,
    status: ApprovalStatus,
    approver: str,
    timeout_s: float = 5.0,
) -> ApprovalAck:
    """Send `approver`'s decision to the loop waiting on `approval_id` of `profile_id`; a not-ok ack says why
    it was not taken (no answer at all when NATS does not let this connection answer as `approver`).

    Raises ValueError, before sending anything, for an approver that is not one subject token.
    """
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


@dataclass(frozen=True)
class LoopAnswers:
    """What the loop services said: the approvals waiting (oldest to expire first) and the profiles they serve."""

    approvals: list[ApprovalRequest]
    #: The profiles some loop service answers chats for, sorted (an imported profile is in none).
    served: tuple[str, ...]


async def list_pending(
    nc: Client, profile_ids: tuple[str, ...] | None = None, timeout_s: float = 2.0, settle_s: float = 0.15
) -> list[ApprovalRequest]:
    """The approvals waiting in every loop service (of `profile_ids`, or all), soonest to expire first."""
    return (await ask_loops(nc, profile_ids, timeout_s, settle_s)).approvals


async def ask_loops(
    nc: Client, profile_ids: tuple[str, ...] | None = None, timeout_s: float = 2.0, settle_s: float = 0.15
) -> LoopAnswers:
    """The approvals waiting in every loop service (of `profile_ids`, or all) and the profiles they serve.

    Asks `cos.approvals.pending` once and gathers the answers: each loop answers with its own, so after the
    first answer this waits `settle_s` more for the others (at most `timeout_s` in all). No loop service
    (NATS says no one listens) or no answer in time is nothing waiting and nothing served."""
    inbox = nc.new_inbox()
    answers: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_answer(msg: Msg) -> None:
        answers.put_nowait(msg)

    sub = await nc.subscribe(inbox, cb=on_answer)
    found: dict[uuid.UUID, ApprovalRequest] = {}
    served: set[str] = set()
    try:
        await nc.publish(APPROVALS_PENDING, msgspec.json.encode(PendingQuery(profile_ids=profile_ids)), reply=inbox)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        first = True
        while True:
            left = deadline - loop.time()
            if not first:
                left = min(left, settle_s)
            if left <= 0:
                break
            try:
                msg = await asyncio.wait_for(answers.get(), left)
            except TimeoutError:
                break
            if msg.headers and msg.headers.get("Status") == "503":
                break  # no responders: no loop service runs
            first = False
            try:
                answer = msgspec.json.decode(msg.data, type=PendingApprovals)
            except msgspec.DecodeError as exc:
                log.warning("not a pending approvals answer: %s", exc)
                continue
            served.update(answer.profile_ids)
            for request in answer.approvals:
                found[request.approval_id] = request
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    wanted = found.values() if profile_ids is None else (r for r in found.values() if r.profile_id in profile_ids)
    approvals = sorted(wanted, key=lambda r: (r.expires_at, str(r.approval_id)))
    return LoopAnswers(approvals, tuple(sorted(served)))
