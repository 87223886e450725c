"""The Costs page on calls billed by the real billing service: every table equals `cos report cost` (the
function and the CLI, on the same database), the specification's cost per client query too; unpriced calls
counted and shown; the loop's own calls and imported Claude Code work side by side; budgets and their alerts;
an accessible SVG chart with escaped labels; CSV export without formula injection; an analyst sees its own
profiles' calls only (row-level security) and no budget; over random ranges, every table is what the queries
over `model_calls` alone give (the page reads billing's daily rollup for whole days). One client's costs (a tag
value, a profile, a model) by model and over time, per day and per hour, stacked: every table, time and stack
the raw queries' too; what a range leaves out, counted and linked; every parameter it cannot use said on the
page."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import itertools
import json
import random
import re
import urllib.parse
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from commonos.accounting.cost_queries import AGGREGATES, GROUP_EXPRESSIONS, TOTAL_SQL
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


# One client's costs, over time, and what a range leaves out.


def spread_calls() -> list[ev.ModelCallCompleted]:
    """Calls at random times from 20 October 2026 for twenty days: three clients (some calls carry two at once),
    untagged calls, imported work, three profiles, priced and unpriced models."""
    rng = random.Random(5)
    start = datetime(2026, 10, 20, tzinfo=UTC)
    tag_sets: list[tuple[str, ...]] = [
        ("client:acme",),
        ("client:acme", "team:web"),
        ("client:initech",),
        ("client:globex",),
        ("client:acme", "client:initech"),
        (),
        ("vendor:claude-code", "client:acme"),
    ]
    models = [("claude-sonnet-4-5", "anthropic"), ("gpt-4.1-mini", "openai"), ("no-such-model", "nobody")]
    calls = []
    for _ in range(80):
        at = start + timedelta(seconds=rng.randrange(20 * 86400), microseconds=rng.randrange(10**6))
        tags = rng.choice(tag_sets)
        profile = "globex" if "client:globex" in tags else "claude-code" if "vendor:claude-code" in tags else "acme"
        model, provider = rng.choice(models)
        calls.append(_call(profile, at, tags, model=model, provider=provider))
    return calls


@pytest.fixture
async def spread(console_db: Seeded, nats_url: str) -> list[ev.ModelCallCompleted]:
    """`spread_calls()` and this month's calls, billed by billing."""
    calls = spread_calls() + this_month_calls()
    acks = await publish_all(nats_url, calls)
    async with billing(nats_url, console_db.dsn):
        await wait_for_position(console_db.dsn, "billing", acks[-1].seq, table="billing_positions")
    return calls


#: The reference: the queries over `model_calls` alone, filtered their own way ($3 profile, $4 model, $5 the tags
#: each call must carry; $6 the tag prefix), never through the rollup.
RAW_RANGE = "created_at >= $1 AND ($2::timestamptz IS NULL OR created_at < $2)"
RAW_FILTER = "($3::text IS NULL OR profile_id = $3) AND ($4::text IS NULL OR model = $4) AND tags @> $5::text[]"
NO_KEY_TAG = "NOT EXISTS (SELECT 1 FROM unnest(tags) AS k WHERE starts_with(k, $6))"
RAW_EXPRESSIONS = {**GROUP_EXPRESSIONS, "origin": ORIGIN}
SUM_NAMES = (
    "usd",
    "calls",
    "unpriced_calls",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
TABLES = {"tag": "by_tag", "model": "by_model", "provider": "by_provider", "profile": "by_profile"}
TABLES |= {"day": "by_day", "origin": "by_origin"}


@dataclass
class Asked:
    since: datetime
    until: datetime | None
    tag_key: str = "client"
    has_tag: tuple[str, ...] = ()
    profile: str | None = None
    model: str | None = None
    interval: str = "day"
    stack: str = "tag"

    def query(self) -> str:
        q: list[tuple[str, str]] = [("since", self.since.isoformat()), ("tag", self.tag_key)]
        q += [("until", self.until.isoformat())] if self.until else []
        q += [("has_tag", t) for t in self.has_tag]
        q += [("profile", self.profile)] if self.profile else []
        q += [("model", self.model)] if self.model else []
        q += [("interval", self.interval), ("stack", self.stack)]
        return urllib.parse.urlencode(q)

    def args(self) -> list[Any]:
        return [self.since, self.until, self.profile, self.model, list(self.has_tag)]


def _sums(record: Any) -> tuple[Any, ...]:
    """A raw row's sums, in `_as_report`'s order after the group."""
    return tuple(record[c] for c in SUM_NAMES)


def _add(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...]:
    usd = b[0] if a[0] is None else a[0] if b[0] is None else a[0] + b[0]
    return (usd, *(x + y for x, y in zip(a[1:], b[1:], strict=True)))


async def raw_table(conn: Any, asked: Asked, kind: str) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None]:
    """One grouping's rows (group, sums) over model_calls, and its (none) row for the tag grouping."""
    args = asked.args()
    if kind == "tag":
        rows = await conn.fetch(
            f"SELECT tag AS grp, {AGGREGATES} FROM model_calls, unnest(tags) AS tag "
            f"WHERE starts_with(tag, $6) AND {RAW_RANGE} AND {RAW_FILTER} "
            "GROUP BY tag ORDER BY usd DESC NULLS LAST, grp",
            *args,
            f"{asked.tag_key}:",
        )
        none = await conn.fetchrow(
            f"SELECT {AGGREGATES} FROM model_calls WHERE {RAW_RANGE} AND {RAW_FILTER} AND {NO_KEY_TAG}",
            *args,
            f"{asked.tag_key}:",
        )
        return [(r["grp"], *_sums(r)) for r in rows], (_sums(none) if none["calls"] else None)
    order = "grp" if kind == "day" else "usd DESC NULLS LAST, grp"
    rows = await conn.fetch(
        f"SELECT {RAW_EXPRESSIONS[kind]} AS grp, {AGGREGATES} FROM model_calls WHERE {RAW_RANGE} AND {RAW_FILTER} "
        f"GROUP BY grp ORDER BY {order}",
        *args,
    )
    return [(r["grp"], *_sums(r)) for r in rows], None


