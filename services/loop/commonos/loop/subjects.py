"""Core-NATS subjects of the loop (request/reply, not stored in the stream).

* `cos.cmd.<profile>.chat` — chat requests from other services (`ChatRequest` → `ChatReply`).
* `cos.approvals.<profile>.request` — a risky tool call waits for a decision (`ApprovalRequest`).
* `cos.approvals.decide.<profile>.<approval_id>.<approver>` — the decision (`ApprovalAnswer` → `ApprovalAck`), sent by
  `cos approve ID` / `cos deny ID`; the waiting loop answers whether it took it.
* `cos.approvals.pending` — which approvals are waiting now (`PendingQuery` → `PendingApprovals`, in
  `commonos.loop.approvals`): every loop service answers with the approvals its turns wait for (no queue group),
  so a requester gathers the answers for a moment (`list_pending`).
* `cos.cmd.<profile>.delete.<requester>` — delete the profile (`DeleteRequest` → `DeleteReply`, in
  `commonos.proto.profiles`): a loop service publishes its `profile_deleted`, with `<requester>` as
  `deleted_by`, so NATS permissions on the subject decide who may delete which profiles.
"""

from __future__ import annotations

import re
import uuid
from typing import Final

from commonos.proto.tags import check_profile_id

CHAT_QUEUE_GROUP: Final = "cos-loop"
APPROVAL_REQUESTS_ALL: Final = "cos.approvals.*.request"
#: Asked of every loop service: the approvals waiting in it (three tokens: no profile's subject is like it).
APPROVALS_PENDING: Final = "cos.approvals.pending"


def chat_subject(profile_id: str) -> str:
    return f"cos.cmd.{check_profile_id(profile_id)}.chat"


#: Every delete request, whatever the profile and requester (the loop service's subscription).
DELETE_REQUESTS_ALL: Final = "cos.cmd.*.delete.*"


def delete_subject(profile_id: str, requester: str) -> str:
    """Where `requester` asks for a profile's deletion (a name like an approver's: one subject token)."""
    return f"cos.cmd.{check_profile_id(profile_id)}.delete.{check_approver(requester)}"


def approval_request_subject(profile_id: str) -> str:
    return f"cos.approvals.{check_profile_id(profile_id)}.request"


#: An approver's name is one subject token: what NATS permissions bind a user to.
_APPROVER: Final = re.compile(r"[A-Za-z0-9_:@+=-]{1,128}")
#: Deciders only the loop itself records; an answer naming one is refused.
RESERVED_DECIDERS: Final = frozenset({"policy", "timeout"})


def check_approver(approver: str) -> str:
    if not _APPROVER.fullmatch(approver):
        raise ValueError(
            f"approver {approver[:40]!r} is not a name of 1 to 128 letters, digits or _ : @ + = - "
            "(it is the last token of the answer's subject)"
        )
    return approver


def approval_decide_subject(profile_id: str, approval_id: uuid.UUID, approver: str) -> str:
    """Where `approver` answers: NATS permissions on it decide who may answer, for which profiles."""
    return f"cos.approvals.decide.{check_profile_id(profile_id)}.{approval_id}.{check_approver(approver)}"


def approval_answers_subject(profile_id: str, approval_id: uuid.UUID) -> str:
    """Every approver's answer to one approval (the loop's subscription)."""
    return f"cos.approvals.decide.{check_profile_id(profile_id)}.{approval_id}.*"
