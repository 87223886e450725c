"""Asking a person whether a risky tool call may run, and waiting (bounded) for the answer.

`NatsApprover` publishes an `ApprovalRequest` on `cos.approvals.<profile>.request` and waits on
`cos.approvals.decide.<profile>.<approval_id>.<approver>` for an `ApprovalAnswer` (sent by `cos approve ID` / `cos
deny ID` or the console, through `commonos.runtime.loop_requests.send_decision`), replying with an `ApprovalAck`.
Who decided is the subject's last token (NATS permissions decide who may answer as whom, for which profiles);
`policy` and `timeout` are the loop's own and refused in an answer. No answer before the profile's timeout means
denied (`timed_out`). An answer not taken (neither approved nor denied, a `decided_by` holding U+0000, or one after
the decision) gets a not-ok ack saying why; until one is taken the approval keeps waiting. The approval id is the
tool call's `tool_call_id`.

Pending approvals live only in the waiting loops (`NatsApprover.pending`): a loop service answers
`cos.approvals.pending` (`PendingQuery` → `PendingApprovals`) with those of its turns, and
`commonos.runtime.loop_requests.list_pending` gathers every loop's answer (a console's Approvals page).
`cos.approvals.<profile>.request` tells of each new one as it starts to wait. The messages and the subjects the
loop shares are in `commonos.proto.requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from datetime import timedelta
from typing import Any, Protocol

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.loop.subjects import RESERVED_DECIDERS, approval_answers_subject
from commonos.proto.events import ApprovalStatus, Risk, utcnow
from commonos.proto.requests import (
    ApprovalAck,
    ApprovalAnswer,
    ApprovalRequest,
    PendingApprovals,
    approval_request_subject,
)
from commonos.proto.text import NUL

log = logging.getLogger(__name__)


#: An answer whose `decided_by` holds U+0000 is refused (the approval keeps waiting for a good one).
NUL_DECIDER = "decided_by contains U+0000 (NUL), which cannot be stored; the approval is still waiting"


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
        #: The approvals waiting for an answer now, by approval id (in the order they started to wait).
        self.pending: dict[uuid.UUID, ApprovalRequest] = {}

    def waiting(self, profile_ids: tuple[str, ...] | None = None) -> PendingApprovals:
        """The approvals waiting now, of `profile_ids` (None: every profile)."""
        return PendingApprovals(
            approvals=tuple(r for r in self.pending.values() if profile_ids is None or r.profile_id in profile_ids)
        )

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
        self.pending[request.approval_id] = request
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
            self.pending.pop(request.approval_id, None)
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
