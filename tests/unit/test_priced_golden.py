"""The priced-call event (`commonos.proto.costs`) as billing's relay publishes it: its golden message
(tests/golden/v1/costs/), its headers, and its exported JSON Schema."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from commonos.billing.outbox import priced_message
from commonos.proto.cloudevents import decode_headers
from commonos.proto.costs import ModelCallPriced, cost_delta, decode_priced, encode_priced, priced_event_id
from commonos.proto.schemas import schema_files
from commonos.proto.subjects import COSTS_STREAM
from commonos.runtime.limits import with_stream_header

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "v1" / "costs" / "model_call_priced.json"
CALL = uuid.UUID("0193a000-0000-7000-8000-00000000000b")


def sample() -> ModelCallPriced:
    """A reprice's correction: an o4-mini call moved from genai-prices to an operator's price."""
    return ModelCallPriced(
        event_id=priced_event_id(CALL, 7),
        occurred_at=datetime(2026, 11, 30, 9, 0, tzinfo=UTC),
        call_id=CALL,
        revision=7,
        profile_id="acme",
        session_id=uuid.UUID("0193a000-0000-7000-8000-000000000001"),
        turn_id=uuid.UUID("0193a000-0000-7000-8000-000000000002"),
        provider="openai",
        model="o4-mini",
        tags=("client:acme", "team:core"),
        called_at=datetime(2026, 11, 29, 17, 45, 12, 250000, tzinfo=UTC),
        cost_usd=Decimal("0.0125"),
        previous_cost_usd=Decimal("0.00715"),
        cost_delta_usd=cost_delta(Decimal("0.0125"), Decimal("0.00715")),
        cost_status="override",
        price_source="prices.toml",
        price_version="sha256:1f2e",
    )


def published() -> dict[str, Any]:
    subject, body, headers = priced_message(sample())
    assert subject == "cos.costs.acme.priced"
    return {"headers": with_stream_header(headers, COSTS_STREAM), "body": json.loads(body)}


def test_the_golden_is_what_the_relay_publishes_now() -> None:
    """A change to what billing publishes shows up here: review it, then write the golden again."""
    assert json.loads(GOLDEN.read_text()) == published()


def test_the_golden_decodes_and_its_headers_agree() -> None:
    golden = json.loads(GOLDEN.read_text())
    event = decode_priced(json.dumps(golden["body"]).encode())
    assert event == sample()
    assert event.cost_delta_usd == Decimal("0.00535")
    attrs = decode_headers(golden["headers"])
    assert attrs["id"] == golden["headers"]["Nats-Msg-Id"] == str(event.event_id)
    assert (attrs["type"], attrs["subject"], attrs["source"]) == (
        "cos.model_call_priced.v1",
        str(CALL),
        "urn:commonos:billing",
    )
    assert attrs["dataschema"] == "https://commonos.dev/schemas/costs/model_call_priced/v1.json"


def test_the_schema_accepts_the_golden_and_refuses_what_is_not_one() -> None:
    schema = schema_files()["costs/model_call_priced/v1.json"]
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    body = json.loads(GOLDEN.read_text())["body"]
    validator.validate(body)
    for bad in (
        {**body, "cost_delta_usd": 0.00535},  # a binary float, not an exact decimal string
        {**body, "called_at": "yesterday at noon"},
        {**body, "revision": -1},
        {**body, "currency": "EUR"},
        {k: v for k, v in body.items() if k != "call_id"},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)


@pytest.mark.parametrize(
    ("cost", "previous", "delta"),
    [
        (Decimal("1.5"), None, Decimal("1.5")),  # first pricing
        (None, None, Decimal(0)),  # unpriced: adds nothing
        (Decimal("2"), Decimal("1.5"), Decimal("0.5")),
        (None, Decimal("1.5"), Decimal("-1.5")),  # a price withdrawn
    ],
)
def test_the_delta_is_what_a_revision_adds_to_a_sum(
    cost: Decimal | None, previous: Decimal | None, delta: Decimal
) -> None:
    assert cost_delta(cost, previous) == delta
    event = ModelCallPriced(**{**_fields(), "cost_usd": cost, "previous_cost_usd": previous, "cost_delta_usd": delta})
    assert decode_priced(encode_priced(event)) == event


def test_a_republish_has_the_same_id_and_each_revision_its_own() -> None:
    assert priced_event_id(CALL, 0) == priced_event_id(CALL, 0)
    assert len({priced_event_id(CALL, r) for r in range(100)}) == 100


def _fields() -> dict[str, Any]:
    s = sample()
    return {f: getattr(s, f) for f in s.__struct_fields__}
