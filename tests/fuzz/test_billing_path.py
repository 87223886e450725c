"""Fuzz target of billing's whole per-event path, without I/O: decode, check, price, row, budgets, metrics.

Calls are valid by the event schema (they decode) and arbitrary within it: times from the year 1 to 9999
with any offset, token counts up to 2^64 - 1, known, odd and glob-like providers and models, reported costs
of every kind, tags of budgeted and unbudgeted keys. The contract (see commonos.billing.projection): every
call either yields a row that every later step takes without an exception, or `check` raises
InvalidModelCall, the DataError the consumer dead-letters. Any other exception is a bug of billing's.
The same path on real servers is tests/billing/test_poison.py.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final

import msgspec
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from commonos.accounting.pricing import MAX_PRICE_MTOK, CostStatus, Pricer, parse_price_file
from commonos.billing.budgets import BudgetAlert, BudgetStep, BudgetTracker, alert_percent, spend_deltas
from commonos.billing.config import Budget, MetricsConfig, Period
from commonos.billing.metrics import TOKEN_TYPES, BillingMetrics
from commonos.billing.projection import (
    MAX_COST_USD,
    BillingProjection,
    InvalidModelCall,
    UnbillableModelCall,
    insert_arguments,
)
from commonos.billing.service import alert_message
from commonos.proto import events as ev
from commonos.proto.cloudevents import percent_encode
from commonos.proto.errors import DataError
from tests.fuzz import strategies as fz

PRICE_FILE: Final = f"""
[[price]]
model = "dear-*"
input_mtok = "{MAX_PRICE_MTOK}"
output_mtok = "{MAX_PRICE_MTOK}"

[[price]]
provider = "ollama"
model = "local-*"
effective_from = 0001-01-01
input_mtok = "0.1"
output_mtok = "0.2"
cache_read_mtok = "0.0000000000000000001"

[[price]]
provider = "ollama"
model = "local-*"
effective_from = 9999-12-31T23:59:59.999999Z
input_mtok = "0.3"
output_mtok = "0.4"

