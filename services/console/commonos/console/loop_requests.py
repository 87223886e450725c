"""What the console asks of the loop service over NATS: the loop's own request and answer messages.

Services never import each other (import-linter), so these are the wire forms of `commonos.loop.service`'s
`ChatRequest`/`ChatReply` and `commonos.loop.approvals`' `ApprovalRequest`, `ApprovalAnswer`, `ApprovalAck`,
`PendingQuery` and `PendingApprovals`, on the loop's subjects (`commonos.loop.subjects`); unknown fields are
ignored both ways. tests/console/test_chat.py checks that both sides encode and decode each other's messages.

* `cos.cmd.<profile>.chat` — a turn (`ChatRequest`, with `started`: the reply subject gets `started` with the
  session and turn ids, then the final `ChatReply`).
* `cos.approvals.pending` — every loop service answers with the approvals its turns wait for.
* `cos.approvals.<profile>.request` — a new approval starts to wait (the loop publishes it).
* `cos.approvals.decide.<profile>.<approval_id>.<approver>` — a decision; the subject's last token is who decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from datetime import datetime
from typing import Any, Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.proto.events import ApprovalStatus, Risk
from commonos.proto.tags import check_profile_id

APPROVALS_PENDING: Final = "cos.approvals.pending"
APPROVAL_REQUESTS_ALL: Final = "cos.approvals.*.request"
#: An approver's name is one subject token (the loop's `check_approver`).
APPROVER: Final = re.compile(r"[A-Za-z0-9_:@+=-]{1,128}")


def chat_subject(profile_id: str) -> str:
    return f"cos.cmd.{check_profile_id(profile_id)}.chat"


def approval_decide_subject(profile_id: str, approval_id: uuid.UUID, approver: str) -> str:
    if not APPROVER.fullmatch(approver):
        raise ValueError(f"{approver!r} cannot name an approver (letters, digits and _ : @ + = - only)")
    return f"cos.approvals.decide.{check_profile_id(profile_id)}.{approval_id}.{approver}"


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    session_id: uuid.UUID | None = None
    tags: tuple[str, ...] = ()
    source: str = "web"
    parent_session_id: uuid.UUID | None = None
    started: bool = False


class ChatReply(msgspec.Struct, frozen=True, kw_only=True):
    status: str
    session_id: uuid.UUID | None = None
    turn_id: uuid.UUID | None = None
    text: str = ""
    error: str | None = None


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


class ApprovalAnswer(msgspec.Struct, frozen=True, kw_only=True):
    status: ApprovalStatus
    decided_by: str = "unknown"


class ApprovalAck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    ok: bool
    error: str | None = None


class PendingQuery(msgspec.Struct, frozen=True, kw_only=True):
    profile_ids: tuple[str, ...] | None = None


class PendingApprovals(msgspec.Struct, frozen=True, kw_only=True):
    approvals: tuple[ApprovalRequest, ...] = ()


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
