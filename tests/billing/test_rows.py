"""Pure billing code: event -> priced row, metric labels, budgets' periods and crossings, config, reports.

Every expected cost is computed here from per-million-token prices stated in a comment (the vendors'
published prices, as genai-prices carries them, or the test's own price file), never from the code under test.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from commonos.accounting.cost_queries import TOTAL_LABEL, UNTAGGED_LABEL, CostRow
from commonos.accounting.pricing import Pricer, PriceResult, load_price_file, parse_price_file
from commonos.accounting.usage import TokenUsage, from_anthropic_usage, from_codex_usage, from_openai_usage
from commonos.billing.budgets import (
    BudgetTracker,
    SpendKey,
    alert_for,
    alert_id,
    alert_key,
    is_recent,
    period_bounds,
    spend_deltas,
)
from commonos.billing.config import (
    BillingConfigError,
    Budget,
    MetricsConfig,
    Period,
    parse_billing_config,
)
from commonos.billing.metrics import OTHER, BillingMetrics, LabelCap
from commonos.billing.projection import (
    BillingFault,
    BillingProjection,
    InvalidModelCall,
    UnbillableModelCall,
    build_row,
    check_model_call,
    insert_arguments,
    new_rows,
)
from commonos.billing.report import (
    CostReport,
    GroupBy,
    ReportError,
    parse_group_by,
    parse_when,
    render_report,
)
from commonos.billing.schema import MODEL_CALLS
from commonos.proto.errors import DataError
from commonos.proto.events import ModelCallCompleted
from commonos.proto.ids import new_id

MTOK = Decimal(1_000_000)
AT = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
SESSION = uuid.UUID("01936f3e-0000-7000-8000-000000000001")


def usd(*token_price_pairs: tuple[int, str]) -> Decimal:
    """Sum of tokens x USD-per-million, exact, quantized like a stored cost (1e-10 USD)."""
    total = sum((Decimal(tokens) * Decimal(price) for tokens, price in token_price_pairs), Decimal(0))
    return (total / MTOK).quantize(Decimal("1e-10"))


def call(usage: TokenUsage, provider: str, model: str, **fields: object) -> ModelCallCompleted:
    """A model_call_completed event carrying `usage` (our convention: the converters' output)."""
    defaults: dict[str, object] = {
        "profile_id": "default",
        "session_id": SESSION,
        "turn_id": new_id(),
        "occurred_at": AT,
        "tags": ("client:acme", "team:core"),
        "speed": usage.speed,
        "usage_estimated": usage.usage_estimated,
    }
    return ModelCallCompleted(
        provider=provider,
        model=model,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_5m_tokens=usage.cache_write_5m_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        **(defaults | fields),  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def pricer() -> Pricer:
    return Pricer()


# --- event -> row ----------------------------------------------------------------------------------------


def test_anthropic_row_with_cache_read_and_both_cache_writes(pricer: Pricer) -> None:
    usage = from_anthropic_usage(
        {
            "input_tokens": 1200,
            "cache_read_input_tokens": 50_000,
            "cache_creation_input_tokens": 7000,
            "cache_creation": {"ephemeral_5m_input_tokens": 3000, "ephemeral_1h_input_tokens": 4000},
            "output_tokens": 900,
        }
    )
    event = call(usage, "anthropic", "claude-sonnet-4-5-20250929", request_id="req_1")
    row = build_row(event, pricer)
    # Claude Sonnet 4.5: $3 input, $0.30 cache read, $3.75 5m write, $6 1h write, $15 output (per million).
    assert row.cost_usd == usd((1200, "3"), (50_000, "0.30"), (3000, "3.75"), (4000, "6"), (900, "15"))
    assert (row.cost_status, row.price_source, row.price_detail) == (
        "priced",
        "genai-prices",
        "anthropic/claude-sonnet-4-5",
    )
    assert row.price_version == pricer.genai_version
    assert (
        row.usage.input_tokens,
        row.usage.cache_read_tokens,
        row.usage.cache_write_5m_tokens,
        row.usage.cache_write_1h_tokens,
        row.usage.output_tokens,
    ) == (1200, 50_000, 3000, 4000, 900)
    assert (row.event_id, row.session_id, row.turn_id, row.request_id) == (
        event.event_id,
        SESSION,
        event.turn_id,
        "req_1",
    )
    assert row.created_at == AT  # the call's own time
    assert row.tags == ("client:acme", "team:core")


def test_openai_row_with_cached_input_and_reasoning(pricer: Pricer) -> None:
    usage = from_openai_usage(
        {
            "prompt_tokens": 12_000,
            "completion_tokens": 3000,
            "prompt_tokens_details": {"cached_tokens": 8000},
            "completion_tokens_details": {"reasoning_tokens": 2000},
        }
    )
    row = build_row(call(usage, "openai", "o4-mini"), pricer)
    # o4-mini: $1.10 input, $0.275 cached input, $4.40 output; the 2000 reasoning tokens are inside the 3000.
    assert (
        row.usage.input_tokens,
        row.usage.cache_read_tokens,
        row.usage.output_tokens,
        row.usage.reasoning_tokens,
    ) == (
        4000,
        8000,
        3000,
        2000,
    )
    assert row.cost_usd == usd((4000, "1.10"), (8000, "0.275"), (3000, "4.40")) == Decimal("0.0198000000")


def test_codex_style_row(pricer: Pricer) -> None:
    usage = from_codex_usage(
        {"input_tokens": 24_000, "cached_input_tokens": 20_000, "output_tokens": 1500, "reasoning_output_tokens": 1100}
    )
    row = build_row(call(usage, "codex", "gpt-5-codex"), pricer)
    # gpt-5-codex is priced as GPT-5: $1.25 input, $0.125 cached input, $10 output.
    assert row.cost_usd == usd((4000, "1.25"), (20_000, "0.125"), (1500, "10")) == Decimal("0.0225000000")
    assert (row.provider, row.model, row.price_detail) == ("codex", "gpt-5-codex", "openai/gpt-5")


def test_unknown_model_row_is_unpriced_with_no_cost(pricer: Pricer) -> None:
    row = build_row(call(TokenUsage(input_tokens=10, output_tokens=5), "openai", "gpt-99-imaginary"), pricer)
    assert (row.cost_usd, row.cost_status, row.price_source) == (None, "unpriced", "none")
    assert "gpt-99-imaginary" in row.price_detail


def test_reported_and_estimated_costs(pricer: Pricer) -> None:
    reported = build_row(
        call(TokenUsage(input_tokens=10), "openai", "gpt-99-imaginary", reported_cost_usd=Decimal("0.5")), pricer
    )
    assert (reported.cost_status, reported.cost_usd, reported.reported_cost_usd) == (
        "reported",
        Decimal("0.5000000000"),
        Decimal("0.5"),
    )
    estimated = build_row(
        call(TokenUsage(input_tokens=1000, output_tokens=1000, usage_estimated=True), "anthropic", "claude-haiku-4-5"),
        pricer,
    )
    # Claude Haiku 4.5: $1 input, $5 output.
    assert (estimated.cost_status, estimated.cost_usd, estimated.usage.usage_estimated) == (
        "estimated",
        usd((1000, "1"), (1000, "5")),
        True,
    )


def test_override_file_row_and_price_change_on_a_date(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        '[[price]]\nprovider = "anthropic"\nmodel = "claude-sonnet-4-5"\ninput_mtok = "2"\noutput_mtok = "10"\n'
        'cache_read_mtok = "0.2"\ncache_write_5m_mtok = "2.5"\ncache_write_1h_mtok = "4"\n'
        '[[price]]\nprovider = "scripted"\nmodel = "echo"\neffective_from = 2026-03-01\n'
        'input_mtok = "1"\noutput_mtok = "1"\n'
        '[[price]]\nprovider = "scripted"\nmodel = "echo"\neffective_from = 2026-06-01\n'
        'input_mtok = "2"\noutput_mtok = "3"\n'
    )
    pricer = Pricer(load_price_file(path))
    usage = TokenUsage(
        input_tokens=1000, cache_read_tokens=10_000, cache_write_5m_tokens=2000, cache_write_1h_tokens=3000
    )
    row = build_row(call(usage, "claude-code", "claude-sonnet-4-5"), pricer)
    # The file's prices: $2 input, $0.20 cache read, $2.50 5m write, $4 1h write.
    assert row.cost_usd == usd((1000, "2"), (10_000, "0.2"), (2000, "2.5"), (3000, "4"))
    assert (row.cost_status, row.price_source) == ("override", "override:prices.toml")
    assert row.price_version == load_price_file(path).sha256[:12]
    # scripted/echo: nothing before 2026-03-01, $1/$1 from then, $2/$3 from 2026-06-01.
    million = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)
    costs = [
        build_row(call(million, "scripted", "echo", occurred_at=at), pricer).cost_usd
        for at in (datetime(2026, 2, 28, tzinfo=UTC), AT, datetime(2026, 6, 1, tzinfo=UTC))
    ]
    assert costs == [None, Decimal("2.0000000000"), Decimal("5.0000000000")]


def test_real_price_change_on_a_date(pricer: Pricer) -> None:
    usage = TokenUsage(input_tokens=100_000, output_tokens=10_000)
    # OpenAI cut o3 on 2025-06-10 from $10 / $40 to $2 / $8 per million (UTC date of the call).
    before = build_row(call(usage, "openai", "o3", occurred_at=datetime(2025, 6, 9, 23, 59, tzinfo=UTC)), pricer)
    after = build_row(call(usage, "openai", "o3", occurred_at=datetime(2025, 6, 10, tzinfo=UTC)), pricer)
    assert (before.cost_usd, after.cost_usd) == (
        usd((100_000, "10"), (10_000, "40")),
        usd((100_000, "2"), (10_000, "8")),
    )


def test_duplicate_tags_count_once(pricer: Pricer) -> None:
    row = build_row(call(TokenUsage(), "openai", "o3", tags=("team:core", "client:acme", "team:core")), pricer)
    assert row.tags == ("client:acme", "team:core")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"output_tokens": 10, "reasoning_tokens": 11}, "reasoning_tokens"),
        ({"model": " "}, "provider and its model"),
        ({"reported_cost_usd": Decimal("NaN")}, "reported_cost_usd"),
        ({"reported_cost_usd": Decimal("-1")}, "reported_cost_usd"),
        ({"input_tokens": 2**63}, "64 bits"),
    ],
)
def test_impossible_calls_are_rejected(fields: dict[str, object], message: str) -> None:
    event = ModelCallCompleted(
        **({"profile_id": "default", "session_id": SESSION, "provider": "openai", "model": "o3"} | fields)  # type: ignore[arg-type]
    )
    with pytest.raises(InvalidModelCall, match=message):
        check_model_call(event)


