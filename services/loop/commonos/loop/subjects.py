"""Core-NATS subjects of the loop (request/reply, not stored in the stream).

* `cos.cmd.<profile>.chat` — chat requests from other services (`ChatRequest` → `ChatReply`).
* `cos.approvals.<profile>.request` — a risky tool call waits for a decision (`ApprovalRequest`).
* `cos.approvals.decide.<approval_id>` — the decision (`ApprovalAnswer` → `ApprovalAck`), sent by
  `cos approve ID` / `cos deny ID`; the waiting loop answers whether it took it.
"""

from __future__ import annotations

import uuid
from typing import Final

from commonos.proto.tags import check_profile_id

CHAT_QUEUE_GROUP: Final = "cos-loop"
APPROVAL_REQUESTS_ALL: Final = "cos.approvals.*.request"


def chat_subject(profile_id: str) -> str:
    return f"cos.cmd.{check_profile_id(profile_id)}.chat"


def approval_request_subject(profile_id: str) -> str:
    return f"cos.approvals.{check_profile_id(profile_id)}.request"


def approval_decide_subject(approval_id: uuid.UUID) -> str:
    return f"cos.approvals.decide.{approval_id}"
