"""Asking a person whether a risky tool call may run, and waiting (bounded) for the answer.

`NatsApprover` publishes an `ApprovalRequest` on `cos.approvals.<profile>.request` and waits on
`cos.approvals.decide.<profile>.<approval_id>.<approver>` for an `ApprovalAnswer` (sent by `cos approve ID`
/ `cos deny ID`, or any service), replying with an `ApprovalAck`. Who decided is the subject's last token
(NATS permissions decide who may answer as whom, for which profiles); `policy` and `timeout` are the
loop's own and refused in an answer. No answer before the profile's timeout means denied
(`timed_out`). An answer not taken (neither approved nor denied, a `decided_by` holding U+0000, or one
after the decision) gets a not-ok ack saying why; until one is taken the approval keeps waiting. The
approval id is the tool call's `tool_call_id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from datetime import datetime, timedelta
from typing import Any, Protocol

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.loop.subjects import (
    RESERVED_DECIDERS,
    approval_answers_subject,
    approval_decide_subject,
    approval_request_subject,
)
from commonos.proto.events import ApprovalStatus, Risk, utcnow
from commonos.proto.text import NUL

log = logging.getLogger(__name__)


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    approval_id: uuid.UUID
    profile_id: str
    session_id: uuid.UUID
    turn_id: uuid.UUID
    call_id: str
    tool: str
    args: dict[str, Any] = {}
    risk: Risk = Risk.HIGH
    expires_at: datetime


#: An answer whose `decided_by` holds U+0000 is refused (the approval keeps waiting for a good one).
NUL_DECIDER = "decided_by contains U+0000 (NUL), which cannot be stored; the approval is still waiting"


class ApprovalAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """A decision: `approved` or `denied`, and who decided (`cli:<user>`; no U+0000)."""

    status: ApprovalStatus
    decided_by: str = "unknown"


class ApprovalAck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    ok: bool
    error: str | None = None


class Approver(Protocol):
    """Whoever decides on risky tool calls."""

    async def ask(self, request: ApprovalRequest, timeout_s: float) -> ApprovalAnswer:
        """Wait for a decision on `request`; after `timeout_s` without one, answer `timed_out` by `timeout`."""
        ...


TIMED_OUT = ApprovalAnswer(status=ApprovalStatus.TIMED_OUT, decided_by="timeout")


def new_request(
    *,
    approval_id: uuid.UUID,
    profile_id: str,
    session_id: uuid.UUID,
    turn_id: uuid.UUID,
    call_id: str,
    tool: str,
    args: dict[str, Any],
    risk: Risk,
    timeout_s: float,
) -> ApprovalRequest:
    return ApprovalRequest(
        approval_id=approval_id,
        profile_id=profile_id,
        session_id=session_id,
        turn_id=turn_id,
        call_id=call_id,
        tool=tool,
        args=args,
        risk=risk,
        expires_at=utcnow() + timedelta(seconds=timeout_s),
    )


class NatsApprover:
    def __init__(self, nc: Client) -> None:
        self.nc = nc

    async def ask(self, request: ApprovalRequest, timeout_s: float) -> ApprovalAnswer:
        decided: asyncio.Future[ApprovalAnswer] = asyncio.get_running_loop().create_future()

        async def on_answer(msg: Msg) -> None:
            # Who decided is the subject's last token, which NATS permissions bind to the answering user;
            # a `decided_by` in the body is not trusted.
            approver = msg.subject.rsplit(".", 1)[-1]
            try:
                answer = msgspec.json.decode(msg.data, type=ApprovalAnswer)
            except msgspec.DecodeError as exc:
                ack = ApprovalAck(ok=False, error=f"not an approval answer: {exc}")
            else:
                if answer.status is ApprovalStatus.TIMED_OUT:
                    ack = ApprovalAck(ok=False, error="answer approved or denied")
                elif approver in RESERVED_DECIDERS:
                    ack = ApprovalAck(ok=False, error=f"{approver!r} is reserved for the loop's own decisions")
                elif NUL in approver:
                    ack = ApprovalAck(ok=False, error=NUL_DECIDER)
                elif decided.done():
                    ack = ApprovalAck(ok=False, error="already decided")
                else:
                    decided.set_result(ApprovalAnswer(status=answer.status, decided_by=approver))
                    ack = ApprovalAck(ok=True)
            if msg.reply:
                with contextlib.suppress(nats.errors.Error):
                    await msg.respond(msgspec.json.encode(ack))

        sub = await self.nc.subscribe(approval_answers_subject(request.profile_id, request.approval_id), cb=on_answer)
        try:
            try:
                await self.nc.publish(approval_request_subject(request.profile_id), msgspec.json.encode(request))
            except nats.errors.Error as exc:
                log.warning("approval request %s not published: %s", request.approval_id, exc)
            try:
                return await asyncio.wait_for(decided, timeout_s)
            except TimeoutError:
                return TIMED_OUT
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


class FixedApprover:
    """Answers every request the same way (or times out when `answer` is None); records what it was asked."""

    def __init__(self, answer: ApprovalAnswer | None) -> None:
        self.answer = answer
        self.asked: list[ApprovalRequest] = []

    async def ask(self, request: ApprovalRequest, timeout_s: float) -> ApprovalAnswer:
        self.asked.append(request)
        return self.answer if self.answer is not None else TIMED_OUT


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
    return msgspec.json.decode(reply.data, type=ApprovalAck)
