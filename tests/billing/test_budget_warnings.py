"""Budget thresholds below the limit (``warn_at``): configuration, ids, projection, and alerts on real servers."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from commonos.billing.budgets import alert_id, period_bounds, projected_exhaustion
from commonos.billing.config import BillingConfig, BillingConfigError, Budget, parse_billing_config
from commonos.proto import events as ev
from commonos.proto.alerts import Period
from commonos.proto.ids import new_id
from commonos.proto.subjects import ALERTS_BUDGET
from commonos.runtime.postgres import connect
from tests.billing.support import POSITIONS, billing, publish_copies, recent_start, stored_alerts
from tests.factories import Clock
from tests.support import ServiceProcess, publish_all, wait_for_position


def test_warn_at_is_read_sorted_and_defaults_to_none() -> None:
    config = parse_billing_config(
        b'[[budget]]\ntag = "client:acme"\nlimit_usd = "100"\nwarn_at = [80, 50]\n'
        b'[[budget]]\ntag = "client:acme"\nperiod = "day"\nlimit_usd = 5\n',
        name="billing.toml",
    )
    assert config.budgets == (
        Budget("client:acme/month", "client:acme", Period.MONTH, Decimal("100"), warn_at=(50, 80)),
        Budget("client:acme/day", "client:acme", Period.DAY, Decimal("5")),
    )
    assert config.budgets[1].warn_at == ()


@pytest.mark.parametrize(
    ("warn_at", "message"),
    [
        ("[0]", "budget[0].warn_at: each percent must be a whole number from 1 to 99, got 0"),
        ("[50, 100]", "budget[0].warn_at: each percent must be a whole number from 1 to 99, got 100"),
        ("[-5]", "budget[0].warn_at: each percent must be a whole number from 1 to 99, got -5"),
        ("[50, 80, 50]", "budget[0].warn_at: 50 appears more than once"),
        ("[50.5]", "budget[0].warn_at[0]: "),
        ("'50'", "budget[0].warn_at: "),
    ],
)
def test_bad_warn_at_is_one_line_naming_the_key(warn_at: str, message: str) -> None:
    text = f"[[budget]]\ntag = 'client:acme'\nlimit_usd = 1\nwarn_at = {warn_at}\n"
    with pytest.raises(BillingConfigError) as caught:
        parse_billing_config(text.encode(), name="billing.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("billing.toml: ")
    assert "\n" not in str(caught.value)


# --- on real servers ----------------------------------------------------------------------------------------

#: o4-mini: $1.10 per million input tokens, so each call below costs $1.10.
CALL_USD = Decimal("1.10")


def calls(tag: str, clock: Clock, n: int) -> list[ev.ModelCallCompleted]:
    return [
        ev.ModelCallCompleted(
            profile_id="default",
            session_id=new_id(),
            turn_id=new_id(),
            provider="openai",
            model="o4-mini",
            tags=(tag,),
            occurred_at=clock.tick(),
            input_tokens=10**6,
        )
        for _ in range(n)
    ]


def unique_tag() -> str:
    return f"client:w{uuid.uuid4().hex[:8]}"


def percent_of(alert: dict[str, Any]) -> int:
    return int(alert["percent"]) if alert["type"] == "budget_warning" else 100


def expected_projection(alert: dict[str, Any]) -> datetime | None:
    """When the limit is reached at the period's rate when the alert was made: spend / time since period start."""
    at = datetime.fromisoformat(alert["occurred_at"])
    start = datetime.fromisoformat(alert["period_start"])
    spent, limit = Decimal(alert["spent_usd"]), Decimal(alert["limit_usd"])
    if spent >= limit:
        return None
    elapsed_us = (at - start) // timedelta(microseconds=1)
    return at + timedelta(microseconds=int((limit - spent) * elapsed_us / spent))


def check_warning(alert: dict[str, Any], started: datetime) -> None:
    assert alert["msg_id"] == alert["ce_id"] == alert["event_id"]
    assert alert["ce_dataschema"] == "https://commonos.dev/schemas/alerts/budget_warning/v1.json"
    assert alert["subject"] == ALERTS_BUDGET
    at = datetime.fromisoformat(alert["occurred_at"])
    assert started <= at <= datetime.now(UTC)
    projected = alert["projected_exhausted_at"]
    expected = expected_projection(alert)
    if expected is None:
        assert projected is None
    else:
        assert projected is not None
        assert abs(datetime.fromisoformat(projected) - expected) <= timedelta(milliseconds=1)
        assert datetime.fromisoformat(projected) > at


def warning_count(budget: str, percent: int) -> float:
    return (
        REGISTRY.get_sample_value("cos_billing_budget_warnings_total", {"budget": budget, "percent": str(percent)})
        or 0.0
    )