def test_insert_arguments_are_columns_with_tags_as_array_literals(pricer: Pricer) -> None:
    rows = [
        build_row(call(TokenUsage(input_tokens=1), "openai", "o3"), pricer),
        build_row(call(TokenUsage(input_tokens=2), "openai", "o3", tags=()), pricer),
    ]
    columns = insert_arguments(rows)
    names = [c.name for c in MODEL_CALLS.columns]
    assert len(columns) == len(names) == 25
    assert columns[names.index("tags")] == ["{client:acme,team:core}", "{}"]
    assert columns[names.index("input_tokens")] == [1, 2]


def test_new_rows_keeps_each_inserted_event_once(pricer: Pricer) -> None:
    a = build_row(call(TokenUsage(), "openai", "o3"), pricer)
    b = build_row(call(TokenUsage(), "openai", "o3"), pricer)
    assert new_rows([a, b, a], {a.event_id}) == [a]


# --- metrics ---------------------------------------------------------------------------------------------


def test_label_cap_folds_later_values_into_other() -> None:
    cap = LabelCap("model", 2)
    assert [cap(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_by_model_capped_and_by_configured_tag_key(pricer: Pricer) -> None:
    metrics = BillingMetrics(MetricsConfig(tag_label_keys=("client",), max_tag_values=1, max_models=1))
    provider = "metrics-test"
    rows = [
        build_row(call(TokenUsage(input_tokens=3, output_tokens=2, reasoning_tokens=1), provider, "m1"), pricer),
        build_row(call(TokenUsage(input_tokens=5), provider, "m2", tags=("client:globex", "team:core")), pricer),
    ]
    before = {
        "m1_input": sample("cos_billing_tokens_total", {"provider": provider, "model": "m1", "token_type": "input"}),
        "other_unpriced": sample("cos_billing_unpriced_calls_total", {"provider": provider, "model": OTHER}),
        "acme": sample("cos_billing_tag_calls_total", {"tag_key": "client", "tag_value": "acme"}),
    }
    batch = metrics.stage(rows)
    metrics.record(batch)
    assert sample("cos_billing_tokens_total", {"provider": provider, "model": "m1", "token_type": "input"}) == (
        before["m1_input"] + 3
    )
    assert sample("cos_billing_reasoning_tokens_total", {"provider": provider, "model": "m1"}) >= 1
    # The second model is past the cap of one: counted as "other"; both calls are unpriced (unknown provider).
    assert sample("cos_billing_unpriced_calls_total", {"provider": provider, "model": OTHER}) == (
        before["other_unpriced"] + 1
    )
    assert sample("cos_billing_tag_calls_total", {"tag_key": "client", "tag_value": "acme"}) == before["acme"] + 1
    assert sample("cos_billing_tag_calls_total", {"tag_key": "client", "tag_value": OTHER}) >= 1
    # team is not a configured key: never a label.
    assert sample("cos_billing_tag_calls_total", {"tag_key": "team", "tag_value": "core"}) == 0


# --- budgets ---------------------------------------------------------------------------------------------


def test_period_bounds_in_utc() -> None:
    at = datetime.fromisoformat("2026-12-31T23:30:00-02:00")  # 2027-01-01 01:30 UTC
    assert period_bounds(Period.MONTH, at) == (datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 2, 1, tzinfo=UTC))
    assert period_bounds(Period.DAY, at) == (datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 1, 2, tzinfo=UTC))
    assert period_bounds(Period.MONTH, datetime(2026, 12, 5)) == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )


