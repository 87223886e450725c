"""Core-NATS subjects only the loop uses (request/reply, not stored in the stream).

The subjects the loop shares with its requesters (`cos.cmd.<profile>.chat`, `cos.approvals.<profile>.request`,
`cos.approvals.decide.<profile>.<approval_id>.<approver>`, `cos.approvals.pending`) and their messages are in
`commonos.proto.requests`. Here:

* `cos.cmd.*.chat` served in the queue group `cos-loop`: one loop service answers each chat request.
* `cos.approvals.decide.<profile>.<approval_id>.*` — every approver's answer to one approval (the waiting
  loop's subscription); `policy` and `timeout` are the loop's own deciders, refused in an answer.
* `cos.cmd.<profile>.delete.<requester>` — delete the profile (`DeleteRequest` → `DeleteReply`, in
  `commonos.loop.profile_admin`): a loop service publishes its `profile_deleted`, with `<requester>` as
  `deleted_by`, so NATS permissions on the subject decide who may delete which profiles.
"""

from __future__ import annotations

import uuid
from typing import Final

from commonos.proto.requests import check_approver
from commonos.proto.tags import check_profile_id

CHAT_QUEUE_GROUP: Final = "cos-loop"

#: Every delete request, whatever the profile and requester (the loop service's subscription).
DELETE_REQUESTS_ALL: Final = "cos.cmd.*.delete.*"


def delete_subject(profile_id: str, requester: str) -> str:
    """Where `requester` asks for a profile's deletion (a name like an approver's: one subject token)."""
    return f"cos.cmd.{check_profile_id(profile_id)}.delete.{check_approver(requester)}"


#: Deciders only the loop itself records; an answer naming one is refused.
RESERVED_DECIDERS: Final = frozenset({"policy", "timeout"})


def approval_answers_subject(profile_id: str, approval_id: uuid.UUID) -> str:
    """Every approver's answer to one approval (the loop's subscription)."""
    return f"cos.approvals.decide.{check_profile_id(profile_id)}.{approval_id}.*"
