import uuid

import pytest

from commonos.proto.events import SessionCreated
from commonos.proto.subjects import (
    SubjectError,
    dlq_subject,
    event_subject,
    parse_subject,
    session_filter,
    subject_for,
)


def test_build_and_parse() -> None:
    sid = uuid.uuid4()
    subject = event_subject("default", sid, "message_appended")
    assert subject == f"cos.events.default.{sid}.message_appended"
    parsed = parse_subject(subject)
    assert (parsed.profile_id, parsed.session_id, parsed.event_type) == ("default", sid, "message_appended")
    assert session_filter("default", sid) == f"cos.events.default.{sid}.*"
    assert dlq_subject(subject) == f"cos.dlq.default.{sid}.message_appended"


def test_subject_for_event() -> None:
    e = SessionCreated(profile_id="p-1", session_id=uuid.uuid4(), source="cli")
    assert subject_for(e) == f"cos.events.p-1.{e.session_id}.session_created"


@pytest.mark.parametrize(
    "bad",
    [
        "cos.events.default",
        "cos.x.default.00000000-0000-0000-0000-000000000000.session_created",
        "cos.events.Default.00000000-0000-0000-0000-000000000000.session_created",
        "cos.events.default.not-a-uuid.session_created",
        "cos.events.default.00000000-0000-0000-0000-000000000000.nope",
    ],
)
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(SubjectError):
        parse_subject(bad)


def test_build_rejects_bad_tokens() -> None:
    with pytest.raises(SubjectError):
        event_subject("a.b", uuid.uuid4(), "session_created")
    with pytest.raises(SubjectError):
        event_subject("a", uuid.uuid4(), "bogus")