def _time_label(unit: str) -> str:
    shape = "YYYY-MM-DD HH24:00" if unit == "hour" else "YYYY-MM-DD"
    return f"to_char(date_trunc('{unit}', created_at AT TIME ZONE 'UTC'), '{shape}')"


async def raw_times(conn: Any, asked: Asked) -> dict[str, tuple[Any, ...]]:
    """The sums of each day or hour with calls."""
    rows = await conn.fetch(
        f"SELECT {_time_label(asked.interval)} AS t, {AGGREGATES} FROM model_calls "
        f"WHERE {RAW_RANGE} AND {RAW_FILTER} GROUP BY t",
        *asked.args(),
    )
    return {r["t"]: _sums(r) for r in rows}


async def raw_stacks(conn: Any, asked: Asked, top: list[str]) -> dict[tuple[str, str], tuple[Any, ...]]:
    """The sums of each (time, stack): a tag of the key (every one a call carries), else a grouping; the groups
    past `top` summed as (other), the calls without a tag of the key as (none)."""
    t = _time_label(asked.interval)
    if asked.stack == "tag":
        rows = await conn.fetch(
            f"SELECT {t} AS t, tag AS grp, {AGGREGATES} FROM model_calls, unnest(tags) AS tag "
            f"WHERE starts_with(tag, $6) AND {RAW_RANGE} AND {RAW_FILTER} GROUP BY 1, 2 "
            f"UNION ALL SELECT {t}, NULL, {AGGREGATES} FROM model_calls "
            f"WHERE {RAW_RANGE} AND {RAW_FILTER} AND {NO_KEY_TAG} GROUP BY 1",
            *asked.args(),
            f"{asked.tag_key}:",
        )
    else:
        rows = await conn.fetch(
            f"SELECT {t} AS t, {RAW_EXPRESSIONS[asked.stack]} AS grp, {AGGREGATES} FROM model_calls "
            f"WHERE {RAW_RANGE} AND {RAW_FILTER} GROUP BY 1, 2",
            *asked.args(),
        )
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for r in rows:
        label = "(none)" if r["grp"] is None else r["grp"] if r["grp"] in top else "(other)"
        key = (r["t"], label)
        out[key] = _add(out[key], _sums(r)) if key in out else _sums(r)
    return out


def _label_of(at: str, interval: str) -> str:
    return datetime.fromisoformat(at).strftime("%Y-%m-%d %H:00" if interval == "hour" else "%Y-%m-%d")