async def test_warnings_at_50_and_80_and_the_limit_arrive_once_each_across_restarts(
    nats_url: str, database_url: str
) -> None:
    started = datetime.now(UTC)
    tag = unique_tag()
    month = f"m-{uuid.uuid4().hex[:6]}"
    day = f"d-{uuid.uuid4().hex[:6]}"
    config = BillingConfig(
        budgets=(
            Budget(month, tag, Period.MONTH, Decimal("10"), warn_at=(50, 80)),
            Budget(day, tag, Period.DAY, Decimal("2"), warn_at=(50, 80)),  # the first batch crosses all three
        )
    )
    before = {p: warning_count(month, p) for p in (50, 80)}
    clock = Clock(now=recent_start())
    first, second, third = calls(tag, clock, 5), calls(tag, clock, 3), calls(tag, clock, 2)  # $5.50, $8.80, $11

    acks = await publish_all(nats_url, first)
    async with billing(nats_url, database_url, config):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    mine = [a for a in await stored_alerts(nats_url) if a["budget"] == month]
    assert [percent_of(a) for a in mine] == [50]
    acks = await publish_all(nats_url, second)
    async with billing(nats_url, database_url, config):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    acks = await publish_all(nats_url, third)
    acks += await publish_copies(nats_url, first + second, copy=2)  # delivered again: no alert repeats
    async with billing(nats_url, database_url, config):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)

    alerts = await stored_alerts(nats_url)
    mine = [a for a in alerts if a["budget"] == month]
    assert [(a["type"], percent_of(a)) for a in mine] == [
        ("budget_warning", 50),
        ("budget_warning", 80),
        ("budget_exceeded", 100),
    ]
    month_start = datetime.fromisoformat(mine[0]["period_start"])
    for alert, crossing, spent in zip(mine, (first[4], second[2], third[1]), (5, 8, 10), strict=True):
        assert alert["crossed_by_event_id"] == str(crossing.event_id)
        assert Decimal(alert["spent_usd"]) == CALL_USD * spent
        assert (alert["tag"], alert["limit_usd"]) == (tag, "10")
        assert datetime.fromisoformat(alert["period_start"]) == month_start
    for alert in mine[:2]:
        check_warning(alert, started)
    assert mine[0]["event_id"] != mine[1]["event_id"]
    assert [Decimal(a["spent_usd"]) for a in mine[:2]] == [Decimal("5.50"), Decimal("8.80")]
    assert all(a["projected_exhausted_at"] is not None for a in mine[:2])  # spend below the limit, rate > 0

    # One batch past 50, 80 and 100 % of the day budget: all three, in ascending order, the warnings without a
    # projection (the limit is already reached).
    daily = [a for a in alerts if a["budget"] == day]
    assert [(a["type"], percent_of(a)) for a in daily] == [
        ("budget_warning", 50),
        ("budget_warning", 80),
        ("budget_exceeded", 100),
    ]
    for alert in daily[:2]:
        check_warning(alert, started)
        assert alert["projected_exhausted_at"] is None

    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT percent, published, alert_id FROM budget_alerts WHERE budget = $1 ORDER BY percent", month
        )
    finally:
        await conn.close()
    assert [(r["percent"], r["published"], str(r["alert_id"])) for r in rows] == [
        (percent_of(a), True, a["event_id"]) for a in mine
    ]
    assert {p: warning_count(month, p) - before[p] for p in (50, 80)} == {50: 1, 80: 1}


async def test_warnings_survive_sigkill_and_redelivery(nats_url: str, database_url: str, tmp_path: Path) -> None:
    started = datetime.now(UTC)
    tag = unique_tag()
    name = f"k-{uuid.uuid4().hex[:6]}"
    (tmp_path / "billing.toml").write_text(
        f'[[budget]]\nname = "{name}"\ntag = "{tag}"\nperiod = "month"\nlimit_usd = "10"\nwarn_at = [80, 50]\n'
    )
    clock = Clock(now=recent_start())
    first, second = calls(tag, clock, 6), calls(tag, clock, 4)  # $6.60 (50 %), then $11 (80 % and 100 %)
    env = {
        "COS_NATS_URL": nats_url,
        "COS_DATABASE_URL": database_url,
        "COS_BILLING_CONFIG": str(tmp_path / "billing.toml"),
    }
    service = ServiceProcess("commonos.billing", env, tmp_path / "billing.log")
    try:
        acks = await publish_all(nats_url, first)
        service.start()
        await wait_for_position(database_url, "billing", acks[-1].seq, timeout_s=60, table=POSITIONS)
        service.kill()
        acks = await publish_copies(nats_url, first, copy=2)
        acks += await publish_all(nats_url, second)
        service.start()
        await wait_for_position(database_url, "billing", acks[-1].seq, timeout_s=60, table=POSITIONS)
        service.kill()
        acks = await publish_copies(nats_url, first + second, copy=3)
        service.start()
        await wait_for_position(database_url, "billing", acks[-1].seq, timeout_s=60, table=POSITIONS)
        assert service.terminate() == 0
    finally:
        if service.alive:
            service.kill()
    mine = [a for a in await stored_alerts(nats_url) if a["budget"] == name]
    assert [(a["type"], percent_of(a)) for a in mine] == [
        ("budget_warning", 50),
        ("budget_warning", 80),
        ("budget_exceeded", 100),
    ]
    assert mine[0]["crossed_by_event_id"] == str(first[4].event_id)
    assert mine[1]["crossed_by_event_id"] == str(second[1].event_id)
    assert Decimal(mine[0]["spent_usd"]) == Decimal("6.60")
    for alert in mine[:2]:
        check_warning(alert, started)