[[price]]
provider = "anthropic"
model = "claude-sonnet-4*"
effective_from = 2026-01-01T00:00:00-12:00
input_mtok = "3.333333333333333333333333333333333333"
output_mtok = "15"
cache_write_5m_mtok = "3.75"
""".encode()

#: One genai-prices pricer and one with a price file, built once: a Pricer caches per model, as billing's does.
PRICERS: Final = (Pricer(), Pricer(parse_price_file(PRICE_FILE, name="fuzz-prices.toml")))

#: Limits so small that nearly every priced call crosses one, so alerts are built too.
BUDGETS: Final = (
    Budget("acme-day", "client:acme", Period.DAY, Decimal("1e-10")),
    Budget("acme-month", "client:acme", Period.MONTH, Decimal("0.5")),
    Budget("core-month", "team:core", Period.MONTH, Decimal("1e-10")),
)

#: One for the whole run, like the service's: its label caps keep the real counters' label sets bounded.
METRICS: Final = BillingMetrics(MetricsConfig(tag_label_keys=("client", "team"), max_models=20, max_providers=10))

# --- calls -----------------------------------------------------------------------------------------------

#: Times at the edges of what a datetime and a budget period can hold, and of price-change dates.
EDGE_TIMES: Final = (
    datetime(9999, 12, 31, 23, 59, 59, 999999),
    datetime(9999, 12, 31, 23, 59, 59),
    datetime(9999, 12, 31),
    datetime(9999, 12, 1),
    datetime(9999, 11, 30, 23, 59, 59, 999999),
    datetime(1, 1, 1),
    datetime(1, 1, 1, 0, 59, 59, 999999),
    datetime(1, 1, 2),
    datetime(1970, 1, 1),
    datetime(2000, 1, 1),
    datetime(2025, 6, 10),  # an o3 price change
    datetime(2026, 1, 1, 12),
)

offsets = st.sampled_from((0, 1, -1, 59, -59, 60, -60, 23 * 60 + 59, -(23 * 60 + 59))) | st.integers(-1439, 1439)
naive_times = st.sampled_from(EDGE_TIMES) | st.datetimes()
call_times = st.builds(lambda t, m: t.replace(tzinfo=timezone(timedelta(minutes=m))), naive_times, offsets)


def sometimes(strategy: st.SearchStrategy[Any], otherwise: st.SearchStrategy[Any], one_in: int) -> Any:
    """``strategy`` about once in ``one_in`` draws, else ``otherwise`` (the pick is not an end of the range,
    which Hypothesis draws far more often than the rest)."""
    return st.sampled_from(range(one_in)).flatmap(lambda pick: strategy if pick == one_in // 2 else otherwise)


#: Counts valid by the schema: a JSON integer from 0 to `MAX_COUNT` (a bigint). A larger one is refused by the
#: contract itself, before billing sees it (test_a_count_beyond_a_bigint_or_a_long_name_is_refused_by_the_contract).
EDGE_COUNTS: Final = (0, 1, 199_999, 200_000, 200_001, 2**31, 2**53 + 1, 2**62, ev.MAX_COUNT)
counts = st.sampled_from(EDGE_COUNTS) | st.integers(0, 10**7) | st.integers(0, ev.MAX_COUNT)


def test_a_count_beyond_a_bigint_or_a_long_name_is_refused_by_the_contract() -> None:
    call = ev.ModelCallCompleted(
        event_id=uuid.uuid4(),
        occurred_at=datetime.now(UTC),
        profile_id="default",
        session_id=uuid.uuid4(),
        provider="anthropic",
        model="claude-sonnet-4-5",
        cache_read_tokens=ev.MAX_COUNT + 1,
    )
    with pytest.raises(ev.EventDecodeError, match="cache_read_tokens"):
        ev.decode_event(ev.encode_event(call))
    for name in ("x" * 257, "é" * 300):
        with pytest.raises(ev.EventDecodeError, match="model"):
            ev.decode_event(ev.encode_event(msgspec.structs.replace(call, cache_read_tokens=0, model=name)))


KNOWN: Final = (
    ("anthropic", "claude-sonnet-4-5"),
    ("anthropic", "claude-opus-4-1"),
    ("claude-code", "claude-haiku-4-5"),
    ("openai", "o3"),
    ("openai", "o4-mini"),
    ("openai", "gpt-5"),
    ("codex", "gpt-5-codex"),
    ("google", "gemini-2.5-pro"),
    ("scripted", "echo"),
    ("ollama", "local-llama-3"),
    ("ollama", "dear-model"),
    ("anthropic", "claude-sonnet-4-20250514"),
)
odd_names = (
    st.sampled_from(("", " ", "*", "?", "[", "claude-*", "o3 ", " O3", "ANTHROPIC", "x" * 256, "a/b", "\x00"))
    | fz.nasty_text
    | fz.unicode_text
).filter(lambda name: len(name) <= ev.MAX_NAME_CHARS)  # a longer one the contract refuses (below)
providers_and_models = st.sampled_from(KNOWN) | st.tuples(
    st.sampled_from([p for p, _ in KNOWN]) | odd_names, st.sampled_from([m for _, m in KNOWN]) | odd_names
)

decimals = st.sampled_from(
    tuple(map(Decimal, ("0", "-0", "1e-40", "0.00000000005", "1e12", "1000000000000.0000000001", "1e13", "-1")))
    + tuple(map(Decimal, ("NaN", "sNaN", "Infinity", "-Infinity", "1e999999", "123456789012345678901234567890.5")))
) | st.decimals(allow_nan=False, allow_infinity=False)

SPEEDS: Final = ("fast", "standard", "priority", "batch", "flex", "")
budget_tags = st.sampled_from(("client:acme", "team:core", "client:globex"))
tags = st.lists(budget_tags | fz.valid_tags, max_size=5).map(tuple)


@st.composite
def model_calls(draw: st.DrawFn) -> bytes:
    """One model_call_completed as it arrives: JSON bytes that decode against the schema."""
    provider, model = draw(providers_and_models)
    output = draw(counts)
    call = ev.ModelCallCompleted(
        event_id=draw(st.uuids()),
        occurred_at=draw(call_times),
        profile_id=draw(fz.valid_profile_ids),
        session_id=draw(st.uuids()),
        turn_id=draw(st.none() | st.uuids()),
        provider=provider,
        model=model,
        request_id=draw(st.none() | fz.texts(huge=False)),
        input_tokens=draw(counts),
        output_tokens=output,
        cache_read_tokens=draw(counts),
        cache_write_5m_tokens=draw(counts),
        cache_write_1h_tokens=draw(counts),
        # Mostly a part of the output, as it must be; sometimes more, which check refuses.
        reasoning_tokens=draw(sometimes(counts, st.integers(0, output), 20)),
        speed=draw(st.none() | st.sampled_from(SPEEDS) | fz.unicode_text),
        latency_s=draw(st.none() | st.floats(0, allow_infinity=False, allow_nan=False)),
        stop_reason=draw(st.none() | fz.texts(huge=False)),
        tags=draw(tags),
        reported_cost_usd=draw(sometimes(decimals, st.none(), 4)),
        usage_estimated=draw(st.booleans()),
    )
    return ev.encode_event(call)


# --- the target ------------------------------------------------------------------------------------------


@given(model_calls(), st.sampled_from(PRICERS))
def test_every_call_is_a_row_all_of_billing_takes_or_a_clean_data_error(payload: bytes, pricer: Pricer) -> None:
    call = ev.decode_event(payload)  # valid by the schema: it decodes, or the strategy is wrong
    assert isinstance(call, ev.ModelCallCompleted)
    budgets = BudgetTracker(BUDGETS, sink=None)
    projection = BillingProjection(pricer, METRICS, budgets)
    try:
        projection.check(call)
    except InvalidModelCall as exc:
        # The consumer's dead letter: a DataError with a reason.
        assert isinstance(exc, DataError) and str(exc).strip()
        what = str(exc).split(":", 1)[0] if isinstance(exc, UnbillableModelCall) else re.split(r"[\d(]", str(exc))[0]
        event(f"dead letter: {what.strip()}")
        return
    row = projection.row_for(call)
    event(f"row: {row.cost_status}")
    check_row(call, row)
    columns = insert_arguments([row])
    assert len(columns) == 25 and all(len(column) == 1 for column in columns)
    check_budget_step(budgets, row)
    check_metrics(row)
    projection.committed()


def check_row(call: ev.ModelCallCompleted, row: Any) -> None:
    assert row.event_id == call.event_id and row.created_at == call.occurred_at
    # What PostgreSQL's driver does with it; it would store the first and last instants as -infinity, infinity.
    assert datetime.min.replace(tzinfo=UTC) < row.created_at.astimezone(UTC) < datetime.max.replace(tzinfo=UTC)
    usage = row.usage
    for count in (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens, usage.reasoning_tokens):
        assert 0 <= count <= ev.MAX_COUNT
    assert 0 <= usage.cache_write_5m_tokens <= ev.MAX_COUNT and 0 <= usage.cache_write_1h_tokens <= ev.MAX_COUNT
    assert usage.reasoning_tokens <= usage.output_tokens
    assert (row.cost_usd is None) == (row.cost_status == CostStatus.UNPRICED)
    if row.cost_usd is not None:
        assert row.cost_usd.is_finite() and 0 <= row.cost_usd <= MAX_COST_USD
        assert row.cost_usd.as_tuple().exponent == -10, "quantized to 1e-10 USD"
    assert len(set(row.tags)) == len(row.tags) and set(row.tags) == set(call.tags)


def check_budget_step(budgets: BudgetTracker, row: Any) -> None:
    """The budget step as a new period sees it: the spend is this call's; then alerts, as published."""
    deltas = spend_deltas(BUDGETS, [row])
    spent = {key: delta.usd for key, delta in deltas.items()}
    now = datetime.now(UTC)
    alerts = budgets.due_alerts(deltas, spent, now)
    for budget, alert, _ in alerts:
        body, headers = alert_message(alert)
        assert msgspec.json.decode(body, type=BudgetAlert) == alert
        assert headers["ce-subject"] == percent_encode(budget.name)
        assert headers["Nats-Msg-Id"] == headers["ce-id"] == str(alert.event_id)
        if alert.crossed_by_event_id is not None:
            assert alert.crossed_by_event_id == row.event_id
    if alerts:
        event("budget alert")
    budgets.committed(
        BudgetStep(spent=spent, alerted=[(a.budget, a.period_start, alert_percent(a), False) for _, a, _ in alerts])
    )


def check_metrics(row: Any) -> None:
    batch = METRICS.stage([row])
    [totals] = batch.models.values()
    assert totals.tokens == [getattr(row.usage, name) for _, name in TOKEN_TYPES]
    assert totals.cost == (row.cost_usd or 0)
    METRICS.record(batch)
