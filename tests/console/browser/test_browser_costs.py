"""The Costs page in headless Chromium on calls billed by the real billing service: the cost per client table shows
what the specification's cost per client query and `cos report cost --group-by tag:client` (the command, on the
same database) give; unpriced calls are shown; another tag key through the form; the CSV the page links to. One
client's costs by day (and by hour), the calls a range leaves out, and an error said on the page."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.async_api import Locator, expect

from commonos.proto import events as ev
from commonos.runtime.postgres import connect
from tests.billing.support import billing, run_cli
from tests.billing.test_service import COST_PER_CLIENT
from tests.console.browser.conftest import Tab, shoot
from tests.console.conftest import Seeded
from tests.console.test_costs import BUDGETS, spread_calls, this_month_calls
from tests.support import publish_all, wait_for_position


@pytest.fixture
async def billed_calls(console_db: Seeded, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This month's calls (two clients at once, unpriced, untagged, imported work) billed with two budgets."""
    calls = this_month_calls()
    acks = await publish_all(nats_url, calls)
    async with billing(nats_url, console_db.dsn, config=BUDGETS):
        await wait_for_position(console_db.dsn, "billing", acks[-1].seq, table="billing_positions")
    budgets = tmp_path / "billing.toml"
    budgets.write_text(
        '[[budget]]\ntag = "client:acme"\nperiod = "month"\nlimit_usd = "0.000001"\nname = "acme-monthly"\n\n'
        '[[budget]]\ntag = "client:globex"\nperiod = "day"\nlimit_usd = "1000"\nname = "globex-daily"\n'
    )
    monkeypatch.setenv("COS_BILLING_CONFIG", str(budgets))
    monkeypatch.setenv("COS_DATABASE_URL", console_db.dsn)


def money(usd: str | Decimal | None) -> str:
    """A USD amount as the page's tables write it."""
    return "no price" if usd is None else f"{Decimal(usd):,.4f}"


async def table_rows(table: Locator) -> dict[str, tuple[str, str]]:
    """The label, USD and calls of each body row of a cost table."""
    out: dict[str, tuple[str, str]] = {}
    for row in await table.locator("tbody tr").all():
        label = (await row.locator("th").inner_text()).strip()
        cells = [c.strip() for c in await row.locator("td").all_inner_texts()]
        out[label] = (cells[0], cells[1])
    return out


