"""CloudEvents headers checked against the body, and replays routed to the consumer they are for."""

from __future__ import annotations

from datetime import timedelta, timezone

import pytest

from commonos.proto import events as ev
from commonos.proto.cloudevents import HeaderError, check_event_headers, event_headers, percent_encode
from commonos.runtime.consumer import projection_of
from tests.factories import Clock, SessionBuilder


def _event() -> ev.SessionCreated:
    (event,) = SessionBuilder("default", Clock()).create().events
    assert isinstance(event, ev.SessionCreated)
    return event


def test_headers_as_written_pass_and_an_equivalent_time_passes() -> None:
    event = _event()
    check_event_headers(event_headers(event, "urn:commonos:loop"), event)
    other_offset = event.occurred_at.astimezone(timezone(timedelta(hours=9))).isoformat()
    check_event_headers({**event_headers(event), "ce-time": other_offset}, event)
    check_event_headers({**event_headers(event), "ce-source": percent_encode("urn:ünïcode source")}, event)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"ce-id": "1e1b3c4a-0000-4000-8000-000000000000"}, "ce-id"),
        ({"ce-type": "cos.turn_started.v1"}, "ce-type"),
        ({"ce-subject": "not-the-session"}, "ce-subject"),
        ({"ce-time": "yesterday"}, "not an RFC 3339 time"),
        ({"ce-time": "2026-11-01T09:00:00.010"}, "not an RFC 3339 time with an offset"),
        ({"ce-specversion": "0.3"}, "unsupported ce-specversion"),
        ({"ce-source": "%C3%28"}, "bad percent-encoding"),
        ({"ce-source": ""}, "ce-source is empty"),
    ],
)
def test_headers_that_disagree_are_refused(change: dict[str, str], fragment: str) -> None:
    event = _event()
    with pytest.raises(HeaderError, match=fragment):
        check_event_headers({**event_headers(event), **change}, event)


def test_missing_headers_are_named() -> None:
    event = _event()
    headers = {k: v for k, v in event_headers(event).items() if k not in ("ce-time", "ce-subject")}
    with pytest.raises(HeaderError, match="missing CloudEvents headers: ce-subject, ce-time"):
        check_event_headers(headers, event)
    with pytest.raises(HeaderError, match="no CloudEvents headers"):
        check_event_headers({"Nats-Expected-Stream": "COS_EVENTS"}, event)


def test_a_replay_is_for_a_projection_whatever_its_partition() -> None:
    assert projection_of("journal-writer-p3-of-8") == "journal-writer" == projection_of("journal-writer")
    assert projection_of("billing-p0-of-2") == "billing"
    assert projection_of("graph-writer") == "graph-writer"
