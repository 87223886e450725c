"""Fuzz targets of the wire contracts: events, CloudEvents headers, subjects, tags, profile ids, graphs.

Each target asserts the contract of one parser: it returns a value or raises exactly its documented
typed error, never another exception, within the profile's deadline per example.
"""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import event, given

from commonos.proto import events as ev
from commonos.proto import graph as g
from commonos.proto.cloudevents import REQUIRED, SPECVERSION, HeaderError, decode_headers
from commonos.proto.subjects import SubjectError, event_subject, parse_subject
from commonos.proto.tags import InvalidProfileId, InvalidTag, check_profile_id, is_valid_tag, parse_tag
from tests.fuzz import strategies as fz
from tests.fuzz.checks import check_graph_round_trip_and_validity


@given(fz.event_payloads())
def test_decode_event_returns_an_event_or_raises_event_decode_error(payload: bytes) -> None:
    try:
        decoded = ev.decode_event(payload)
    except ev.EventDecodeError as exc:
        assert str(exc), "a decode error says why"
        event("EventDecodeError")
        return
    event("event")
    assert ev.event_type(decoded) in ev.EVENT_TYPE_NAMES
    assert ev.decode_event(ev.encode_event(decoded)) is not None
    # What the decoder accepts, the hand-written checks accept too.
    check_profile_id(decoded.profile_id)
    for tag in getattr(decoded, "tags", ()):
        parse_tag(tag)


@given(fz.headers_for(None) | fz.valid_events().flatmap(fz.headers_for))
def test_decode_headers_returns_attributes_or_raises_header_error(headers: dict[str, str] | None) -> None:
    try:
        attrs = decode_headers(headers)
    except HeaderError as exc:
        assert str(exc)
        event("HeaderError")
        return
    event("attributes")
    assert headers is not None
    assert all(name in headers for name in REQUIRED)
    assert attrs["specversion"] == SPECVERSION
    assert set(attrs) == {name[3:] for name in headers if name.startswith("ce-")}


@given(fz.subject_strings)
def test_parse_subject_returns_its_parts_or_raises_subject_error(subject: str) -> None:
    try:
        parsed = parse_subject(subject)
    except SubjectError as exc:
        assert str(exc)
        event("SubjectError")
        return
    event("parsed")
    assert parsed.event_type in ev.EVENT_TYPE_NAMES
    canonical = event_subject(parsed.profile_id, parsed.session_id, parsed.event_type)
    assert parse_subject(canonical) == parsed


@given(fz.tag_strings)
def test_parse_tag_returns_the_tag_or_raises_invalid_tag(tag: str) -> None:
    try:
        assert parse_tag(tag) == tag
    except InvalidTag as exc:
        assert exc.tag == tag and exc.rule
        assert not is_valid_tag(tag)
        event("InvalidTag")
        return
    event("valid")
    assert re.fullmatch(r"[a-z0-9_-]+:[A-Za-z0-9_.-]+", tag)
    assert is_valid_tag(tag)


@given(fz.profile_id_strings)
def test_check_profile_id_returns_the_id_or_raises_invalid_profile_id(profile_id: str) -> None:
    try:
        assert check_profile_id(profile_id) == profile_id
    except InvalidProfileId as exc:
        assert exc.profile_id == profile_id
        event("InvalidProfileId")
        return
    event("valid")
    assert re.fullmatch(r"[a-z0-9_-]{1,64}", profile_id)


@given(fz.graph_payloads)
def test_decode_graph_and_validate_raise_only_their_typed_errors(payload: bytes) -> None:
    try:
        graph = g.decode_graph(payload)
    except msgspec.DecodeError:  # what `decode_event` turns into EventDecodeError (an undecodable event)
        event("DecodeError")
        return
    check_graph_round_trip_and_validity(graph)


@pytest.mark.parametrize("payload", [b"", b"null", b"{}", b"[]", b'{"type": null}', b"\xff\xfe"])
def test_decode_event_fixed_garbage(payload: bytes) -> None:
    """The smallest garbage, always run (a fuzz profile may not draw each of them)."""
    with pytest.raises(ev.EventDecodeError):
        ev.decode_event(payload)
