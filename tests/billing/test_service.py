"""Billing on real servers: model_calls rows, the seed's cost query, reports, repricing, budgets, poison."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import random
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import msgspec
import nats
import pytest
from prometheus_client import REGISTRY

from commonos.accounting.pricing import Pricer, load_price_file
from commonos.billing.config import BillingConfig, Budget, Period
from commonos.billing.report import GroupBy, cost_report
from commonos.billing.reprice import reprice
from commonos.billing.service import (
    NatsAlertSink,
    apply_billing_schemas,
    billing_schemas,
)
from commonos.journal_writer.schema import SCHEMA as CORE_SCHEMA
from commonos.proto import events as ev
from commonos.proto.alerts import BudgetExceeded
from commonos.proto.ids import new_id
from commonos.proto.subjects import ALERTS_BUDGET, ALERTS_STREAM, DLQ_STREAM, subject_for
from commonos.runtime.nats import alerts_stream_config, ensure_stream
from commonos.runtime.postgres import apply_schemas, connect
from tests.billing.raw_costs import days_of_calls, stored_days
from tests.billing.support import (
    POSITIONS,
    billing,
    publish_copies,
    recent_start,
    run_cli,
    stored_alerts,
    this_month_start,
    usd,
)
from tests.factories import Clock, conversation
from tests.support import publish_all, wait_for_position

COST_PER_CLIENT = """
SELECT tag, sum(cost_usd) AS usd, count(*) AS calls
FROM model_calls, unnest(tags) AS tag
WHERE tag LIKE 'client:%' AND created_at >= date_trunc('month', now())
GROUP BY tag
ORDER BY usd DESC;
"""


def model_call(
    at: datetime,
    model: str = "o4-mini",
    provider: str = "openai",
    tags: tuple[str, ...] = ("client:acme",),
    profile_id: str = "default",
    session_id: uuid.UUID | None = None,
    **tokens: int,
) -> ev.ModelCallCompleted:
    return ev.ModelCallCompleted(
        profile_id=profile_id,
        session_id=session_id or new_id(),
        turn_id=new_id(),
        provider=provider,
        model=model,
        tags=tags,
        occurred_at=at,
        **tokens,  # type: ignore[arg-type]
    )


def unpriced_count(model: str) -> float:
    return REGISTRY.get_sample_value("cos_billing_unpriced_calls_total", {"provider": "openai", "model": model}) or 0.0


async def test_rows_the_seed_query_and_the_cost_report(
    nats_url: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = recent_start()
    clock = Clock(now=start)
    rng_events: list[ev.Event] = []
    rng = random.Random(3)
    for _ in range(6):  # whole conversations: billing must take only their model calls
        rng_events += conversation(rng, clock, tags=(f"client:{rng.choice(['acme', 'globex'])}", "team:core"))
    extra = [
        # Anthropic with cache read and both cache writes; in two client groups at once.
        model_call(
            clock.tick(),
            "claude-sonnet-4-5",
            "anthropic",
            ("client:acme", "client:globex"),
            input_tokens=1200,
            cache_read_tokens=50_000,
            cache_write_5m_tokens=3000,
            cache_write_1h_tokens=4000,
            output_tokens=900,
        ),
        model_call(clock.tick(), tags=(), input_tokens=1000),  # no tag at all
        model_call(clock.tick(), "gpt-99-imaginary", tags=("client:initech",), input_tokens=5),  # unpriced
        model_call(this_month_start() - timedelta(days=1), input_tokens=10**6),  # last month: not in "this month"
    ]
    events = rng_events + extra
    calls = [e for e in events if isinstance(e, ev.ModelCallCompleted)]
    unpriced_before = unpriced_count("gpt-99-imaginary")
    acks = await publish_all(nats_url, events)
    last_call_seq = max(a.seq for a, e in zip(acks, events, strict=True) if isinstance(e, ev.ModelCallCompleted))
    async with billing(nats_url, database_url):
        await wait_for_position(database_url, "billing", last_call_seq, table=POSITIONS)
    assert unpriced_count("gpt-99-imaginary") == unpriced_before + 1

    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM model_calls") == len(calls)
        row = await conn.fetchrow("SELECT * FROM model_calls WHERE event_id = $1", extra[0].event_id)
        assert row is not None
        # Claude Sonnet 4.5: $3 input, $0.30 cache read, $3.75 5m write, $6 1h write, $15 output.
        assert row["cost_usd"] == usd((1200, "3"), (50_000, "0.30"), (3000, "3.75"), (4000, "6"), (900, "15"))
        assert dict(row) | {"recorded_at": None} == {
            "event_id": extra[0].event_id,
            "profile_id": "default",
            "session_id": extra[0].session_id,
            "turn_id": extra[0].turn_id,
            "request_id": None,
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "input_tokens": 1200,
            "output_tokens": 900,
            "cache_read_tokens": 50_000,
            "cache_write_5m_tokens": 3000,
            "cache_write_1h_tokens": 4000,
            "reasoning_tokens": 0,
            "speed": None,
            "latency_s": None,
            "stop_reason": None,
            "usage_estimated": False,
            "reported_cost_usd": None,
            "cost_usd": row["cost_usd"],
            "cost_status": "priced",
            "price_source": "genai-prices",
            "price_version": Pricer().genai_version,
            "price_detail": "anthropic/claude-sonnet-4-5",
            "tags": ["client:acme", "client:globex"],
            "created_at": extra[0].occurred_at,  # the call's own time
            "recorded_at": None,
            "repriced_at": None,
        }
        unpriced = await conn.fetchrow(
            "SELECT cost_usd, cost_status FROM model_calls WHERE event_id = $1", extra[2].event_id
        )
        assert unpriced is not None and tuple(unpriced) == (None, "unpriced")
        assert "gin (tags)" in await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'model_calls_tags'"
        )

        seed = {r["tag"]: (r["usd"], r["calls"]) for r in await conn.fetch(COST_PER_CLIENT)}
        this_month = [c for c in calls if c.occurred_at >= this_month_start()]
        expected_calls: dict[str, int] = {}
        for c in this_month:
            for tag in c.tags:
                if tag.startswith("client:"):
                    expected_calls[tag] = expected_calls.get(tag, 0) + 1
        assert {tag: n for tag, (_, n) in seed.items()} == expected_calls
        assert seed["client:initech"] == (None, 1)

        report = await cost_report(conn, GroupBy("tag", "client"))
        assert {r.group: (r.usd, r.calls) for r in report.groups} == seed
        assert report.total.calls == len(this_month)  # each call once
        # Groups count the two-client call twice and miss the untagged one: here they happen to cancel out.
        assert sum(r.calls for r in report.groups) == len(this_month)
        assert sum(r.usd or 0 for r in report.groups) > (report.total.usd or 0)
        assert report.untagged is not None and report.untagged.calls == 1
        assert report.total.unpriced_calls == 1
        assert "counted in the group of each" in report.notes[0]
        total_usd = await conn.fetchval(
            "SELECT sum(cost_usd) FROM model_calls WHERE created_at >= date_trunc('month', now())"
        )
        assert report.total.usd == total_usd
    finally:
        await conn.close()

    # The same through the command line, as JSON and as the table.
    monkeypatch.setenv("COS_DATABASE_URL", database_url)
    monkeypatch.delenv("COS_NATS_URL", raising=False)
    out = await _cli_output(["report", "cost", "--group-by", "tag:client", "--format", "json"])
    as_json = json.loads(out)
    assert {g["group"]: (Decimal(g["usd"]) if g["usd"] else None, g["calls"]) for g in as_json["groups"]} == seed
    table = await _cli_output(["report", "cost", "--group-by", "model"])
    assert "claude-sonnet-4-5" in table and "(total: each call once)" in table


async def _cli_output(argv: list[str]) -> str:
    buffer = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(buffer):
            return run_cli(argv)

    assert await asyncio.to_thread(run) == 0
    return buffer.getvalue()


PRICES_V1 = """
[[price]]
provider = "anthropic"
model = "claude-sonnet-4-5"
input_mtok = "2"
output_mtok = "10"