async def test_the_costs_page_shows_the_cost_per_client_of_cos_report_cost(
    tab: Tab, console_db: Seeded, billed_calls: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # `cos report cost` as the command line prints it, and the specification's query, on the same database.
    capsys.readouterr()
    assert await asyncio.to_thread(run_cli, ["report", "cost", "--group-by", "tag:client", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    conn = await connect(console_db.dsn)
    try:
        spec = {r["tag"]: (r["usd"], r["calls"]) for r in await conn.fetch(COST_PER_CLIENT)}
    finally:
        await conn.close()
    assert {g["group"] for g in printed["groups"]} == set(spec) == {"client:acme", "client:globex", "client:initech"}

    page = tab.page
    await tab.sign_in("olivia", start="/costs")
    await expect(page.get_by_role("heading", name="Costs", level=1)).to_be_visible()
    by_tag = page.locator("section[aria-labelledby=by-tag] table.costs")
    await expect(by_tag.locator("tbody tr").first).to_be_visible()
    shown = await table_rows(by_tag)
    expected = {g["group"]: (money(g["usd"]), f"{g['calls']:,}") for g in printed["groups"]}
    assert {k: v for k, v in shown.items() if k.startswith("client:")} == {
        k: v for k, v in expected.items() if k.startswith("client:")
    }
    assert {k: (money(usd), str(calls)) for k, (usd, calls) in spec.items()} == {
        k: v for k, v in shown.items() if k.startswith("client:")
    }
    # In the order of `cos report cost` (by cost).
    labels = [(await th.inner_text()).strip() for th in await by_tag.locator("tbody tr th").all()]
    assert [label for label in labels if label.startswith("client:")] == [g["group"] for g in printed["groups"]]
    # The total counts each call once, and the unpriced ones are visible.
    total = by_tag.locator("tfoot tr")
    await expect(total.locator("td").nth(1)).to_have_text(str(printed["total"]["calls"]))
    await expect(page.locator("p.range")).to_contain_text(f"{printed['total']['unpriced_calls']} unpriced")
    await expect(page.locator("section[aria-labelledby=by-status]")).to_contain_text("unpriced")
    initech = by_tag.locator("tbody tr", has=page.locator("th", has_text="client:initech"))
    await expect(initech.locator("td").nth(2)).not_to_have_text("0")
    # The chart: an accessible SVG of the same groups.
    chart = page.locator("section[aria-labelledby=by-tag] figure svg")
    await expect(chart).to_have_attribute("role", "img")
    await expect(chart.locator("desc")).to_contain_text("client:acme")
    await shoot(page, "costs", full_page=True)

    # The CSV the page links to holds the exact amounts of `cos report cost`.
    async with page.expect_download() as download_info:
        await page.get_by_role("link", name="CSV of this table").click()
    download = await download_info.value
    saved = await download.path()
    rows = list(csv.reader(io.StringIO(await asyncio.to_thread(Path(saved).read_text))))
    assert rows[0][:3] == ["tag:client", "usd", "calls"]
    from_csv = {row[0]: (row[1], row[2]) for row in rows[1:] if row[0].startswith("client:")}
    assert from_csv == {g["group"]: (g["usd"] or "", str(g["calls"])) for g in printed["groups"]}

    # Another tag key through the form: htmx swaps the tables in and the address follows.
    await page.get_by_label("Group by tag key").fill("project")
    await page.get_by_role("button", name="Apply").click()
    await expect(page).to_have_url(re.compile(r"[?&]tag=project"))
    await expect(page.get_by_role("heading", name="By tag project:*")).to_be_visible()
    await expect(page.locator("section[aria-labelledby=by-tag] table.costs")).to_contain_text("project:web")
    tab.assert_clean()


@pytest.fixture
async def spread_billed(console_db: Seeded, nats_url: str) -> list[ev.ModelCallCompleted]:
    """Calls of three clients over twenty days of October and November 2026, and this month's, billed."""
    calls = spread_calls() + this_month_calls()
    acks = await publish_all(nats_url, calls)
    async with billing(nats_url, console_db.dsn):
        await wait_for_position(console_db.dsn, "billing", acks[-1].seq, table="billing_positions")
    return calls


async def test_one_clients_costs_by_day(
    tab: Tab, console_db: Seeded, spread_billed: list[ev.ModelCallCompleted]
) -> None:
    """Issue 32, as a person does it: the default range says which calls it leaves out and widens to them; typing
    `client:acme` as the key to group by says why that cannot be and offers acme's costs, which then show only
    acme's calls, by day, in the chart and the table below it."""
    conn = await connect(console_db.dsn)
    try:
        month = await conn.fetchval("SELECT date_trunc('month', now())")
        older = await conn.fetchrow(
            "SELECT count(*) AS calls, min(created_at) AS first FROM model_calls WHERE created_at < $1", month
        )
        acme_days = {
            r["day"]: r["calls"]
            for r in await conn.fetch(
                "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS day, count(*) AS calls "
                "FROM model_calls WHERE 'client:acme' = ANY(tags) AND created_at >= $1 GROUP BY day",
                older["first"],
            )
        }
        every_day = await conn.fetchval(
            "SELECT count(DISTINCT (created_at AT TIME ZONE 'UTC')::date) FROM model_calls WHERE created_at >= $1",
            older["first"],
        )
    finally:
        await conn.close()
    assert older["calls"] > 50 and len(acme_days) > 10

    page = tab.page
    await tab.sign_in("olivia", start="/costs")
    # This month: the older calls are counted, with the link that widens the range to them.
    outside = page.locator("p.outside")
    await expect(outside).to_contain_text(f"{older['calls']:,} call(s) outside this range")
    await outside.get_by_role("link", name="Widen the range to show them").click()
    first = older["first"].date().isoformat()
    await expect(page).to_have_url(re.compile(rf"[?&]since={first}"))
    await expect(page.locator("p.outside")).to_have_count(0)

    # A tag value typed where a key goes: the error is on the page, and the old tables are gone.
    await page.get_by_label("Group by tag key").fill("client:acme")
    await page.get_by_role("button", name="Apply").click()
    error = page.locator(".costs-error")
    await expect(error).to_contain_text("'client:acme' is a tag value, not a key to group by")
    await expect(page.locator("section[aria-labelledby=by-tag]")).to_have_count(0)
    await expect(page.get_by_label("Group by tag key")).to_have_value("client:acme")
    await error.get_by_role("link", name="Show that instead").click()

    # Only acme's calls, per day: the form says so, the table under the chart holds acme's calls of each day.
    await expect(page).to_have_url(re.compile(r"[?&]has_tag=client%3Aacme"))
    await expect(page.locator("p.only")).to_contain_text("Only the calls tagged client:acme")
    await expect(page.get_by_label("Only calls tagged")).to_have_value("client:acme")
    await expect(page.get_by_label("Group by tag key")).to_have_value("client")
    table = page.locator("section[aria-labelledby=over-time] table.over-time")
    await expect(table.locator("tbody tr").first).to_be_visible()
    shown: dict[str, int] = {}
    for row in await table.locator("tbody tr").all():
        day = (await row.locator("th").inner_text()).strip()
        calls = int((await row.locator("td").nth(1).inner_text()).replace(",", ""))
        if calls:
            shown[day] = calls
    assert shown == acme_days
    # Every day of the range has its row, the days without a call of acme's too.
    assert await table.locator("tbody tr").count() >= every_day
    await expect(table.locator("tbody tr.empty").first).to_be_visible()
    # The chart: a stacked column per day, its stacks the client tags of acme's calls.
    chart = page.locator("section[aria-labelledby=over-time] svg.time-chart")
    await expect(chart).to_have_attribute("role", "img")
    await expect(chart.locator("g.legend")).to_contain_text(["client:acme", "client:initech"])
    day, calls = next(iter(sorted(acme_days.items())))
    await expect(chart.locator(f'g.time[data-time="{day}"] > title')).to_contain_text(f"{day}: $")
    await expect(chart.locator(f'g.time[data-time="{day}"] > title')).to_contain_text(f"({calls:,} calls)")
    total = page.locator("#total-calls")
    await expect(total).to_have_text(f"{sum(acme_days.values()):,}")
    await shoot(page, "costs-client-acme", full_page=True)

    # Per hour, stacked by model, for two days: the same calls, counted by the hour.
    await page.get_by_label("Since").fill(day)
    next_day = (datetime.fromisoformat(day) + timedelta(days=2)).date().isoformat()
    await page.get_by_label("Until").fill(next_day)
    form = page.locator("form.costs-filters")
    await form.get_by_label("Over time").select_option("hour")
    await form.get_by_label("Stacked by").select_option("model")
    await page.get_by_role("button", name="Apply").click()
    await expect(page).to_have_url(re.compile(r"[?&]interval=hour"))
    await expect(page.get_by_role("heading", name=re.compile("per hour"))).to_be_visible()
    hours = page.locator("section[aria-labelledby=over-time] table.over-time tbody tr")
    counted = 0
    for row in await hours.all():
        counted += int((await row.locator("td").nth(1).inner_text()).replace(",", ""))
    in_two_days = sum(c for d, c in acme_days.items() if day <= d < next_day)
    assert counted == in_two_days
    tab.assert_clean()
