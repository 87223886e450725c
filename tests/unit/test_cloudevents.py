import uuid
from datetime import UTC, datetime

import pytest

from commonos.proto.cloudevents import (
    MSG_ID,
    HeaderError,
    decode_headers,
    event_headers,
    percent_decode,
    percent_encode,
)
from commonos.proto.events import SessionCreated


@pytest.mark.parametrize(
    ("raw", "encoded"),
    [
        ("plain-ascii_1.0/x", "plain-ascii_1.0/x"),
        ("with space", "with%20space"),
        ('quote"d', "quote%22d"),
        ("100%", "100%25"),
        ("Euro €", "Euro%20%E2%82%AC"),
        ("tab\there", "tab%09here"),
        ("ünï", "%C3%BCn%C3%AF"),
    ],
)
def test_percent_encoding_follows_the_binding(raw: str, encoded: str) -> None:
    assert percent_encode(raw) == encoded
    assert percent_decode(encoded) == raw


def test_header_round_trip_with_characters_that_need_encoding() -> None:
    event = SessionCreated(
        profile_id="default",
        session_id=uuid.uuid4(),
        source="cli",
        title="x",
        occurred_at=datetime(2026, 11, 30, 10, 0, 0, 123456, tzinfo=UTC),
    )
    source = 'urn:commonos:loop host "α" 100%'
    headers = event_headers(event, source=source)
    assert all(all("\u0021" <= c <= "\u007e" for c in v) for k, v in headers.items() if k.startswith("ce-"))
    assert headers[MSG_ID] == str(event.event_id)
    assert headers["content-type"] == "application/json"
    attrs = decode_headers(headers)
    assert attrs == {
        "specversion": "1.0",
        "id": str(event.event_id),
        "source": source,
        "type": "cos.session_created.v1",
        "time": "2026-11-30T10:00:00.123456Z",
        "subject": str(event.session_id),
        "datacontenttype": "application/json",
        "dataschema": "https://commonos.dev/schemas/events/session_created/v1.json",
    }


def test_missing_or_bad_headers_are_typed_errors() -> None:
    with pytest.raises(HeaderError, match="no headers"):
        decode_headers(None)
    with pytest.raises(HeaderError, match="ce-source"):
        decode_headers({"ce-specversion": "1.0", "ce-id": "x", "ce-type": "t"})
    with pytest.raises(HeaderError, match="specversion"):
        decode_headers({"ce-specversion": "0.3", "ce-id": "x", "ce-type": "t", "ce-source": "s"})
    with pytest.raises(HeaderError, match="percent"):
        decode_headers({"ce-specversion": "1.0", "ce-id": "%FF", "ce-type": "t", "ce-source": "s"})