async def assert_page_is_raw(client: aiohttp.ClientSession, conn: Any, asked: Asked) -> dict[str, Any]:
    """Every table, the total, the statuses, each time and each stack of the page are the raw queries' sums."""
    page: dict[str, Any] = await get_json(client, "/api/costs?" + asked.query())
    assert page["filters"] == {"has_tag": list(asked.has_tag), "profile": asked.profile, "model": asked.model}
    total = await conn.fetchrow(
        f"SELECT {AGGREGATES} FROM model_calls WHERE {RAW_RANGE} AND {RAW_FILTER}", *asked.args()
    )
    assert _as_report(page["total"])[1:] == _sums(total), asked
    for kind, key in TABLES.items():
        rows, none = await raw_table(conn, asked, kind)
        assert [_as_report(r) for r in page[key]["rows"]] == rows, (kind, asked)
        if kind == "tag":
            assert (_as_report(page[key]["untagged"])[1:] if page[key]["untagged"] else None) == none, asked
    # Over time: every day or hour from the first to the last, each call once, and the stacks.
    series = page["over_time"]
    assert series["interval"] == asked.interval
    times = await raw_times(conn, asked)
    shown = {r["label"]: _as_report(r)[1:] for r in series["by_time"]["rows"]}
    assert {t: s for t, s in shown.items() if s[1]} == times, asked
    labels = [r["label"] for r in series["by_time"]["rows"]]
    assert labels == sorted(labels) and len(set(labels)) == len(labels)
    if times:
        step = timedelta(hours=1) if asked.interval == "hour" else timedelta(days=1)
        starts = [datetime.fromisoformat(r["group"]) for r in series["by_time"]["rows"]]
        assert all(b - a == step for a, b in itertools.pairwise(starts))
        assert min(times) >= labels[0] and max(times) <= labels[-1]
    top = [s for s in series["stacks"] if s not in ("(none)", "(other)")]
    assert top == [r["group"] for r in page[TABLES[asked.stack]]["rows"][:8]]
    points = {
        (_label_of(p["at"], asked.interval), p["row"]["label"]): _as_report(p["row"])[1:] for p in series["points"]
    }
    assert points == await raw_stacks(conn, asked, top), asked
    return page


async def test_one_clients_costs_by_model_and_by_day(
    console: RunningConsole, console_db: Seeded, spread: list[ev.ModelCallCompleted]
) -> None:
    """The question the page exists for: what did client acme cost, by model, by day."""
    client, _ = await console.signed_in("olivia")
    since, until = datetime(2026, 10, 20, tzinfo=UTC), datetime(2026, 11, 10, 6, 30, tzinfo=UTC)
    every = [e for e in (*console_db.events, *spread) if isinstance(e, ev.ModelCallCompleted)]
    acme = [c for c in every if "client:acme" in c.tags and since <= c.occurred_at < until]
    conn = await connect(console_db.dsn)
    try:
        asked = Asked(since, until, has_tag=("client:acme",), stack="model")
        page = await assert_page_is_raw(client, conn, asked)
        assert page["total"]["calls"] == len(acme) > 20
        assert {r["group"] for r in page["by_profile"]["rows"]} == {"acme", "claude-code"}
        assert {r["group"] for r in page["by_tag"]["rows"]} == {"client:acme", "client:initech"}
        by_day = {r["label"]: r["calls"] for r in page["over_time"]["by_time"]["rows"] if r["calls"]}
        expected: dict[str, int] = {}
        for c in acme:
            day = c.occurred_at.date().isoformat()
            expected[day] = expected.get(day, 0) + 1
        assert by_day == expected
        # The same for a profile, a model, two tag values at once, per hour and stacked by the tag key.
        await assert_page_is_raw(client, conn, Asked(since, until, profile="globex", stack="provider"))
        await assert_page_is_raw(client, conn, Asked(since, until, model="no-such-model", stack="profile"))
        await assert_page_is_raw(client, conn, Asked(since, until, has_tag=("client:acme", "client:initech")))
        hours = Asked(
            datetime(2026, 10, 25, 6, 30, tzinfo=UTC), datetime(2026, 11, 2, 12, 15, tzinfo=UTC), interval="hour"
        )
        page = await assert_page_is_raw(client, conn, hours)
        assert page["over_time"]["by_time"]["rows"][0]["label"] <= "2026-10-25 06:00"
        await assert_page_is_raw(client, conn, replace_asked(hours, has_tag=("client:acme",), stack="origin"))
    finally:
        await conn.close()

    # The page: only acme's calls, said; each table's groups link to their own filter.
    async with client.get("/costs?" + asked.query()) as r:
        assert r.status == 200
        html = await r.text()
    assert "Only the calls" in html and '<span class="tag">client:acme</span>' in html
    assert 'href="/costs?since=' in html and "has_tag=client%3Aacme" in html
    assert '<svg class="chart time-chart" id="chart-time" role="img"' in html
    assert "Calls per day" not in html and "Cost per day (UTC), stacked by model" in html
    # The CSVs of the chart: per day, and per day and stack.
    async with client.get("/api/costs.csv?" + asked.query() + "&group_by=time") as r:
        assert r.status == 200 and "client-acme" in r.headers["Content-Disposition"]
        per_day = list(csv.reader(io.StringIO(await r.text())))
    assert per_day[0][:3] == ["day", "usd", "calls"]
    assert {row[0]: int(row[2]) for row in per_day[1:-1] if int(row[2])} == expected
    assert per_day[-1][0] == "(total: each call once)" and int(per_day[-1][2]) == len(acme)
    async with client.get("/api/costs.csv?" + asked.query() + "&group_by=series") as r:
        stacked = list(csv.reader(io.StringIO(await r.text())))
    assert stacked[0][:4] == ["day", "model", "usd", "calls"]
    assert sum(int(row[3]) for row in stacked[1:]) == len(acme)


