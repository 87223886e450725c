"""The Costs page in headless Chromium on calls billed by the real billing service: the cost per client table shows
what the specification's cost per client query and `cos report cost --group-by tag:client` (the command, on the
same database) give; unpriced calls are shown; another tag key through the form; the CSV the page links to."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.async_api import Locator, expect

from commonos.runtime.postgres import connect
from tests.billing.support import billing, run_cli
from tests.billing.test_service import COST_PER_CLIENT
from tests.console.browser.conftest import Tab, shoot
from tests.console.conftest import Seeded
from tests.console.test_costs import BUDGETS, this_month_calls
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
