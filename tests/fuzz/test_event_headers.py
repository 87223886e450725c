"""Fuzz target: CloudEvents headers against the body they travel with.

`check_event_headers` must accept exactly the headers that agree with the event (every attribute our
producers send present, percent-decodable as UTF-8, `ce-time` the same instant as `occurred_at`
whatever its spelling) and refuse every other with a HeaderError, never another exception. The
oracle below restates the contract from the CloudEvents NATS binding and DESIGN's envelope.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from urllib.parse import unquote

from hypothesis import event as note
from hypothesis import given
from hypothesis import strategies as st

from commonos.proto import events as ev
from commonos.proto.cloudevents import (
    EVENT_REQUIRED,
    HeaderError,
    ce_type,
    check_event_headers,
    event_headers,
    percent_encode,
)
from tests.fuzz import strategies as fz


def agrees(headers: dict[str, str] | None, event: ev.Event) -> bool:
    if not headers or any(h not in headers for h in EVENT_REQUIRED):
        return False
    attrs: dict[str, str] = {}
    for name, value in headers.items():
        if name.startswith("ce-"):
            try:
                attrs[name[3:]] = unquote(value, errors="strict") if "%" in value else value
            except UnicodeDecodeError:
                return False
    try:
        moment = datetime.fromisoformat(attrs["time"].replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return (
        attrs["specversion"] == "1.0"
        and attrs["id"] == str(event.event_id)
        and attrs["type"] == ce_type(ev.event_type(event))
        and attrs["subject"] == str(event.session_id)
        and moment.tzinfo is not None
        and moment == event.occurred_at
        and attrs["source"] != ""
    )


@st.composite
def event_and_headers(draw: st.DrawFn) -> tuple[ev.Event, dict[str, str] | None]:
    event = draw(fz.valid_events())
    kind = draw(st.sampled_from(["fuzzed", "fuzzed", "time", "source"]))
    if kind == "fuzzed":
        return event, draw(fz.headers_for(event))
    headers = event_headers(event, "urn:commonos:fuzz")
    if kind == "time":
        offset = timezone(timedelta(minutes=draw(st.integers(-14 * 60, 14 * 60))))
        shift = timedelta(microseconds=draw(st.sampled_from([0, 0, 0, 1, -1, 1_000_000])))
        moment = (event.occurred_at + shift).astimezone(offset)
        spelling = draw(st.sampled_from(["iso", "z", "micro"]))
        text = moment.isoformat()
        if spelling == "z" and moment.utcoffset() == timedelta(0):
            text = text.replace("+00:00", "Z")
        elif spelling == "micro":
            text = moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + text[-6:]
        headers["ce-time"] = percent_encode(text)
    else:
        headers["ce-source"] = percent_encode(draw(fz.texts(huge=False)))
    return event, headers


@given(event_and_headers())
def test_headers_are_accepted_exactly_when_they_agree_with_the_body(
    case: tuple[ev.Event, dict[str, str] | None],
) -> None:
    event, headers = case
    try:
        check_event_headers(headers, event)
    except HeaderError:
        note("refused")
        assert not agrees(headers, event), f"refused headers that agree: {headers}"
    else:
        note("accepted")
        assert agrees(headers, event), f"accepted headers that disagree: {headers}"
