"""OTLP values as Python values, the loose readers, and the tags of a resource (pure)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from commonos.otlp_gateway.attributes import (
    DEFAULT_TAG_ATTRIBUTES,
    any_value,
    attributes,
    boolean,
    count,
    decimal,
    from_nanos,
    integer,
    json_object,
    number,
    resource_tags,
    tag_attributes_from_env,
    text,
    timestamp,
)
from commonos.proto.tags import InvalidTag
from tests.otlp_gateway.logs import any_value as to_any
from tests.otlp_gateway.logs import kvs


def test_any_value_of_every_kind() -> None:
    value = {"s": "x", "b": True, "i": 7, "d": 1.5, "y": b"\x00", "a": [1, "two"], "kv": {"k": "v"}}
    assert attributes(kvs(value)) == value
    assert any_value(AnyValue()) is None


def test_loose_readers_take_strings_spelling_the_type() -> None:
    assert integer(5) == 5 and integer("42") == 42 and integer(" 7 ") == 7 and integer(3.0) == 3
    assert integer(True) is None and integer("4.5") is None and integer(4.5) is None and integer(None) is None
    assert count("10") == 10 and count(-3) == 0 and count(None) == 0 and count("x") == 0
    assert number("10") == 10.0 and number(2) == 2.0 and number("nan") is None and number(False) is None
    assert boolean("true") is True and boolean("FALSE") is False and boolean(True) is True and boolean("1") is None
    assert text("a") == "a" and text("") is None and text(3) is None


def test_decimals_are_exact() -> None:
    assert decimal(0.1) == Decimal("0.1")
    assert decimal(0.17142960000000002) == Decimal("0.17142960000000002")  # the double as sent, not rounded
    assert decimal("0.0692151") == Decimal("0.0692151") and decimal(2) == Decimal(2)
    assert decimal("abc") is None and decimal(float("inf")) is None and decimal(True) is None and decimal(None) is None


def test_times() -> None:
    assert timestamp("2026-12-01T20:04:49.635Z") == datetime(2026, 12, 1, 20, 4, 49, 635000, tzinfo=UTC)
    assert timestamp("2026-12-01T20:04:49") == datetime(2026, 12, 1, 20, 4, 49, tzinfo=UTC)
    assert timestamp("yesterday") is None and timestamp(5) is None
    assert from_nanos(1796155489522000000) == datetime(2026, 12, 1, 20, 4, 49, 522000, tzinfo=UTC)
    assert from_nanos(0) is None
    # OTLP times are fixed64: the largest is in 2554, still a datetime.
    assert from_nanos(2**64 - 1) == datetime(2554, 7, 21, 23, 34, 33, 709551, tzinfo=UTC)


def test_resource_tags_from_cos_tag_and_the_configured_keys() -> None:
    resource = {
        "service.name": "claude-code",
        "client": "acme",
        "project": "site",
        "team": "web",
        "cos.tag.cost-center": "cc42",
        "cos.tag.billable": True,
        "env": "dev",
    }
    assert resource_tags(resource) == ("billable:true", "client:acme", "cost-center:cc42", "project:site", "team:web")
    # Only cos.tag.* when no bare key is configured; another list of bare keys.
    assert resource_tags(resource, ()) == ("billable:true", "cost-center:cc42")
    assert resource_tags(resource, ("env",)) == ("billable:true", "cost-center:cc42", "env:dev")
    assert resource_tags({}) == ()


@pytest.mark.parametrize(
    ("resource", "rule"),
    [
        ({"client": "acme corp"}, "no spaces"),
        ({"cos.tag.Client": "acme"}, "upper case in the key"),
        ({"project": "a/b"}, "bad character in the value"),
        ({"cos.tag.": "x"}, "empty key"),
        ({"team": ""}, "no value"),
        ({"client": [1, 2]}, "not a string, bool or number"),
    ],
)
def test_an_invalid_tag_names_the_attribute(resource: dict[str, object], rule: str) -> None:
    with pytest.raises(InvalidTag) as raised:
        resource_tags(resource)
    message = str(raised.value)
    assert rule in message and f"resource attribute {next(iter(resource))!r}" in message


def test_tag_attributes_from_the_environment() -> None:
    assert tag_attributes_from_env(None) == DEFAULT_TAG_ATTRIBUTES == ("client", "project", "team")
    assert tag_attributes_from_env("") == ()
    assert tag_attributes_from_env(" client , cost_center,client,") == ("client", "cost_center")


def test_the_test_builder_round_trips() -> None:
    assert any_value(to_any({"a": [True, 2.5]})) == {"a": [True, 2.5]}


def test_a_timestamp_no_utc_datetime_holds_is_none() -> None:
    """Year 1 east of UTC, year 9999 west of it, or the last instant: no row can hold it (billing refuses it)."""
    assert timestamp("0001-01-01T00:00:00+01:00") is None
    assert timestamp("9999-12-31T23:00:00-01:00") is None
    assert timestamp("9999-12-31T23:59:59.999999Z") is None and timestamp("0001-01-01T00:00:00Z") is None
    assert timestamp("0001-01-01T00:00:01Z") == datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC)


def test_tool_arguments_are_the_json_object_the_stored_event_holds() -> None:
    assert json_object(None) == {} and json_object(None, "input") == {}
    assert json_object('{"q": 1}') == {"q": 1} == json_object('{"q": 1}', "input")
    assert json_object("ls -la") == {} and json_object("ls -la", "input") == {"input": "ls -la"}
    assert json_object("[1, 2]") == {} and json_object("[1, 2]", "arguments") == {"arguments": [1, 2]}
    # An OTLP map: bytes as base64, a float JSON cannot hold as null, as decoding the stored JSON gives.
    assert json_object({"b": b"\x00\x01", "f": float("inf"), "l": [b"", 1.5]}) == {
        "b": "AAE=",
        "f": None,
        "l": ["", 1.5],
    }
    # Over 64 KiB of JSON: left out, whatever the form.
    assert json_object({"x": "y" * 70_000}) == {} and json_object('{"x": "' + "y" * 70_000 + '"}') == {}
    assert json_object("y" * 70_000, "input") == {}