def replace_asked(asked: Asked, **changes: Any) -> Asked:
    return dataclasses.replace(asked, **changes)


async def test_filters_over_random_ranges_are_the_raw_queries(
    console: RunningConsole, console_db: Seeded, spread: list[ev.ModelCallCompleted]
) -> None:
    """Filtered, per day (the rollup for whole days) and per hour (model_calls), over random ranges: every table,
    time and stack is the raw queries' over model_calls, to the digit."""
    client, _ = await console.signed_in("olivia")
    rng = random.Random(23)
    first = datetime(2026, 10, 18, tzinfo=UTC)
    filters: list[dict[str, Any]] = [
        {},
        {"has_tag": ("client:acme",)},
        {"has_tag": ("client:initech",), "profile": "acme"},
        {"model": "claude-sonnet-4-5"},
        {"profile": "claude-code", "has_tag": ("vendor:claude-code",)},
        {"has_tag": ("team:web",), "model": "no-such-model"},
    ]
    conn = await connect(console_db.dsn)
    try:
        compared = 0
        for i in range(12):
            since = first + timedelta(seconds=rng.randrange(24 * 86400), microseconds=rng.randrange(10**6))
            interval = "hour" if i % 3 == 0 else "day"
            longest = 31 * 24 - 1 if interval == "hour" else 24 * 40
            until: datetime | None = since + timedelta(hours=rng.randrange(1, longest), seconds=rng.randrange(3600))
            if interval == "day" and rng.random() < 0.3:
                until = None
            asked = Asked(
                since,
                until,
                tag_key=rng.choice(["client", "client", "team"]),
                interval=interval,
                stack=rng.choice(["tag", "model", "provider", "profile", "origin"]),
                **rng.choice(filters),
            )
            page = await assert_page_is_raw(client, conn, asked)
            compared += page["total"]["calls"] > 0
        assert compared >= 8
    finally:
        await conn.close()


async def test_a_tag_value_typed_as_the_key_is_said_on_the_page(
    console: RunningConsole, console_db: Seeded, billed: list[ev.ModelCallCompleted]
) -> None:
    """Issue 32: `client:acme` typed in "Group by tag key" was a 422 the page never showed (htmx swaps only
    successes, and the answer was the bare error page). Now the page answers with its form as typed and the
    error where the tables were, and the link that shows client acme's calls."""
    client, _ = await console.signed_in("olivia")
    async with client.get("/costs?tag=client%3Aacme&since=2026-11-01") as r:
        assert r.status == 422
        html = await r.text()
    assert '<form class="filters costs-filters"' in html
    assert 'name="tag" value="client:acme"' in html and 'name="since" value="2026-11-01"' in html
    error = html.split('<div class="costs-error" role="alert">')[1].split("</div>")[0]
    assert "&#39;client:acme&#39; is a tag value, not a key to group by" in error
    assert 'href="/costs?since=2026-11-01&amp;has_tag=client%3Aacme"' in error
    assert 'id="by-tag"' not in html  # no stale or empty table
    async with client.get("/costs?since=2026-11-01&has_tag=client%3Aacme") as r:
        assert r.status == 200
        assert "Only the calls" in await r.text()
    async with client.get("/api/costs?tag=client:acme") as r:
        assert r.status == 422
        assert "is a tag value, not a key to group by" in (await r.json())["detail"]
    # Every other parameter it cannot use is said on the page the same way.
    for query, said in [
        ("since=yesterday", "since: &#39;yesterday&#39; is not a date"),
        ("has_tag=client", "has_tag: &#39;client&#39; is a tag key: filter by a tag value"),
        ("has_tag=Client:acme", "upper case in the key"),
        ("since=2026-11-02&until=2026-11-01", "until: the end of the range must be after its start"),
        ("interval=week", "interval: &#39;week&#39; is not one of day, hour"),
        ("since=2026-01-01&interval=hour", "per hour shows at most 31 days"),
    ]:
        async with client.get("/costs?" + query) as r:
            assert r.status == 422, query
            html = await r.text()
        assert '<div class="costs-error" role="alert">' in html and said in html, query
        async with client.get("/api/costs?" + query) as r:
            assert r.status == 422, query


