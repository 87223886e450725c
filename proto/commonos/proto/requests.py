"""The loop's request/reply messages on core NATS (not stored in the stream): chat turns and approvals.

Every side that talks to the loop (the loop itself, `cos chat`, `cos approve` / `cos deny`, the console) uses
these messages and subjects; services never import each other, so they are here. Encoded as JSON
(`msgspec.json`).

* `cos.cmd.<profile>.chat` (`chat_subject`) — a turn: `ChatRequest` → `ChatReply`. Published by the console's
  Chat page, `cos chat` (against a running loop service) or any service; answered by one loop service of the
  profile (the loop's queue group). A request with `started` gets two replies on its reply subject: `started`
  with the session and turn ids as soon as the turn has them, then the final reply (a loop that does not know
  `started` replies once).
* `cos.approvals.<profile>.request` (`approval_request_subject`; every profile's: `APPROVAL_REQUESTS_ALL`) — a
  risky tool call starts to wait for a decision: `ApprovalRequest`, no reply. Published by the loop; followed
  by `cos chat`, the console's Chat and Approvals pages.
* `cos.approvals.decide.<profile>.<approval_id>.<approver>` (`approval_decide_subject`) — a decision:
  `ApprovalAnswer` → `ApprovalAck`. Published by `cos approve` / `cos deny` and the console (as `web:<name>`);
  answered by the loop whose turn waits (the ack says whether it took the decision). Who decided is the
  subject's last token (`check_approver`: one subject token), which NATS permissions bind to the publishing
  user; the body's `decided_by` is not trusted.
* `cos.approvals.pending` (`APPROVALS_PENDING`) — which approvals wait now: `PendingQuery` → `PendingApprovals`.
  Published by the console (and the loop's `list_pending`); answered by every loop service (no queue group)
  with those its turns wait for, and the profiles whose chats it answers (so the console's Chat page offers
  only profiles a loop serves: an imported profile has none), so a requester gathers the answers for a moment.

Compatibility: a new field gets a default (a side that does not know it leaves it out), and a field a side does
not know is ignored when it decodes (no message here forbids unknown fields), so an older and a newer side read
each other's messages. Renaming or removing a field, changing its type or its default, or forbidding unknown
fields breaks that.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Any, Final

import msgspec

from commonos.proto.events import ApprovalStatus, Risk
from commonos.proto.tags import check_profile_id

#: Every profile's approval requests (the console's subscription).
APPROVAL_REQUESTS_ALL: Final = "cos.approvals.*.request"
#: Asked of every loop service: the approvals waiting in it (three tokens: no profile's subject is like it).
APPROVALS_PENDING: Final = "cos.approvals.pending"
#: An approver's name is one subject token: what NATS permissions bind a user to.
APPROVER: Final = re.compile(r"[A-Za-z0-9_:@+=-]{1,128}")


def chat_subject(profile_id: str) -> str:
    return f"cos.cmd.{check_profile_id(profile_id)}.chat"


def approval_request_subject(profile_id: str) -> str:
    return f"cos.approvals.{check_profile_id(profile_id)}.request"


def check_approver(approver: str) -> str:
    """`approver`, if it can name an approver (one subject token); ValueError otherwise."""
    if not APPROVER.fullmatch(approver):
        raise ValueError(
            f"approver {approver[:40]!r} is not a name of 1 to 128 letters, digits or _ : @ + = - "
            "(it is the last token of the answer's subject)"
        )
    return approver


def approval_decide_subject(profile_id: str, approval_id: uuid.UUID, approver: str) -> str:
    """Where `approver` answers: NATS permissions on it decide who may answer, for which profiles."""
    return f"cos.approvals.decide.{check_profile_id(profile_id)}.{approval_id}.{check_approver(approver)}"


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A chat request (`cos.cmd.<profile>.chat`); what it may carry is the loop's `TurnRequest`'s."""

    text: str
    session_id: uuid.UUID | None = None
    #: Only with a new session.
    tags: tuple[str, ...] = ()
    #: `web`, `cli` or `service`.
    source: str = "service"
    #: A new session's parent: a session of the same profile.
    parent_session_id: uuid.UUID | None = None
    #: Reply `started` (with the session and turn ids) as soon as the turn starts, then the final reply (the
    #: requester reads two messages from its reply subject; an older loop ignores this and replies once).
    started: bool = False


class ChatReply(msgspec.Struct, frozen=True, kw_only=True):
    """`status`: a TurnStatus (completed, failed, cancelled, interrupted), or `busy` (another turn of the
    session is running), `rejected` (a bad request) or `unavailable` (the service is stopping); `started`
    (the turn runs, the final reply follows) only for a request with `started`."""

    status: str
    session_id: uuid.UUID | None = None
    turn_id: uuid.UUID | None = None
    text: str = ""
    error: str | None = None


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A risky tool call waiting for a decision until `expires_at` (then it is denied: `timed_out`); the
    approval id is the tool call's `tool_call_id`."""

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
    """A decision: `approved` or `denied`, and who decided (`cli:<user>`; no U+0000)."""

    status: ApprovalStatus
    decided_by: str = "unknown"


class ApprovalAck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Whether the waiting loop took the decision; if not, why."""

    ok: bool
    error: str | None = None


class PendingQuery(msgspec.Struct, frozen=True, kw_only=True):
    """Which pending approvals are asked for: those of `profile_ids`, or (None) of every profile."""

    profile_ids: tuple[str, ...] | None = None


class PendingApprovals(msgspec.Struct, frozen=True, kw_only=True):
    """A loop service's answer to `cos.approvals.pending`: the approvals its turns wait for, oldest first, and
    the profiles whose chats it answers (`cos.cmd.<profile>.chat`; empty from a loop that does not say)."""

    approvals: tuple[ApprovalRequest, ...] = ()
    profile_ids: tuple[str, ...] = ()
