"""The exported schemas of the core NATS messages (proto/schema/messages/), read with a stock validator.

These messages are never stored (a turn's deltas, chat and approval requests and their replies), and other
services write them too, so each schema must accept what our side writes, what a minimal writer sends (the
fields without a default), and refuse what the decoder refuses. ajv in strict mode compiles these files too
(`test_schema_validators.test_ajv_strict_and_the_cloudevents_sdk_accept_every_golden` compiles every file).
"""

from __future__ import annotations

import inspect
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec
import pytest
from jsonschema import Draft202012Validator, FormatChecker

from commonos.proto import deltas, requests
from commonos.proto.events import ApprovalStatus, Risk
from commonos.proto.schemas import MESSAGE_TYPES, SCHEMA_BASE

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "proto" / "schema" / "messages"
SID = uuid.UUID("0193a000-0000-7000-8000-0000000000c1")
TID = uuid.UUID("0193a000-0000-7000-8000-0000000000d1")
AID = uuid.UUID("0193a000-0000-7000-8000-0000000000e1")
T0 = datetime(2026, 12, 3, 9, 0, 0, tzinfo=UTC)

_WAITING = requests.ApprovalRequest(
    approval_id=AID,
    profile_id="default",
    session_id=SID,
    turn_id=TID,
    call_id="call_1",
    tool="shell",
    args={"cmd": "rm -rf build"},
    risk=Risk.HIGH,
    expires_at=T0,
)

#: Every message with every field set, as our side writes it.
FULL: Final[dict[str, msgspec.Struct]] = {
    "delta": deltas.Delta(session_id=SID, turn_id=TID, seq=3, kind=deltas.DeltaKind.TEXT, text="Hel"),
    "chat_request": requests.ChatRequest(
        text="hello", session_id=None, tags=("client:acme",), source="web", parent_session_id=SID, started=True
    ),
    "chat_reply": requests.ChatReply(status="completed", session_id=SID, turn_id=TID, text="hi", error=None),
    "approval_request": _WAITING,
    "approval_answer": requests.ApprovalAnswer(status=ApprovalStatus.APPROVED, decided_by="web:ada"),
    "approval_ack": requests.ApprovalAck(ok=False, error="no turn waits for this approval"),
    "pending_query": requests.PendingQuery(profile_ids=("default",)),
    "pending_approvals": requests.PendingApprovals(approvals=(_WAITING,)),
}

#: What a minimal writer sends: the fields without a default only.
MINIMAL: Final[dict[str, dict[str, Any]]] = {
    "delta": {"session_id": str(SID), "turn_id": str(TID), "seq": 0, "kind": "done"},
    "chat_request": {"text": "hello"},
    "chat_reply": {"status": "busy"},
    "approval_request": {
        "approval_id": str(AID),
        "profile_id": "default",
        "session_id": str(SID),
        "turn_id": str(TID),
        "call_id": "call_1",
        "tool": "shell",
        "expires_at": "2026-12-03T09:00:00Z",
    },
    "approval_answer": {"status": "denied"},
    "approval_ack": {"ok": True},
    "pending_query": {},
    "pending_approvals": {},
}

#: (message, change, why): each is refused by the decoder and by the schema.
REFUSED: Final[list[tuple[str, dict[str, Any], str]]] = [
    ("delta", {"seq": "3"}, "seq is a string"),
    ("delta", {"kind": "thinking"}, "an unknown kind"),
    ("delta", {"session_id": "not-a-uuid"}, "a session id that is no UUID"),
    ("chat_request", {"text": None}, "no text"),
    ("chat_request", {"tags": "client:acme"}, "tags as one string"),
    ("approval_answer", {"status": "maybe"}, "an unknown status"),
    ("approval_request", {"risk": "medium"}, "an unknown risk"),
    ("approval_ack", {"ok": "yes"}, "ok is a string"),
    ("pending_query", {"profile_ids": "default"}, "profile ids as one string"),
]


def schema(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((SCHEMA_DIR / name / "v1.json").read_text())
    return document


def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(schema(name), format_checker=FormatChecker())


def test_every_message_struct_has_a_schema_file_with_its_id() -> None:
    structs = {
        cls
        for module in (deltas, requests)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, msgspec.Struct) and cls.__module__ == module.__name__
    }
    assert structs == {struct for struct, _ in MESSAGE_TYPES.values()}, "a message Struct without a schema"
    assert sorted(p.name for p in SCHEMA_DIR.iterdir()) == sorted(MESSAGE_TYPES)
    assert sorted(FULL) == sorted(MINIMAL) == sorted(MESSAGE_TYPES)
    for name in MESSAGE_TYPES:
        document = schema(name)
        assert document["$id"] == f"{SCHEMA_BASE}/messages/{name}/v1.json"
        Draft202012Validator.check_schema(document)


@pytest.mark.parametrize("name", sorted(MESSAGE_TYPES))
def test_what_our_side_writes_and_a_minimal_message_are_valid(name: str) -> None:
    struct, _ = MESSAGE_TYPES[name]
    written = json.loads(msgspec.json.encode(FULL[name]))
    assert sorted(validator(name).iter_errors(written), key=str) == []
    minimal = MINIMAL[name]
    assert sorted(validator(name).iter_errors(minimal), key=str) == []
    decoded = msgspec.json.decode(json.dumps(minimal).encode(), type=struct)
    assert isinstance(decoded, struct)
    # The schema requires exactly the fields the decoder cannot do without.
    required = set(schema(name).get("required", []))
    for field in minimal:
        without = {k: v for k, v in minimal.items() if k != field}
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(json.dumps(without).encode(), type=struct)
        assert field in required
    assert required == set(minimal)


@pytest.mark.parametrize(("name", "change", "why"), REFUSED, ids=[why for _, _, why in REFUSED])
def test_what_the_decoder_refuses_the_schema_refuses(name: str, change: dict[str, Any], why: str) -> None:
    struct, _ = MESSAGE_TYPES[name]
    body = {**json.loads(msgspec.json.encode(FULL[name])), **change}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(body).encode(), type=struct)
    assert list(validator(name).iter_errors(body)), f"the schema accepts a {name} with {why}"
