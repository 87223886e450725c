"""The Costs page on calls billed by the real billing service: every table equals `cos report cost` (the
function and the CLI, on the same database), the specification's cost per client query too; unpriced calls
counted and shown; the loop's own calls and imported Claude Code work side by side; budgets and their alerts;
an accessible SVG chart with escaped labels; CSV export without formula injection; an analyst sees its own
profiles' calls only (row-level security) and no budget; over random ranges, every table is what the queries
over `model_calls` alone give (the page reads billing's daily rollup for whole days)."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json
import random
import urllib.parse
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from commonos.accounting.cost_queries import GROUP_EXPRESSIONS, TOTAL_SQL
from commonos.accounting.csv_cells import cost_csv, safe_cell
from commonos.billing.config import BillingConfig, Budget, Period
from commonos.billing.report import GroupBy, cost_report
from commonos.console.pages.costs import ORIGIN, bar_chart
from commonos.proto import events as ev
from commonos.runtime.postgres import connect
from tests.billing.raw_costs import STATUS_SQL, raw_grouped
from tests.billing.support import billing, run_cli
from tests.billing.test_service import COST_PER_CLIENT
from tests.console.conftest import RunningConsole, Seeded
from tests.support import publish_all, wait_for_position

FORMULA_MODEL = '=HYPERLINK("http://evil.example","x")'
HOSTILE_MODEL = "<b>bold</b>-model"


def _call(
    profile: str, at: datetime, tags: tuple[str, ...], model: str = "claude-sonnet-4-5", provider: str = "anthropic"
) -> ev.ModelCallCompleted:
    return ev.ModelCallCompleted(
        profile_id=profile,
        session_id=uuid.uuid4(),
        provider=provider,
        model=model,
        input_tokens=1000,
        output_tokens=200,
        cache_read_tokens=300,
        cache_write_5m_tokens=40,
        reasoning_tokens=50,
        tags=tags,
        occurred_at=at,
    )


def this_month_calls() -> list[ev.ModelCallCompleted]:
    """Calls of this month: priced, unpriced, two clients at once, untagged, and imported Claude Code work."""
    now = datetime.now(UTC)
    at = max(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0), now - timedelta(minutes=20))
    tick = iter(range(1, 1000))

    def t() -> datetime:
        return at + timedelta(milliseconds=next(tick))

    return [
        _call("acme", t(), ("client:acme",)),
        _call("acme", t(), ("client:acme", "team:web")),
        _call("acme", t(), ("client:acme", "client:initech")),
        _call("acme", t(), ("client:initech",), model="no-such-model", provider="nobody"),
        _call("acme", t(), ("client:initech",), model=FORMULA_MODEL, provider="@nobody"),
        _call("globex", t(), ("client:globex",), model=HOSTILE_MODEL, provider="openai"),
        _call("globex", t(), ()),
        _call("claude-code", t(), ("vendor:claude-code", "client:acme", "project:web")),
        _call("codex", t(), ("vendor:codex",), model="gpt-5-codex", provider="openai"),
    ]


BUDGETS = BillingConfig(
    budgets=(
        Budget("acme-monthly", "client:acme", Period.MONTH, Decimal("0.000001")),
        Budget("globex-daily", "client:globex", Period.DAY, Decimal("1000")),
    )
)


@pytest.fixture
async def billed(console_db: Seeded, nats_url: str) -> list[ev.ModelCallCompleted]:
    """This month's calls billed by billing with two budgets (acme's is crossed at once)."""
    calls = this_month_calls()
    acks = await publish_all(nats_url, calls)
    async with billing(nats_url, console_db.dsn, config=BUDGETS):
        await wait_for_position(console_db.dsn, "billing", acks[-1].seq, table="billing_positions")
    return calls


@pytest.fixture
def budgets_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "billing.toml"
    path.write_text(
        '[[budget]]\ntag = "client:acme"\nperiod = "month"\nlimit_usd = "0.000001"\nname = "acme-monthly"\n\n'
        '[[budget]]\ntag = "client:globex"\nperiod = "day"\nlimit_usd = "1000"\nname = "globex-daily"\n\n'
        '[[budget]]\ntag = "client:hooli"\nperiod = "month"\nlimit_usd = 50\n'
    )
    monkeypatch.setenv("COS_BILLING_CONFIG", str(path))
    return path


async def get_json(client: aiohttp.ClientSession, url: str) -> Any:
    async with client.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def _as_report(row: dict[str, Any]) -> tuple[Any, ...]:
    usd = None if row["usd"] is None else Decimal(row["usd"])
    return (
        row["group"],
        usd,
        row["calls"],
        row["unpriced_calls"],
        row["input_tokens"],
        row["output_tokens"],
        row["cache_read_tokens"],
        row["cache_write_tokens"],
        row["reasoning_tokens"],
    )


def _of_report(row: Any) -> tuple[Any, ...]:
    return (
        row.group,
        row.usd,
        row.calls,
        row.unpriced_calls,
        row.input_tokens,
        row.output_tokens,
        row.cache_read_tokens,
        row.cache_write_tokens,
        row.reasoning_tokens,
    )


GROUPINGS = {
    "tag:client": "by_tag",
    "model": "by_model",
    "provider": "by_provider",
    "profile": "by_profile",
    "day": "by_day",
}


async def assert_equals_cos_report(
    page: dict[str, Any], dsn: str, since: datetime | None, until: datetime | None
) -> None:
    conn = await connect(dsn)
    try:
        for grouping, key in GROUPINGS.items():
            report = await cost_report(
                conn, GroupBy("tag", "client") if grouping == "tag:client" else GroupBy(grouping), since, until
            )
            table = page[key]
            assert table["group_by"] == str(report.group_by)
            assert [_as_report(r) for r in table["rows"]] == [_of_report(r) for r in report.groups], grouping
            if report.untagged is None:
                assert table["untagged"] is None
            else:
                assert _as_report(table["untagged"]) == _of_report(report.untagged)
            assert _as_report(page["total"]) == _of_report(report.total)
            assert datetime.fromisoformat(page["since"]) == report.since
    finally:
        await conn.close()


async def test_every_table_equals_cos_report_cost(
    console: RunningConsole,
    console_db: Seeded,
    billed: list[ev.ModelCallCompleted],
    budgets_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, _ = await console.signed_in("olivia")
    # This month (the default range, as `cos report cost` defaults).
    page = await get_json(client, "/api/costs")
    await assert_equals_cos_report(page, console_db.dsn, None, None)
    # The sample conversations of November 2026, with an explicit range.
    nov = await get_json(client, "/api/costs?since=2026-11-01&until=2026-12-01T00:00:00Z&tag=team")
    assert nov["tag_key"] == "team" and nov["total"]["calls"] == 18
    assert [r["group"] for r in nov["by_tag"]["rows"]] == ["team:web"]
    assert nov["by_tag"]["untagged"]["calls"] == 12
    await assert_equals_cos_report(
        await get_json(client, "/api/costs?since=2026-11-01&until=2026-12-01"),
        console_db.dsn,
        datetime(2026, 11, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
    )

    # The specification's cost per client query gives the same groups, USD and calls.
    conn = await connect(console_db.dsn)
    try:
        seed = {r["tag"]: (r["usd"], r["calls"]) for r in await conn.fetch(COST_PER_CLIENT)}
    finally:
        await conn.close()
    assert {
        r["group"]: (None if r["usd"] is None else Decimal(r["usd"]), r["calls"]) for r in page["by_tag"]["rows"]
    } == seed
    assert seed["client:acme"][1] == 4 and seed["client:initech"][1] == 3

    # And `cos report cost` as the command line prints it, against the same database.
    monkeypatch.setenv("COS_DATABASE_URL", console_db.dsn)
    capsys.readouterr()
    assert await asyncio.to_thread(run_cli, ["report", "cost", "--group-by", "tag:client", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [(g["group"], g["usd"], g["calls"]) for g in printed["groups"]] == [
        (r["group"], r["usd"], r["calls"]) for r in page["by_tag"]["rows"]
    ]
    assert printed["total"]["usd"] == page["total"]["usd"] and printed["total"]["calls"] == page["total"]["calls"] == 9
    assert printed["untagged"]["calls"] == page["by_tag"]["untagged"]["calls"] == 2


async def test_unpriced_calls_origin_budgets_and_the_page(
    console: RunningConsole, console_db: Seeded, billed: list[ev.ModelCallCompleted], budgets_file: Path
) -> None:
    client, _ = await console.signed_in("olivia")
    page = await get_json(client, "/api/costs")
    # Unpriced calls are counted, never hidden.
    assert page["total"]["unpriced_calls"] == 3
    status = {s["cost_status"]: s for s in page["by_status"]}
    assert status["unpriced"]["calls"] == 3 and status["unpriced"]["usd"] is None
    assert sum(s["calls"] for s in page["by_status"]) == page["total"]["calls"]
    models = {r["group"]: r for r in page["by_model"]["rows"]}
    assert models["no-such-model"]["usd"] is None and models["no-such-model"]["unpriced_calls"] == 1
    assert any("unpriced" in n for n in page["notes"])
    # The loop's own work and imported work side by side.
    origin = {r["group"]: r["calls"] for r in page["by_origin"]["rows"]}
    assert origin == {"loop": 7, "claude-code": 1, "codex": 1}
    # Budgets: limits from the file, spend from billing, acme's crossed and alerted.
    budgets = {b["name"]: b for b in page["budgets"]["budgets"]}
    assert page["budgets"]["visible"] is True
    assert budgets["acme-monthly"]["state"] == "exceeded" and budgets["acme-monthly"]["alerted_at"]
    assert Decimal(budgets["acme-monthly"]["spent_usd"]) == Decimal(
        next(r["usd"] for r in page["by_tag"]["rows"] if r["group"] == "client:acme")
    )
    assert budgets["acme-monthly"]["calls"] == 4
    assert budgets["globex-daily"]["state"] == "ok" and Decimal(budgets["globex-daily"]["limit_usd"]) == 1000
    assert budgets["client:hooli/month"]["spent_usd"] == "0" and budgets["client:hooli/month"]["state"] == "ok"
    assert [a["budget"] for a in page["budgets"]["alerts"]] == ["acme-monthly"]

    async with client.get("/costs") as r:
        assert r.status == 200
        html = await r.text()
    assert 'role="img"' in html and '<title id="chart-tag-t">Cost by tag:client</title>' in html
    assert '<desc id="chart-tag-d">client:acme: $' in html
    assert "client:initech" in html and "unpriced" in html and "exceeded" in html
    assert "claude-code" in html and "codex" in html
    assert "<b>bold</b>" not in html and "&lt;b&gt;bold&lt;/b&gt;-model" in html
    assert "<script" not in html.replace('<script src="/static/', "")
    # Another key and range through the form's parameters.
    async with client.get("/costs?tag=project&since=7d") as r:
        assert r.status == 200
        assert "project:web" in await r.text()
    async with client.get("/api/costs?tag=Not%20A%20Key") as r:
        assert r.status == 422
    async with client.get("/api/costs?since=yesterday") as r:
        assert r.status == 422
    # Times as `cos report cost` reads them, refused with its reasons.
    async with client.get("/api/costs?until=0001-01-01T00:00:00%2B01:00") as r:
        assert r.status == 422 and "is before the year 1 in UTC" in await r.text()
    async with client.get("/api/costs?since=" + "9" * 40 + "d") as r:
        assert r.status == 422 and "reaches before the year 1" in await r.text()


async def test_csv_export_is_quoted_and_safe(
    console: RunningConsole, console_db: Seeded, billed: list[ev.ModelCallCompleted]
) -> None:
    client, _ = await console.signed_in("olivia")
    page = await get_json(client, "/api/costs")
    async with client.get("/api/costs.csv?group_by=model") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/csv")
        assert "attachment" in r.headers["Content-Disposition"]
        text = await r.text()
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0][:3] == ["model", "usd", "calls"]
    labels = [row[0] for row in rows[1:]]
    assert "'" + FORMULA_MODEL in labels and FORMULA_MODEL not in labels
    assert labels[-1] == "(total: each call once)" and rows[-1][2] == str(page["total"]["calls"])
    assert not any(cell.startswith(("=", "+", "-", "@")) for row in rows for cell in row)
    async with client.get("/api/costs.csv") as r:
        by_tag = list(csv.reader(io.StringIO(await r.text())))
    assert by_tag[0][0] == "tag:client" and [row[0] for row in by_tag[-2:]] == ["(none)", "(total: each call once)"]
    assert {row[0]: row[2] for row in by_tag[1:-2]} == {r["group"]: str(r["calls"]) for r in page["by_tag"]["rows"]}


async def test_an_analyst_sees_its_profiles_calls_only(
    console: RunningConsole, console_db: Seeded, billed: list[ev.ModelCallCompleted]
) -> None:
    client, _ = await console.signed_in("alice")
    page = await get_json(client, "/api/costs")
    acme = [c for c in billed if c.profile_id == "acme"]
    assert page["total"]["calls"] == len(acme)
    assert {r["group"] for r in page["by_profile"]["rows"]} == {"acme"}
    assert "client:globex" not in {r["group"] for r in page["by_tag"]["rows"]}
    # Budgets span every profile: the database does not let the analyst read them.
    assert page["budgets"] == {"visible": False, "budgets": [], "alerts": [], "note": page["budgets"]["note"]}
    async with client.get("/costs") as r:
        html = await r.text()
    assert "operators see them" in html and "globex" not in html


async def test_every_table_is_the_raw_queries_over_random_ranges(
    console: RunningConsole, console_db: Seeded, billed: list[ev.ModelCallCompleted]
) -> None:
    """The page reads the rollup for whole UTC days and model_calls for the rest: over random ranges (partial
    days at both ends, within a day, open-ended), each table, the total and the statuses are the raw queries'."""
    client, _ = await console.signed_in("olivia")
    rng = random.Random(17)
    now = datetime.now(UTC)
    first = datetime(2026, 10, 25, tzinfo=UTC)
    span = int((now - first).total_seconds())
    ranges: list[tuple[datetime, datetime | None]] = [(first, None), (first + timedelta(hours=30), now)]
    for _ in range(12):
        since = first + timedelta(seconds=rng.randrange(span), microseconds=rng.randrange(10**6))
        until = rng.choice([None, since + timedelta(hours=rng.randrange(1, 24 * 40), seconds=rng.randrange(3600))])
        ranges.append((since, until))
    expressions = {**GROUP_EXPRESSIONS, "origin": ORIGIN}
    tables = {"tag": "by_tag", "model": "by_model", "provider": "by_provider", "profile": "by_profile"}
    tables |= {"day": "by_day", "origin": "by_origin"}
    conn = await connect(console_db.dsn)
    try:
        compared = 0
        for since, until in ranges:
            query = {"since": since.isoformat(), "tag": "client"} | ({"until": until.isoformat()} if until else {})
            page = await get_json(client, "/api/costs?" + urllib.parse.urlencode(query))
            # Decimal sums compare equal to the page's numbers (ints, and USD as exact strings made Decimal).
            assert _as_report(page["total"])[1:] == tuple(await conn.fetchrow(TOTAL_SQL, since, until) or ()), query
            statuses = [(s["cost_status"], s["calls"], s["usd"] and Decimal(s["usd"])) for s in page["by_status"]]
            assert statuses == [tuple(r) for r in await conn.fetch(STATUS_SQL, since, until)], query
            for kind, key in tables.items():
                raw = await raw_grouped(conn, kind, since, until, "client", expressions)
                if kind == "tag":
                    *raw, untagged = raw
                    have = page[key]["untagged"]
                    assert (_as_report(have)[1:] if have else None) == (untagged if untagged[1] else None), query
                assert [_as_report(r) for r in page[key]["rows"]] == raw, (kind, query)
            compared += page["total"]["calls"] > 0
        assert compared >= 8
    finally:
        await conn.close()