#: budget_alerts as the schema made it before warnings.
OLD_BUDGET_ALERTS = """
CREATE TABLE budget_alerts (
    budget text NOT NULL,
    period_start timestamptz NOT NULL,
    period_end timestamptz NOT NULL,
    period text NOT NULL,
    tag text NOT NULL,
    limit_usd numeric NOT NULL,
    spent_usd numeric NOT NULL,
    alert_id uuid NOT NULL,
    crossed_by_event_id uuid,
    published boolean NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (budget, period_start)
);
"""


async def test_an_old_budget_alerts_table_is_migrated_and_its_alerts_do_not_repeat(
    nats_url: str, database_url: str
) -> None:
    tag = unique_tag()
    name = f"o-{uuid.uuid4().hex[:6]}"
    budget = Budget(name, tag, Period.MONTH, Decimal("2"), warn_at=(50,))
    clock = Clock(now=recent_start())
    batch = calls(tag, clock, 3)  # $3.30: 50 % and 100 %
    month_start, month_end = period_bounds(Period.MONTH, batch[0].occurred_at)
    the_id = alert_id(budget, month_start)
    conn = await connect(database_url)
    try:
        await conn.execute(OLD_BUDGET_ALERTS)
        await conn.execute(
            "INSERT INTO budget_alerts VALUES ($1, $2, $3, 'month', $4, 2, 2.2, $5, NULL, true)",
            name,
            month_start,
            month_end,
            tag,
            the_id,
        )
    finally:
        await conn.close()

    acks = await publish_all(nats_url, batch)
    async with billing(nats_url, database_url, BillingConfig(budgets=(budget,))):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    # Applied again (a second start): nothing changes.
    async with billing(nats_url, database_url, BillingConfig(budgets=(budget,))):
        pass

    mine = [a for a in await stored_alerts(nats_url) if a["budget"] == name]
    assert [(a["type"], percent_of(a)) for a in mine] == [("budget_warning", 50)]  # the limit's was sent before
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT percent, alert_id, spent_usd FROM budget_alerts WHERE budget = $1 ORDER BY percent", name
        )
        key = await conn.fetchval(
            "SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_constraint c "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) "
            "WHERE c.conrelid = 'budget_alerts'::regclass AND c.contype = 'p'"
        )
    finally:
        await conn.close()
    assert [(r["percent"], r["alert_id"], r["spent_usd"]) for r in rows] == [
        (50, uuid.UUID(mine[0]["event_id"]), Decimal("3.30")),
        (100, the_id, Decimal("2.2")),  # the old row, kept
    ]
    assert sorted(key) == ["budget", "percent", "period_start"]


def test_ids_the_limit_keeps_and_the_warnings_get() -> None:
    budget = Budget("acme-monthly", "client:acme", Period.MONTH, Decimal("100"), warn_at=(80,))
    start = datetime(2026, 11, 1, tzinfo=UTC)
    namespace = uuid.UUID("5b0f3c1e-8f0e-4d3a-9b7a-63e0c0b1d9a2")
    assert alert_id(budget, start) == uuid.uuid5(namespace, "cos-budget-alert:acme-monthly:month:2026-11-01T00:00Z")
    assert alert_id(budget, start, 100) == alert_id(budget, start)
    assert alert_id(budget, start, 80) == uuid.uuid5(
        namespace, "cos-budget-alert:acme-monthly:month:2026-11-01T00:00Z:80"
    )


def test_projection_follows_the_rate_and_may_fall_after_the_period() -> None:
    start = datetime(2026, 11, 1, tzinfo=UTC)
    ten_days = start + timedelta(days=10)
    # $50 in 10 days: $100 after 20 days.
    assert projected_exhaustion(Decimal("100"), Decimal("50"), start, ten_days) == start + timedelta(days=20)
    # $10 in 10 days: $100 after 100 days, past the month's end, kept as computed.
    assert projected_exhaustion(Decimal("100"), Decimal("10"), start, ten_days) == start + timedelta(days=100)
    assert projected_exhaustion(Decimal("100"), Decimal("0"), start, ten_days) is None
    assert projected_exhaustion(Decimal("100"), Decimal("100"), start, ten_days) is None