def test_only_current_and_previous_periods_are_alerted() -> None:
    now = datetime(2026, 3, 15, tzinfo=UTC)
    assert is_recent(Period.MONTH, datetime(2026, 3, 1, tzinfo=UTC), now)
    assert is_recent(Period.MONTH, datetime(2026, 2, 1, tzinfo=UTC), now)
    assert not is_recent(Period.MONTH, datetime(2026, 1, 1, tzinfo=UTC), now)
    assert not is_recent(Period.DAY, datetime(2026, 3, 13, tzinfo=UTC), now)


def test_spend_deltas_and_the_call_that_crossed(pricer: Pricer) -> None:
    budgets = [
        Budget("acme", "client:acme", Period.MONTH, Decimal("1")),
        Budget("acme-day", "client:acme", Period.DAY, Decimal("1")),
    ]
    million = TokenUsage(input_tokens=1_000_000)  # $1.10 on o4-mini
    rows = [
        build_row(call(million, "openai", "o4-mini", occurred_at=AT), pricer),
        build_row(call(million, "openai", "o4-mini", occurred_at=AT, tags=("client:globex",)), pricer),
        build_row(call(million, "openai", "gpt-99-imaginary", occurred_at=AT), pricer),
        build_row(call(million, "openai", "o4-mini", occurred_at=datetime(2026, 5, 2, tzinfo=UTC)), pricer),
    ]
    deltas = spend_deltas(budgets, rows)
    month = SpendKey("client:acme", Period.MONTH, datetime(2026, 5, 1, tzinfo=UTC))
    assert (deltas[month].usd, deltas[month].calls) == (Decimal("2.2"), 3)  # the unpriced call adds a call, no USD
    assert deltas[SpendKey("client:acme", Period.DAY, datetime(2026, 5, 2, tzinfo=UTC))].usd == Decimal("1.1")
    assert len(deltas) == 3
    # Spend before this batch was $0.50: the first call (to $1.60) crossed the $1 limit.
    alert = alert_for(budgets[0], month, datetime(2026, 6, 1, tzinfo=UTC), Decimal("2.7"), deltas[month], AT)
    assert alert.crossed_by_event_id == rows[0].event_id
    assert (alert.spent_usd, alert.limit_usd, alert.budget, alert.tag) == (
        Decimal("2.7"),
        Decimal("1"),
        "acme",
        "client:acme",
    )
    again = alert_for(budgets[0], month, datetime(2026, 6, 1, tzinfo=UTC), Decimal("3"), None, AT)
    assert again.alert_id == alert.alert_id == alert.event_id  # derived from budget and period only
    assert alert_key(budgets[0], month.period_start) == "cos-budget-alert:acme:month:2026-05-01T00:00Z"
    assert alert.event_id == alert_id(budgets[0], month.period_start)