async def test_the_range_says_which_calls_it_leaves_out(
    console: RunningConsole, console_db: Seeded, spread: list[ev.ModelCallCompleted]
) -> None:
    """The default range (this month) hid the older calls without a word: now it counts them, says their first and
    last days and links to the range that holds them, filters kept."""
    client, _ = await console.signed_in("olivia")
    conn = await connect(console_db.dsn)
    try:
        month = await conn.fetchval("SELECT date_trunc('month', now())")
        before = await conn.fetchrow(
            "SELECT count(*) AS calls, min(created_at) AS first, max(created_at) AS last FROM model_calls "
            "WHERE created_at < $1 AND 'client:acme' = ANY(tags)",
            month,
        )
    finally:
        await conn.close()
    page = await get_json(client, "/api/costs?has_tag=client:acme")
    first, last = before["first"].date(), before["last"].date()
    assert page["outside"] == {
        "before": before["calls"],
        "after": 0,
        "first_day": first.isoformat(),
        "last_day": last.isoformat(),
    }
    assert before["calls"] > 20
    async with client.get("/costs?has_tag=client:acme") as r:
        html = await r.text()
    said = f"{before['calls']:,} call(s) outside this range ({before['calls']:,} before it), from {first} to {last}"
    assert said in html
    widen = f'href="/costs?has_tag=client%3Aacme&amp;since={first}" class="widen"'
    assert widen in html
    widened = await get_json(client, f"/api/costs?has_tag=client:acme&since={first}")
    assert widened["outside"]["before"] == 0 and widened["total"]["calls"] == page["total"]["calls"] + before["calls"]
    # A closed range counts the calls after it too, and its link leaves the end open.
    page = await get_json(client, "/api/costs?since=2026-10-25&until=2026-10-30&has_tag=client:acme")
    assert page["outside"]["before"] > 0 and page["outside"]["after"] > 0
    async with client.get("/costs?since=2026-10-25&until=2026-10-30&has_tag=client:acme") as r:
        html = await r.text()
    assert f'href="/costs?since={page["outside"]["first_day"]}&amp;has_tag=client%3Aacme" class="widen"' in html


def test_the_time_chart_is_escaped_and_accessible() -> None:
    from commonos.accounting.cost_queries import CostRow
    from commonos.console.pages.costs import CostSeries, CostTable, SeriesPoint, time_chart

    at = datetime(2026, 11, 3, tzinfo=UTC)

    def row(group: str | None, label: str, usd: str | None, calls: int) -> CostRow:
        return CostRow(group, label, Decimal(usd) if usd else None, calls, 0 if usd else calls, 0, 0, 0, 0, 0)

    series = CostSeries(
        interval="day",
        stack_by="model",
        stacks=["<script>x</script>", "(other)"],
        by_time=CostTable(
            group_by="day",
            rows=[
                row(at.isoformat(), "2026-11-03", "3", 3),
                row((at + timedelta(days=1)).isoformat(), "2026-11-04", None, 0),
            ],
        ),
        points=[
            SeriesPoint(at=at, row=row("<script>x</script>", "<script>x</script>", "2", 2)),
            SeriesPoint(at=at, row=row(None, "(other)", "1", 1)),
        ],
    )
    svg = str(time_chart("t", series, "usd"))
    assert svg.startswith('<svg class="chart time-chart" id="t" role="img" aria-labelledby="t-t t-d"')
    assert "<script>" not in svg and "&lt;script&gt;x&lt;/script&gt;, 2026-11-03: $2.0000 (2 calls)" in svg
    assert '<title id="t-t">Cost per day (UTC), stacked by model</title>' in svg
    assert "2 days from 2026-11-03 to 2026-11-04; the largest: 2026-11-03 $3.0000" in svg
    # The stacked segments are as tall as their share: $2 and $1 of an axis topped at $5.
    heights = [float(h) for h in re.findall(r'height="([^"]+)" fill="#[0-9a-f]{6}"><title>', svg)]
    assert heights == pytest.approx([220 * 2 / 5, 220 * 1 / 5], abs=0.01)
    assert "style=" not in svg and "<script" not in svg
    empty = series.model_copy(update={"points": [], "by_time": CostTable(group_by="day", rows=[])})
    assert "No calls in this range" in str(time_chart("e", empty, "calls"))