[[price]]
model = "local-llama-*"
input_mtok = "0.10"
output_mtok = "0.20"
"""

# v2: Sonnet input goes from $2 to $2.50; a price for the previously unknown model; llama unchanged.
PRICES_V2 = """
[[price]]
provider = "anthropic"
model = "claude-sonnet-4-5"
input_mtok = "2.50"
output_mtok = "10"

[[price]]
model = "local-llama-*"
input_mtok = "0.10"
output_mtok = "0.20"

[[price]]
provider = "openai"
model = "gpt-99-imaginary"
input_mtok = "7"
output_mtok = "7"
"""


async def test_reprice_after_changing_the_price_file_updates_exactly_the_affected_rows(
    nats_url: str, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1, v2 = tmp_path / "v1" / "prices.toml", tmp_path / "v2" / "prices.toml"
    v1.parent.mkdir()
    v2.parent.mkdir()
    v1.write_text(PRICES_V1)
    v2.write_text(PRICES_V2)
    clock = Clock(now=recent_start())
    calls = [
        *(
            model_call(clock.tick(), "claude-sonnet-4-5", "anthropic", input_tokens=1000, output_tokens=100)
            for _ in range(3)
        ),
        *(model_call(clock.tick(), "local-llama-3", "ollama", input_tokens=1000, output_tokens=100) for _ in range(4)),
        *(model_call(clock.tick(), "o4-mini", input_tokens=1000, output_tokens=100) for _ in range(5)),
        *(model_call(clock.tick(), "gpt-99-imaginary", input_tokens=1000, output_tokens=100) for _ in range(2)),
    ]
    acks = await publish_all(nats_url, calls)
    config = BillingConfig(budgets=(Budget("acme", "client:acme", Period.MONTH, Decimal("1000")),))
    async with billing(nats_url, database_url, config, Pricer(load_price_file(v1))):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)

    conn = await connect(database_url)
    try:
        before = {r["event_id"]: dict(r) for r in await conn.fetch("SELECT * FROM model_calls")}
        monkeypatch.setenv("COS_DATABASE_URL", database_url)
        since = this_month_start().date().isoformat()

        dry = json.loads(
            await _cli_output(
                ["billing", "reprice", "--since", since, "--price-file", str(v2), "--dry-run", "--format", "json"]
            )
        )
        assert (dry["rows_examined"], dry["rows_changed"], dry["dry_run"]) == (14, 5, True)
        assert {r["event_id"]: dict(r) for r in await conn.fetch("SELECT * FROM model_calls")} == before

        result = json.loads(
            await _cli_output(["billing", "reprice", "--since", since, "--price-file", str(v2), "--format", "json"])
        )
        after = {r["event_id"]: dict(r) for r in await conn.fetch("SELECT * FROM model_calls")}
        changed = {i for i in before if before[i] != after[i]}
        affected = {c.event_id for c in calls if c.model in ("claude-sonnet-4-5", "gpt-99-imaginary")}
        assert changed == affected
        assert result["rows_changed"] == 5
        sha = load_price_file(v2).sha256[:12]
        for event_id in affected:
            row = after[event_id]
            # v2: Sonnet $2.50 input / $10 output; gpt-99-imaginary $7 / $7 (both 1000 in, 100 out).
            expected = (
                usd((1000, "2.50"), (100, "10"))
                if row["model"] == "claude-sonnet-4-5"
                else usd((1000, "7"), (100, "7"))
            )
            assert (row["cost_usd"], row["cost_status"], row["price_version"]) == (expected, "override", sha)
            assert row["repriced_at"] is not None
        transitions = {(c["model"], c["old_status"], c["new_status"], c["rows"]) for c in result["changes"]}
        assert transitions == {
            ("claude-sonnet-4-5", "override", "override", 3),
            ("gpt-99-imaginary", "unpriced", "override", 2),
        }
        # Budget spend follows the new costs.
        spent = await conn.fetchval("SELECT spent_usd FROM budget_spend WHERE tag = 'client:acme' AND period = 'month'")
        assert spent == await conn.fetchval("SELECT sum(cost_usd) FROM model_calls")
        assert await conn.fetchval("SELECT count(*) FROM billing_reprices") == 1

        again = json.loads(
            await _cli_output(["billing", "reprice", "--since", since, "--price-file", str(v2), "--format", "json"])
        )
        assert (again["rows_examined"], again["rows_changed"]) == (14, 0)
        assert {r["event_id"]: dict(r) for r in await conn.fetch("SELECT * FROM model_calls")} == after
        table = await _cli_output(["billing", "reprice", "--since", since, "--price-file", str(v2)])
        assert "14 rows examined, 0 changed" in table
    finally:
        await conn.close()


def budget_metric(name: str, budget: str) -> float:
    return REGISTRY.get_sample_value(name, {"budget": budget}) or 0.0


async def test_a_budget_crossing_emits_exactly_one_alert_for_its_period(nats_url: str, database_url: str) -> None:
    # o4-mini: $1.10 per million input tokens, so each call below costs $1.10; the limit is $5.
    name = f"acme-{uuid.uuid4().hex[:6]}"
    daily = f"acme-daily-{uuid.uuid4().hex[:6]}"
    config = BillingConfig(
        budgets=(
            Budget(name, "client:acme", Period.MONTH, Decimal("5")),
            Budget(daily, "client:acme", Period.DAY, Decimal("2")),
        )
    )
    now = datetime.now(UTC)
    clock = Clock(now=recent_start())
    session = new_id()
    first = [model_call(clock.tick(), session_id=session, input_tokens=10**6) for _ in range(3)]  # $3.30
    second = [model_call(clock.tick(), session_id=session, input_tokens=10**6) for _ in range(3)]  # to $6.60
    today = first[0].occurred_at
    # The day budget: yesterday crossed too (previous period: alerted); a week ago was only recorded.
    yesterday = [model_call(today - timedelta(days=1), input_tokens=10**6) for _ in range(2)]
    week_ago = [model_call(today - timedelta(days=7), input_tokens=10**6) for _ in range(2)]
    alerts_before = budget_metric("cos_billing_budget_alerts_total", name)

    acks = await publish_all(nats_url, first)
    async with billing(nats_url, database_url, config):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
        assert [a for a in await stored_alerts(nats_url) if a["budget"] == name] == []  # $3.30 < $5
        acks = await publish_all(nats_url, second)
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    # Restarted, more spend in the same period, and a call delivered a second time: no second alert.
    more = [model_call(clock.tick(), session_id=session, input_tokens=10**6) for _ in range(2)]
    acks = await publish_all(nats_url, more + yesterday + week_ago)
    acks += await publish_copies(nats_url, second[:1], copy=2)
    async with billing(nats_url, database_url, config):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)

    alerts = await stored_alerts(nats_url)
    monthly = [a for a in alerts if a["budget"] == name]
    assert len(monthly) == 1
    alert = monthly[0]
    month_start = this_month_start(today)
    assert alert["subject"] == ALERTS_BUDGET
    # One id for the alert: Nats-Msg-Id = ce-id = event_id = alert_id, derived from the budget and the period.
    assert alert["msg_id"] == alert["ce_id"] == alert["event_id"] == alert["alert_id"]
    assert alert["ce_subject"] == name
    assert alert["ce_dataschema"] == "https://commonos.dev/schemas/alerts/budget_exceeded/v1.json"
    assert (alert["type"], alert["tag"], alert["period"], alert["limit_usd"]) == (
        "budget_exceeded",
        "client:acme",
        "month",
        "5",
    )
    # $1.10 x 5 = $5.50 is the first total at or over $5: the fifth call crossed it (the spend is the total after
    # the batch that crossed, which may or may not have held the sixth call).
    assert Decimal(alert["spent_usd"]) in (Decimal("5.5"), Decimal("6.6"))
    assert alert["crossed_by_event_id"] == str(second[1].event_id)
    assert datetime.fromisoformat(alert["period_start"]) == month_start

    day_alerts = sorted(datetime.fromisoformat(a["period_start"]) for a in alerts if a["budget"] == daily)
    today_start = today.replace(hour=0, minute=0, second=0, microsecond=0)
    assert day_alerts == [today_start - timedelta(days=1), today_start]

    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT budget, period_start, published FROM budget_alerts ORDER BY budget, period_start"
        )
        # Budget names carry a random suffix, so compare without depending on how they sort.
        assert sorted((r["budget"], r["period_start"], r["published"]) for r in rows) == sorted(
            [
                (name, month_start, True),
                (daily, today_start - timedelta(days=7), False),
                (daily, today_start - timedelta(days=1), True),
                (daily, today_start, True),
            ]
        )
        spent = await conn.fetchval(
            "SELECT spent_usd FROM budget_spend WHERE tag = 'client:acme' AND period = 'month' AND period_start = $1",
            month_start,
        )
        # Every call of the month once, though one was delivered twice.
        expected = await conn.fetchval(
            "SELECT sum(cost_usd) FROM model_calls WHERE created_at >= $1 AND created_at < $2",
            month_start,
            month_start + timedelta(days=32),
        )
        assert spent == expected
    finally:
        await conn.close()
    assert budget_metric("cos_billing_budget_alerts_total", name) == alerts_before + 1
    if this_month_start(now) == this_month_start():
        assert budget_metric("cos_billing_budget_exceeded", name) == 1
        assert budget_metric("cos_billing_budget_spent_usd", name) == float(spent)


async def test_an_alert_republished_after_a_crash_is_dropped_by_jetstream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_stream(js, alerts_stream_config())
        the_id = new_id()
        alert = BudgetExceeded(
            event_id=the_id,
            alert_id=the_id,
            budget="b",
            tag="client:acme",
            period=Period.DAY,
            period_start=datetime(2026, 11, 30, tzinfo=UTC),
            period_end=datetime(2026, 12, 1, tzinfo=UTC),
            limit_usd=Decimal(1),
            spent_usd=Decimal(2),
            crossed_by_event_id=None,
            occurred_at=datetime.now(UTC),
        )
        sink = NatsAlertSink(js)
        await sink.publish(alert)
        await sink.publish(alert)
        assert (await js.stream_info(ALERTS_STREAM)).state.messages == 1
    finally:
        await nc.close()


async def test_an_impossible_call_is_dead_lettered_and_the_rest_applied(nats_url: str, database_url: str) -> None:
    clock = Clock(now=recent_start())
    good = [model_call(clock.tick(), input_tokens=10) for _ in range(3)]
    bad = model_call(clock.tick(), output_tokens=1, reasoning_tokens=5)
    acks = await publish_all(nats_url, [good[0], bad, *good[1:]])
    async with billing(nats_url, database_url):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    conn = await connect(database_url)
    try:
        ids = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM model_calls")}
        assert ids == {g.event_id for g in good}
    finally:
        await conn.close()
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(DLQ_STREAM)
        assert info.state.messages == 1
        msg = await js.get_msg(DLQ_STREAM, info.state.last_seq)
        assert "reasoning_tokens (5) cannot exceed output_tokens (1)" in (msg.headers or {})["Cos-Dlq-Reason"]
        assert msg.subject.endswith(subject_for(bad).split(".", 2)[2])
    finally:
        await nc.close()


async def test_budget_spend_stays_exact_with_two_partitions_and_concurrent_reprices(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    v1, v2 = tmp_path / "v1.toml", tmp_path / "v2.toml"
    v1.write_text('[[price]]\nmodel = "m"\ninput_mtok = "1"\noutput_mtok = "1"\n')
    v2.write_text('[[price]]\nmodel = "m"\ninput_mtok = "3"\noutput_mtok = "3"\n')
    limit = Decimal("0.5")
    config = BillingConfig(
        budgets=(
            Budget("p-month", "client:acme", Period.MONTH, limit),
            Budget("p-day", "client:acme", Period.DAY, Decimal("1000")),
        )
    )
    clock = Clock(now=recent_start())
    calls = [
        model_call(clock.tick(1), "m", "local", tags=("client:acme",), input_tokens=500, output_tokens=500)
        for _ in range(3000)
    ]
    since = this_month_start()
    conn = await connect(database_url)
    await apply_schemas(conn, billing_schemas())
    await conn.close()
    async with (
        billing(nats_url, database_url, config, Pricer(load_price_file(v1)), partitions=2, partition=0, batch_size=100),
        billing(nats_url, database_url, config, Pricer(load_price_file(v1)), partitions=2, partition=1, batch_size=100),
    ):
        done = asyncio.Event()

        async def reprice_all_the_time() -> int:
            """Reprice what is stored so far, over and over, while the two writers are busy."""
            conn = await connect(database_url)
            runs = 0
            try:
                while not done.is_set():
                    await reprice(conn, since, None, load_price_file(v2 if runs % 2 == 0 else v1))
                    runs += 1
            finally:
                await conn.close()
            return runs

        repricer = asyncio.create_task(reprice_all_the_time())
        for start in range(0, len(calls), 300):
            acks = await publish_all(nats_url, calls[start : start + 300])
        for suffix in ("-p0-of-2", "-p1-of-2"):
            await wait_for_position(database_url, "billing" + suffix, acks[-1].seq, table=POSITIONS)
        done.set()
        assert await repricer > 3
        conn = await connect(database_url)
        try:
            await reprice(conn, since, None, load_price_file(v2))
        finally:
            await conn.close()

    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM model_calls") == len(calls)
        spends = await conn.fetch("SELECT period, period_start, period_end, spent_usd, calls FROM budget_spend")
        assert {r["period"] for r in spends} == {"month", "day"}
        for spend in spends:
            actual = await conn.fetchrow(
                "SELECT sum(cost_usd) AS usd, count(*) AS n FROM model_calls "
                "WHERE created_at >= $1 AND created_at < $2",
                spend["period_start"],
                spend["period_end"],
            )
            assert (spend["spent_usd"], spend["calls"]) == (actual["usd"], actual["n"])
        # Every call costs $3 per million x 1000 tokens after the last reprice.
        assert await conn.fetchval("SELECT sum(cost_usd) FROM model_calls") == Decimal("0.003") * len(calls)
        # The daily rollup too, though writers and reprices moved the same rows at once.
        assert await stored_days(conn) == await days_of_calls(conn)
        assert await conn.fetchval("SELECT sum(usd) FROM model_call_days") == Decimal("0.003") * len(calls)
        assert await conn.fetchval("SELECT count(*) FROM budget_alerts WHERE budget = 'p-month'") == 1
    finally:
        await conn.close()
    assert len([a for a in await stored_alerts(nats_url) if a["budget"] == "p-month"]) == 1


@pytest.mark.parametrize(
    ("variable", "content", "message"),
    [
        (
            "COS_BILLING_CONFIG",
            "[[budget]]\ntag = 'client:acme'\nlimit_usd = 'x'\n",
            "budget[0].limit_usd: invalid decimal string",
        ),
        ("COS_PRICE_FILE", "[[price]]\nmodel = 'm'\n", "price[0].input_mtok: required key missing"),
    ],
)
def test_a_bad_config_file_is_one_line_at_start(tmp_path: Path, variable: str, content: str, message: str) -> None:
    path = tmp_path / "file.toml"
    path.write_text(content)
    env = {
        **os.environ,
        variable: str(path),
        "COS_NATS_URL": "nats://127.0.0.1:1",
        "COS_DATABASE_URL": "postgresql://127.0.0.1:1/none",
    }
    result = subprocess.run(
        [sys.executable, "-m", "commonos.billing"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1


def as_role(dsn: str, role: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{role}:pw@{parts.hostname}:{parts.port}"))


async def test_billing_applies_its_schema_where_the_core_belongs_to_another_role(database_url: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    writer, biller = f"jw_{suffix}", f"bill_{suffix}"
    admin = await connect(database_url)
    try:
        await admin.execute(f"CREATE ROLE {writer} LOGIN PASSWORD 'pw'; CREATE ROLE {biller} LOGIN PASSWORD 'pw'")
        await admin.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {writer}, {biller}")
        as_writer = await connect(as_role(database_url, writer))
        try:
            await apply_schemas(as_writer, [CORE_SCHEMA])
        finally:
            await as_writer.close()
        as_biller = await connect(as_role(database_url, biller))
        try:
            await apply_billing_schemas(as_biller)
            await apply_billing_schemas(as_biller)  # every start
        finally:
            await as_biller.close()
        owners = {
            r["tablename"]: r["tableowner"]
            for r in await admin.fetch(
                "SELECT tablename, tableowner FROM pg_tables WHERE tablename = ANY($1::text[])",
                ["sessions", "model_calls", "budget_alerts"],
            )
        }
        assert owners == {"sessions": writer, "model_calls": biller, "budget_alerts": biller}
    finally:
        await admin.execute(f"REASSIGN OWNED BY {writer}, {biller} TO postgres")
        await admin.execute(f"DROP OWNED BY {writer}, {biller}")
        await admin.execute(f"DROP ROLE {writer}; DROP ROLE {biller}")
        await admin.close()


async def test_a_call_stored_under_another_event_id_is_not_billed_again(nats_url: str, database_url: str) -> None:
    """One vendor request is one call, whichever event id names it: a transcript imported before the
    OTLP gateway existed minted other ids for its calls than the gateway and today's importer do (issue
    #17), and billing must not count a re-import or the same call's telemetry a second time."""
    clock = Clock(now=recent_start())
    first = model_call(clock.tick(), provider="anthropic", model="claude-sonnet-4-5", input_tokens=10)
    first = msgspec.structs.replace(first, request_id="req_same")
    # The same call under a new id, once in a later batch and twice within one batch.
    again = msgspec.structs.replace(first, event_id=new_id())
    twice = [msgspec.structs.replace(first, event_id=new_id()) for _ in range(2)]
    # The same request id at another provider is another call; calls without a request id are all kept.
    other_provider = msgspec.structs.replace(first, event_id=new_id(), provider="openai", model="o4-mini")
    # A request id is its sender's word: another profile's call naming it (in a session of its own) is its
    # own call, in a later batch and within the batch of the first profile's copies (issue #29).
    other_profile = [
        msgspec.structs.replace(first, event_id=new_id(), profile_id="other-profile", session_id=new_id())
        for _ in range(2)
    ]
    no_id = [model_call(clock.tick(), input_tokens=5) for _ in range(2)]
    acks = await publish_all(nats_url, [first, *no_id, other_profile[0]])
    async with billing(nats_url, database_url):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    acks = await publish_all(nats_url, [again, other_profile[1], *twice, other_provider])
    async with billing(nats_url, database_url, batch_size=10):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    conn = await connect(database_url)
    try:
        ids = {r["event_id"] for r in await conn.fetch("SELECT event_id FROM model_calls")}
        assert ids == {first.event_id, other_provider.event_id, other_profile[0].event_id, *(n.event_id for n in no_id)}
    finally:
        await conn.close()