# --- config ----------------------------------------------------------------------------------------------


def test_billing_config_example() -> None:
    config = parse_billing_config(
        b'[[budget]]\ntag = "client:acme"\nperiod = "month"\nlimit_usd = "100"\n'
        b'[[budget]]\ntag = "client:acme"\nperiod = "day"\nlimit_usd = 7.5\nname = "acme-daily"\n'
        b'[metrics]\ntag_label_keys = ["client"]\nmax_models = 10\n',
        name="billing.toml",
    )
    assert config.budgets == (
        Budget("client:acme/month", "client:acme", Period.MONTH, Decimal("100")),
        Budget("acme-daily", "client:acme", Period.DAY, Decimal("7.5")),
    )
    assert config.metrics == MetricsConfig(tag_label_keys=("client",), max_models=10)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[budget]\n", "billing.toml: invalid TOML"),
        ("[[budget]]\nperiod = 'day'\nlimit_usd = 1\n", "budget[0].tag: required key missing"),
        ("[[budget]]\ntag = 'Client:acme'\nlimit_usd = 1\n", "upper case in the key"),
        ("[[budget]]\ntag = 'client:acme'\nperiod = 'week'\nlimit_usd = 1\n", "budget[0].period: invalid enum value"),
        ("[[budget]]\ntag = 'client:acme'\nlimit_usd = 'lots'\n", "budget[0].limit_usd: invalid decimal string"),
        ("[[budget]]\ntag = 'client:acme'\nlimit_usd = 0\n", "budget[0].limit_usd: must be a positive number"),
        (
            "[[budget]]\ntag = 'client:acme'\nlimit_usd = 1\n[[budget]]\ntag = 'client:acme'\nlimit_usd = 2\n",
            "already has a month budget",
        ),
        ("[metrics]\ntag_label_keys = ['Client']\n", "tag key 'Client' is not valid"),
        ("[metrics]\nmax_models = 0\n", "metrics.max_models: must be a whole number"),
        ("[budgets]\n", "budgets: unknown key"),
        ("[[budget]]\ntag = 'client:acme'\nlimit_usd = 1\nlimit = 2\n", "budget[0].limit: unknown key"),
    ],
)
def test_bad_billing_config(text: str, message: str) -> None:
    with pytest.raises(BillingConfigError) as caught:
        parse_billing_config(text.encode(), name="billing.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("billing.toml: ")
    assert "\n" not in str(caught.value)


# --- reports ---------------------------------------------------------------------------------------------


def test_group_by_and_time_arguments() -> None:
    assert parse_group_by("tag:client") == GroupBy("tag", "client")
    assert parse_group_by("day") == GroupBy("day")
    with pytest.raises(ReportError, match="tag:<key>, model, provider, day or profile"):
        parse_group_by("week")
    with pytest.raises(ReportError, match="a tag key is"):
        parse_group_by("tag:Client")
    now = datetime(2026, 11, 30, 12, tzinfo=UTC)
    assert parse_when("2026-11-01") == datetime(2026, 11, 1, tzinfo=UTC)
    assert parse_when("2026-11-01T08:00:00") == datetime(2026, 11, 1, 8, tzinfo=UTC)
    assert parse_when("7d", now) == datetime(2026, 11, 23, 12, tzinfo=UTC)
    with pytest.raises(ReportError, match="is not a date"):
        parse_when("yesterday")


def _row(group: str | None, usd: str | None, calls: int, label: str | None = None) -> CostRow:
    price = Decimal(usd) if usd else None
    return CostRow(group, label or group or "", price, calls, 0 if usd else calls, 10, 5, 0, 0, 1)


def test_report_renders_groups_untagged_total_and_the_counting_rule() -> None:
    report = CostReport(
        group_by=GroupBy("tag", "client"),
        since=datetime(2026, 11, 1, tzinfo=UTC),
        until=None,
        groups=[_row("client:acme", "1.5000000000", 2), _row("client:globex", "0.5000000000", 1)],
        total=_row(None, "1.7500000000", 3, TOTAL_LABEL),
        untagged=_row(None, None, 1, UNTAGGED_LABEL),
        notes=["Each call is counted once in every client: group it carries ..."],
    )
    table = render_report(report, "table")
    assert "client:acme" in table and "(none)" in table and "(total: each call once)" in table
    assert "Note: Each call is counted once" in table
    as_json = json.loads(render_report(report, "json"))
    assert as_json["groups"][0] == {
        "group": "client:acme",
        "usd": "1.5000000000",
        "calls": 2,
        "unpriced_calls": 0,
        "input_tokens": 10,
        "output_tokens": 5,
        "reasoning_tokens": 1,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
    }
    assert as_json["untagged"]["usd"] is None and as_json["total"]["calls"] == 3
    lines = render_report(report, "csv").splitlines()
    assert lines[0].startswith("tag:client,usd,calls,unpriced")
    assert lines[1].startswith("client:acme,1.5000000000,2,0")
    assert lines[-2].startswith("(none),,1,1") and lines[-1].startswith("(total: each call once),1.7500000000,3")


# --- calls billing cannot handle -------------------------------------------------------------------------

DEAR_PRICES = b"""
[[price]]
model = "dear-*"
input_mtok = "1000000"
output_mtok = "1000000"
"""
EDGE_BUDGETS = (
    Budget("acme-day", "client:acme", Period.DAY, Decimal(1)),
    Budget("core-month", "team:core", Period.MONTH, Decimal(1)),
)


def edge_projection(pricer: Pricer | None = None) -> BillingProjection:
    pricer = pricer or Pricer(parse_price_file(DEAR_PRICES, name="dear.toml"))
    return BillingProjection(pricer, BillingMetrics(), BudgetTracker(EDGE_BUDGETS, sink=None))


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.parametrize(
    ("provider", "model", "usage", "occurred_at", "tags", "error", "reason"),
    [
        # Issue #14 (pricing met it first): no UTC time, so no row either, priced or not.
        ("anthropic", "claude-sonnet-4-5", TokenUsage(input_tokens=1), "9999-12-31T23:59:59-01:00", (),
         InvalidModelCall, "occurred_at 9999-12-31T23:59:59-01:00 is after the year 9999 in UTC: no row can hold it"),
        ("anthropic", "claude-sonnet-4-5", TokenUsage(input_tokens=1), "0001-01-01T00:00:00+01:00", (),
         InvalidModelCall, "occurred_at 0001-01-01T00:00:00+01:00 is before the year 1 in UTC: no row can hold it"),
        ("scripted", "echo", TokenUsage(), "9999-12-31T23:59:59.999999-00:01", (),
         InvalidModelCall, "occurred_at 9999-12-31T23:59:59.999999-00:01 is after the year 9999"),
        # The first and the last instant: PostgreSQL's driver (asyncpg) would store them as -infinity, infinity.
        ("openai", "o3", TokenUsage(), "0001-01-01T00:00:00+00:00", (),
         InvalidModelCall, "occurred_at 0001-01-01T00:00:00+00:00 is the first instant of time, which a row holds "
                           "as -infinity"),
        ("openai", "o3", TokenUsage(), "9999-12-31T22:59:59.999999-01:00", (),
         InvalidModelCall, "occurred_at 9999-12-31T22:59:59.999999-01:00 is the last instant of time, which a row "
                           "holds as infinity"),
        # A time a row holds, but a budgeted period of it ends after the year 9999.
        ("openai", "o3", TokenUsage(), "9999-12-31T00:00:00+00:00", ("client:acme",),
         UnbillableModelCall, "budgets: OverflowError: the day 9999-12-31 ends after the year 9999"),
        ("openai", "o3", TokenUsage(), "9999-12-01T00:00:00+00:00", ("team:core",),
         UnbillableModelCall, "budgets: OverflowError: the month 9999-12 ends after the year 9999"),
        # $1 a token: 2^63 - 1 tokens are priced exactly, and cost more than model_calls.cost_usd holds.
        ("ollama", "dear-1", TokenUsage(input_tokens=2**63 - 1), "2026-05-01T00:00:00+00:00", (),
         UnbillableModelCall, "pricing: the cost 9223372036854775807.0000000000 USD does not fit model_calls.cost_usd"),
    ],
)  # fmt: skip
def test_a_call_billing_cannot_handle_is_a_data_error_of_that_call(
    provider: str,
    model: str,
    usage: TokenUsage,
    occurred_at: str,
    tags: tuple[str, ...],
    error: type[InvalidModelCall],
    reason: str,
) -> None:
    event = call(usage, provider, model, occurred_at=at(occurred_at), tags=tags)
    projection = edge_projection()
    with pytest.raises(error) as raised:
        projection.check(event)
    assert type(raised.value) is error and isinstance(raised.value, DataError)  # what the consumer dead-letters
    assert str(raised.value).startswith(reason)


@pytest.mark.parametrize(
    ("occurred_at", "tags"),
    [
        ("9999-12-31T23:59:59.999998+00:00", ()),  # the last UTC time a row holds, with no budget on the call
        ("9999-11-30T23:00:00-00:59", ("client:acme", "team:core")),  # 9999-11-30T23:59Z: both periods end in 9999
        ("0001-01-01T00:00:00-01:00", ("client:acme", "team:core")),
        ("0001-01-01T00:00:00.000001+00:00", ("client:acme", "team:core")),
    ],
)
def test_calls_at_the_edges_of_time_are_billed(occurred_at: str, tags: tuple[str, ...]) -> None:
    event = call(TokenUsage(input_tokens=1000, output_tokens=10), "anthropic", "claude-sonnet-4-5",
                 occurred_at=at(occurred_at), tags=tags)  # fmt: skip
    projection = edge_projection()
    projection.check(event)
    row = projection.row_for(event)
    # Claude Sonnet 4.5: $3 input, $15 output.
    assert (row.created_at, row.cost_usd) == (event.occurred_at, usd((1000, "3"), (10, "15")))


def test_the_dearest_valid_call_that_fits_is_priced_exactly() -> None:
    # Every bucket at 2^63 - 1 tokens, at $1 per million ($1e-6 per token): about $4.6e13, below 10^14.
    most = 2**63 - 1
    usage = TokenUsage(
        input_tokens=most,
        output_tokens=most,
        reasoning_tokens=most,
        cache_read_tokens=most,
        cache_write_5m_tokens=most,
        cache_write_1h_tokens=most,
    )
    price_file = parse_price_file(b'[[price]]\nmodel = "m"\ninput_mtok = "1"\noutput_mtok = "1"\n', name="p.toml")
    row = edge_projection(Pricer(price_file)).bill(call(usage, "ollama", "m", tags=()))
    assert row.cost_usd == Decimal(5 * most).scaleb(-6).quantize(Decimal("1e-10"))


class FaultyPricer(Pricer):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def price(
        self, provider: str, model: str, usage: TokenUsage, at: datetime, reported_cost_usd: Decimal | None = None
    ) -> PriceResult:
        raise self.error


def test_a_bug_in_pricing_is_not_taken_for_the_calls_fault() -> None:
    event = call(TokenUsage(input_tokens=1), "openai", "o3")
    # A ValueError from billing's own code would be dead-lettered by the consumer: it stops billing instead.
    with pytest.raises(BillingFault, match="pricing raised ValueError on a valid call: a bug") as raised:
        edge_projection(FaultyPricer(ValueError("a bug"))).check(event)
    assert not isinstance(raised.value, ValueError)
    with pytest.raises(KeyError):
        edge_projection(FaultyPricer(KeyError("a bug"))).check(event)
    # Out of range is the call's: a decimal signal, an overflow.
    with pytest.raises(UnbillableModelCall, match=r"pricing: decimal arithmetic failed .*\(InvalidOperation\)"):
        edge_projection(FaultyPricer(InvalidOperation())).check(event)
    with pytest.raises(UnbillableModelCall, match="pricing: OverflowError: too far"):
        edge_projection(FaultyPricer(OverflowError("too far"))).check(event)


def test_apply_uses_the_row_check_built() -> None:
    projection = edge_projection()
    event = call(TokenUsage(input_tokens=1), "openai", "o3")
    projection.check(event)
    checked = projection.row_for(event)
    assert checked is projection.row_for(event)  # the same row object: priced once
    projection.committed()
    assert projection.row_for(event) is not checked and projection.row_for(event) == checked


def test_period_bounds_at_the_end_of_time() -> None:
    assert period_bounds(Period.MONTH, datetime(9999, 11, 30, 23, tzinfo=UTC)) == (
        datetime(9999, 11, 1, tzinfo=UTC),
        datetime(9999, 12, 1, tzinfo=UTC),
    )
    assert period_bounds(Period.DAY, datetime(9999, 12, 30, tzinfo=UTC))[1] == datetime(9999, 12, 31, tzinfo=UTC)
    assert period_bounds(Period.DAY, datetime(1, 1, 1, tzinfo=UTC)) == (
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 2, tzinfo=UTC),
    )
    with pytest.raises(OverflowError, match="the month 9999-12 ends after the year 9999"):
        period_bounds(Period.MONTH, datetime(9999, 12, 1, tzinfo=UTC))
    with pytest.raises(OverflowError, match="the day 9999-12-31 ends after the year 9999"):
        period_bounds(Period.DAY, datetime(9999, 12, 31, tzinfo=UTC))