def test_safe_cells_and_chart_escaping() -> None:
    texts = ("=1+1", "+1", "-1", "@x", "\tx", "\rx", "ok", "1-1")
    assert [safe_cell(v) for v in texts] == ["'=1+1", "'+1", "'-1", "'@x", "'\tx", "'\rx", "ok", "1-1"]
    # Numbers stay numbers, a negative one too: only text is quoted.
    assert [safe_cell(v) for v in (3, -3, Decimal("-1.5"), None)] == [3, -3, Decimal("-1.5"), ""]
    from commonos.accounting.cost_queries import CostRow

    row = CostRow(
        group="<script>x</script>",
        label="<script>x</script>",
        usd=Decimal("1.5"),
        calls=2,
        unpriced_calls=1,
        input_tokens=0,
        output_tokens=0,
        cache_read_tokens=0,
        cache_write_tokens=0,
        reasoning_tokens=0,
    )
    credit = dataclasses.replace(row, usd=Decimal("-1.5"), label="-credit\r=1")
    lines = list(csv.reader(io.StringIO(cost_csv("model", [(r.label, r) for r in (row, credit)]), newline="")))
    assert lines[0] == [
        "model",
        "usd",
        "calls",
        "unpriced",
        "input",
        "output",
        "reasoning",
        "cache_read",
        "cache_write",
    ]
    assert [line[:3] for line in lines[1:]] == [["<script>x</script>", "1.5", "2"], ["'-credit\r=1", "-1.5", "2"]]
    svg = str(bar_chart("c", "T <t>", [row]))
    assert "<script>" not in svg and "&lt;script&gt;x&lt;/script&gt;" in svg and "T &lt;t&gt;" in svg
    assert svg.startswith('<svg class="chart" id="c" role="img" aria-labelledby="c-t c-d"')
