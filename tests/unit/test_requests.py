"""commonos.proto.requests, the loop's request/reply contract: the wire form of each message stays the same,
every message reads back what it wrote, an older or newer side's message is read (unknown fields ignored, a
missing field its default), and the subjects."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec
import pytest

from commonos.proto import requests as rq
from commonos.proto.events import ApprovalStatus, Risk
from commonos.proto.tags import InvalidProfileId

SID = uuid.UUID("00000000-0000-4000-8000-000000000001")
TID = uuid.UUID("00000000-0000-4000-8000-000000000002")
AID = uuid.UUID("00000000-0000-4000-8000-000000000003")
REQUEST = rq.ApprovalRequest(
    approval_id=AID,
    profile_id="acme",
    session_id=SID,
    turn_id=TID,
    call_id="c1",
    tool="shell",
    args={"command": "ls"},
    expires_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
)
REQUEST_JSON = (
    f'{{"approval_id":"{AID}","profile_id":"acme","session_id":"{SID}","turn_id":"{TID}","call_id":"c1",'
    '"tool":"shell","args":{"command":"ls"},"risk":"high","expires_at":"2026-01-02T03:04:05Z"}'
)

#: Each message and its bytes on the wire: what an older or newer side reads.
WIRE: list[tuple[msgspec.Struct, str]] = [
    (
        rq.ChatRequest(text="hi"),
        '{"text":"hi","session_id":null,"tags":[],"source":"service","parent_session_id":null,"started":false}',
    ),
    (
        rq.ChatRequest(text="hi", session_id=SID, tags=("a:b",), source="web", parent_session_id=TID, started=True),
        f'{{"text":"hi","session_id":"{SID}","tags":["a:b"],"source":"web","parent_session_id":"{TID}","started":true}}',
    ),
    (
        rq.ChatReply(status="completed"),
        '{"status":"completed","session_id":null,"turn_id":null,"text":"","error":null}',
    ),
    (
        rq.ChatReply(status="started", session_id=SID, turn_id=TID),
        f'{{"status":"started","session_id":"{SID}","turn_id":"{TID}","text":"","error":null}}',
    ),
    (REQUEST, REQUEST_JSON),
    (
        rq.ApprovalAnswer(status=ApprovalStatus.APPROVED, decided_by="web:abel"),
        '{"status":"approved","decided_by":"web:abel"}',
    ),
    (rq.ApprovalAck(ok=True), '{"ok":true}'),
    (rq.ApprovalAck(ok=False, error="already decided"), '{"ok":false,"error":"already decided"}'),
    (rq.PendingQuery(), '{"profile_ids":null}'),
    (rq.PendingQuery(profile_ids=("acme",)), '{"profile_ids":["acme"]}'),
    (rq.PendingApprovals(approvals=(REQUEST,)), f'{{"approvals":[{REQUEST_JSON}],"profile_ids":[]}}'),
    (rq.PendingApprovals(profile_ids=("acme", "demo")), '{"approvals":[],"profile_ids":["acme","demo"]}'),
]

MESSAGES = [
    rq.ChatRequest,
    rq.ChatReply,
    rq.ApprovalRequest,
    rq.ApprovalAnswer,
    rq.ApprovalAck,
    rq.PendingQuery,
    rq.PendingApprovals,
]


@pytest.mark.parametrize(("message", "wire"), WIRE)
def test_each_message_s_wire_form_and_round_trip(message: msgspec.Struct, wire: str) -> None:
    assert msgspec.json.encode(message).decode() == wire
    assert msgspec.json.decode(wire, type=type(message)) == message


@pytest.mark.parametrize("message", MESSAGES)
def test_no_message_forbids_unknown_fields(message: type[msgspec.Struct]) -> None:
    assert not message.__struct_config__.forbid_unknown_fields
    assert message.__struct_config__.frozen


def test_a_newer_or_older_side_s_message_is_read() -> None:
    # A field this side does not know is ignored; a field the other side does not send takes its default.
    assert msgspec.json.decode(b'{"text":"hi","priority":3}', type=rq.ChatRequest) == rq.ChatRequest(text="hi")
    assert msgspec.json.decode(b'{"status":"completed"}', type=rq.ChatReply) == rq.ChatReply(status="completed")
    assert msgspec.json.decode(b'{"ok":true,"retry":false}', type=rq.ApprovalAck) == rq.ApprovalAck(ok=True)
    assert msgspec.json.decode(b'{"status":"denied"}', type=rq.ApprovalAnswer) == rq.ApprovalAnswer(
        status=ApprovalStatus.DENIED, decided_by="unknown"
    )
    assert msgspec.json.decode(b"{}", type=rq.PendingQuery) == rq.PendingQuery()
    assert msgspec.json.decode(b"{}", type=rq.PendingApprovals) == rq.PendingApprovals()
    # An older loop does not say which profiles it serves: none, as far as a requester can tell.
    assert msgspec.json.decode(b'{"approvals":[]}', type=rq.PendingApprovals).profile_ids == ()
    minimal = REQUEST_JSON.replace(',"args":{"command":"ls"},"risk":"high"', ',"reason":"new"')
    read = msgspec.json.decode(minimal, type=rq.ApprovalRequest)
    assert (read.args, read.risk) == ({}, Risk.HIGH)


def test_subjects() -> None:
    assert rq.chat_subject("acme") == "cos.cmd.acme.chat"
    assert rq.approval_request_subject("acme") == "cos.approvals.acme.request"
    assert rq.approval_decide_subject("acme", AID, "web:abel") == f"cos.approvals.decide.acme.{AID}.web:abel"
    assert rq.APPROVALS_PENDING == "cos.approvals.pending"
    assert rq.APPROVAL_REQUESTS_ALL == "cos.approvals.*.request"
    for subject in (rq.chat_subject, rq.approval_request_subject):
        with pytest.raises(InvalidProfileId):
            subject("a.b")
    with pytest.raises(InvalidProfileId):
        rq.approval_decide_subject("a.b", AID, "cli:ann")


@pytest.mark.parametrize("approver", ["cli:ann", "web:abel", "a@b+c=d_e-f", "x" * 128])
def test_an_approver_is_one_subject_token(approver: str) -> None:
    assert rq.check_approver(approver) == approver
    assert rq.APPROVER.fullmatch(approver)


@pytest.mark.parametrize("approver", ["", "a.b", "a b", "a*", "a>", "x" * 129, "ann\x00"])
def test_not_an_approver(approver: str) -> None:
    with pytest.raises(ValueError, match="is not a name of 1 to 128"):
        rq.check_approver(approver)
    with pytest.raises(ValueError, match="is not a name of 1 to 128"):
        rq.approval_decide_subject("acme", AID, approver)
