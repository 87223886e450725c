"""Costs: what the model calls cost (/costs, /api/costs, /api/costs.csv), grouped as `cos report cost` groups them.

Every table is `model_calls` (billing's projection) over a time range of the calls' own times: `since` (default
the start of the current month as the database sees it, `date_trunc('month', now())`) to `until` (exclusive,
default open), grouped by a tag key (each call counted once in every `<key>:` group it carries; the calls
without one form the "(none)" row), by model, provider, profile, day (UTC) and origin (the loop's own calls, or
the vendor of imported Claude Code / Codex work: the `vendor:` tag). The sums are PostgreSQL's exact numeric
sums, as `cos report cost` makes them (services/billing/commonos/billing/report.py): the same SQL shapes, the
same grouping and ordering, the total counting each call once. Like it, the page reads billing's daily rollup
(`model_call_days`) for the range's whole UTC days and `model_calls` for the parts of days at its ends
(`commonos.accounting.cost_queries.days_args`): the same sums as `model_calls` alone, read from far fewer rows.
Unpriced calls (`cost_status` unpriced) are counted in every row (`unpriced_calls`) and never hidden; a group of
unpriced calls only has no USD (null).

Budgets are billing's: the running spend per budgeted tag and period (`budget_spend`), the alerts sent
(`budget_alerts`), and the limits of the budgets file (COS_BILLING_CONFIG, when the console can read it). Both
tables span every profile: only a reader the database lets read them (an operator) sees them.

An analyst reads as its database role: row-level security leaves it its profiles' calls only.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup, escape
from pydantic import BaseModel, Field

from commonos.accounting.cost_queries import DAYS_GROUP_EXPRESSIONS as REPORT_GROUPS
from commonos.accounting.cost_queries import (
    DAYS_SOURCE,
    DAYS_TOTAL_SQL,
    DAYS_UNTAGGED_SQL,
    TOTAL_LABEL,
    UNTAGGED_LABEL,
    CostRow,
    ReportError,
    days_args,
    days_grouped_sql,
    parse_when,
)
from commonos.accounting.csv_cells import cost_csv
from commonos.console.auth import SignedIn
from commonos.console.db import Database, get_db
from commonos.console.templating import render
from commonos.proto.vendors import CLAUDE_CODE, CODEX
from commonos.runtime.postgres import Conn

router = APIRouter(tags=["costs"])

Db = Annotated[Database, Depends(get_db)]

TAG_KEY: Final = re.compile(r"[a-z0-9_-]{1,64}")
#: The origin of a call: the vendor of imported work (its `vendor:` tag), else the loop's own.
LOOP_ORIGIN: Final = "loop"
ORIGIN: Final = (
    "coalesce((SELECT substr(t, 8) FROM unnest(tags) AS t WHERE starts_with(t, 'vendor:') ORDER BY t LIMIT 1), "
    f"'{LOOP_ORIGIN}')"
)
#: Group expressions over the rollup's rows and the calls of partial days (`cos report cost`'s, and origin).
GROUP_EXPRESSIONS: Final = {**REPORT_GROUPS, "origin": ORIGIN}
GROUPINGS: Final = ("tag", *GROUP_EXPRESSIONS)
#: The most groups a table shows (a tag key with more values than this is cut, and says so).
MAX_GROUPS: Final = 1000


class CostTable(BaseModel):
    #: "tag:client", "model", "provider", "profile", "day" or "origin".
    group_by: str
    rows: list[CostRow]
    #: Tag grouping: the calls that carry no tag of the key ("(none)"); null when there are none.
    untagged: CostRow | None = None
    #: More groups than MAX_GROUPS: the rest are left out of `rows` (the total still counts them).
    truncated: bool = False


class StatusRow(BaseModel):
    cost_status: str
    calls: int
    usd: Decimal | None


class BudgetView(BaseModel):
    name: str
    tag: str
    period: str
    period_start: datetime | None
    period_end: datetime | None
    #: From the budgets file (COS_BILLING_CONFIG), else from the last alert; null when neither is known.
    limit_usd: Decimal | None
    spent_usd: Decimal
    calls: int
    #: spent / limit, when the limit is known.
    used_fraction: float | None
    state: Literal["ok", "warning", "exceeded", "no limit known"]
    alerted_at: datetime | None


class BudgetAlertView(BaseModel):
    budget: str
    tag: str
    period: str
    period_start: datetime
    period_end: datetime
    limit_usd: Decimal
    spent_usd: Decimal
    published: bool
    sent_at: datetime


class Budgets(BaseModel):
    #: False when the reader may not read billing's budget tables (they span every profile).
    visible: bool
    #: Budgets in their current period (the spend of the period containing now, UTC).
    budgets: list[BudgetView] = Field(default_factory=list)
    #: The latest alerts, newest first.
    alerts: list[BudgetAlertView] = Field(default_factory=list)
    #: Where the limits came from, or why they are not known.
    note: str | None = None


class CostReport(BaseModel):
    since: datetime
    until: datetime | None
    tag_key: str
    #: Every call of the range once.
    total: CostRow
    by_tag: CostTable
    by_origin: CostTable
    by_model: CostTable
    by_provider: CostTable
    by_profile: CostTable
    by_day: CostTable
    by_status: list[StatusRow]
    budgets: Budgets
    notes: list[str]


# Queries.


#: Calls and USD per cost status (the USD null for unpriced calls).
STATUS_SQL: Final = f"""
    SELECT cost_status, coalesce(sum(calls), 0)::bigint AS calls,
           CASE WHEN sum(calls) > sum(unpriced_calls) THEN sum(usd) END AS usd
    FROM {DAYS_SOURCE}
    GROUP BY cost_status ORDER BY cost_status"""


async def _table(conn: Conn, kind: str, times: list[datetime], tag_key: str) -> CostTable:
    args: list[Any] = [*times, f"{tag_key}:"] if kind == "tag" else list(times)
    records = await conn.fetch(days_grouped_sql(kind, GROUP_EXPRESSIONS, MAX_GROUPS + 1, of_tags=("origin",)), *args)
    rows = [CostRow.from_record(r, r["grp"], str(r["grp"])) for r in records[:MAX_GROUPS]]
    untagged: CostRow | None = None
    if kind == "tag":
        found = await conn.fetchrow(DAYS_UNTAGGED_SQL, *args)
        if found is not None and found["calls"]:
            untagged = CostRow.from_record(found, None, UNTAGGED_LABEL)
    name = f"tag:{tag_key}" if kind == "tag" else kind
    return CostTable(group_by=name, rows=rows, untagged=untagged, truncated=len(records) > MAX_GROUPS)


# Budgets.


@dataclass(frozen=True)
class ConfiguredBudget:
    name: str
    tag: str
    period: str
    limit_usd: Decimal


def configured_budgets(path: str | None) -> tuple[list[ConfiguredBudget], str | None]:
    """The budgets of billing's file (COS_BILLING_CONFIG), read leniently: (budgets, a note when unreadable)."""
    if not path:
        return [], "limits from the alerts sent (COS_BILLING_CONFIG is not set for the console)"
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8"), parse_float=Decimal)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return [], f"COS_BILLING_CONFIG ({path}) cannot be read: {exc}"
    out: list[ConfiguredBudget] = []
    for table in document.get("budget", []):
        if not isinstance(table, dict):
            continue
        try:
            tag = str(table["tag"])
            period = str(table.get("period", "month"))
            limit = Decimal(str(table["limit_usd"]))
        except (KeyError, InvalidOperation):
            continue
        out.append(ConfiguredBudget(str(table.get("name") or f"{tag}/{period}"), tag, period, limit))
    return out, f"limits from {path}"


def current_period(period: str, now: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar day or month containing `now`, as billing's budgets count them."""
    now = now.astimezone(UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + timedelta(days=1)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def _state(spent: Decimal, limit: Decimal | None, alerted: bool) -> tuple[str, float | None]:
    if limit is None:
        return ("exceeded" if alerted else "no limit known"), None
    fraction = float(spent / limit) if limit > 0 else None
    if alerted or spent >= limit:
        return "exceeded", fraction
    return ("warning" if fraction is not None and fraction >= 0.8 else "ok"), fraction


async def load_budgets(conn: Conn, now: datetime) -> Budgets:
    readable = await conn.fetchval(
        "SELECT coalesce(has_table_privilege(to_regclass('public.budget_spend'), 'SELECT'), false) "
        "AND coalesce(has_table_privilege(to_regclass('public.budget_alerts'), 'SELECT'), false)"
    )
    if not readable:
        return Budgets(visible=False, note="budgets span every profile: operators see them")
    configured, note = configured_budgets(os.environ.get("COS_BILLING_CONFIG"))
    spend = await conn.fetch(
        "SELECT tag, period, period_start, period_end, spent_usd, calls FROM budget_spend "
        "WHERE period_start <= $1 AND $1 < period_end ORDER BY tag, period",
        now,
    )
    alert_rows = await conn.fetch(
        "SELECT budget, tag, period, period_start, period_end, limit_usd, spent_usd, published, sent_at "
        "FROM budget_alerts ORDER BY sent_at DESC, budget LIMIT 50"
    )
    alerts = [BudgetAlertView(**dict(r)) for r in alert_rows]
    spent = {(r["tag"], r["period"]): r for r in spend}
    views: list[BudgetView] = []
    seen: set[tuple[str, str]] = set()
    known = configured or []
    for budget in known:
        key = (budget.tag, budget.period)
        seen.add(key)
        row = spent.get(key)
        start, end = current_period(budget.period, now)
        alert = next((a for a in alerts if a.budget == budget.name and a.period_start == start), None)
        used = row["spent_usd"] if row is not None else Decimal(0)
        state, fraction = _state(used, budget.limit_usd, alert is not None)
        views.append(
            BudgetView(
                name=budget.name,
                tag=budget.tag,
                period=budget.period,
                period_start=start,
                period_end=end,
                limit_usd=budget.limit_usd,
                spent_usd=used,
                calls=row["calls"] if row is not None else 0,
                used_fraction=fraction,
                state=state,  # type: ignore[arg-type]
                alerted_at=alert.sent_at if alert is not None else None,
            )
        )
    for key, row in spent.items():
        if key in seen:
            continue
        # A budgeted tag the file (if any) no longer names, or no file: the limit of its latest alert.
        alert = next((a for a in alerts if (a.tag, a.period) == key), None)
        current = next((a for a in alerts if (a.tag, a.period) == key and a.period_start == row["period_start"]), None)
        limit = alert.limit_usd if alert is not None else None
        state, fraction = _state(row["spent_usd"], limit, current is not None)
        views.append(
            BudgetView(
                name=alert.budget if alert is not None else f"{key[0]}/{key[1]}",
                tag=key[0],
                period=key[1],
                period_start=row["period_start"],
                period_end=row["period_end"],
                limit_usd=limit,
                spent_usd=row["spent_usd"],
                calls=row["calls"],
                used_fraction=fraction,
                state=state,  # type: ignore[arg-type]
                alerted_at=current.sent_at if current is not None else None,
            )
        )
    return Budgets(visible=True, budgets=views, alerts=alerts, note=note)


async def load(conn: Conn, since: datetime | None, until: datetime | None, tag_key: str) -> CostReport:
    """The whole page in one snapshot (repeatable read), so that every table and the total agree."""
    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    resolved: datetime = since if since is not None else await conn.fetchval("SELECT date_trunc('month', now())")
    now: datetime = await conn.fetchval("SELECT now()")
    times = days_args(resolved, until)
    tables = {kind: await _table(conn, kind, times, tag_key) for kind in GROUPINGS}
    total = await conn.fetchrow(DAYS_TOTAL_SQL, *times)
    assert total is not None
    statuses = [StatusRow(**dict(r)) for r in await conn.fetch(STATUS_SQL, *times)]
    total_row = CostRow.from_record(total, None, TOTAL_LABEL)
    notes = [
        f"Each call is counted once in every {tag_key}: group it carries, so those groups can add up to more than "
        "the total; the total counts each call once."
    ]
    if total_row.unpriced_calls:
        notes.append(
            f"{total_row.unpriced_calls} call(s) have no price (cost_status unpriced): they are counted as calls, not "
            "in USD. Add a price (COS_PRICE_FILE) and run `cos billing reprice`."
        )
    for table in tables.values():
        if table.truncated:
            notes.append(f"Only the first {MAX_GROUPS} groups by {table.group_by} are shown.")
    return CostReport(
        since=resolved,
        until=until,
        tag_key=tag_key,
        total=total_row,
        by_tag=tables["tag"],
        by_origin=tables["origin"],
        by_model=tables["model"],
        by_provider=tables["provider"],
        by_profile=tables["profile"],
        by_day=tables["day"],
        by_status=statuses,
        budgets=await load_budgets(conn, now),
        notes=notes,
    )


# Parameters.


def parse_time(name: str, raw: str | None, now: datetime | None = None) -> datetime | None:
    """`cos report cost`'s times (`commonos.accounting.cost_queries.parse_when`); blank: none; else 422."""
    if raw is None or not raw.strip():
        return None
    try:
        return parse_when(raw, now)
    except ReportError as exc:
        raise HTTPException(422, f"{name}: {exc}") from None


TIME_HELP: Final = "a date (2026-11-01, UTC), an ISO date-time (no offset: UTC) or a span ago (7d, 12h, 30m)"


@dataclass(frozen=True)
class Range:
    since: datetime | None
    until: datetime | None
    tag_key: str


def _range(
    since: Annotated[str | None, Query(max_length=64, description="first call time; " + TIME_HELP)] = None,
    until: Annotated[str | None, Query(max_length=64, description="end of the range, exclusive; " + TIME_HELP)] = None,
    tag: Annotated[
        str, Query(max_length=64, description="the tag key to group by (client: every client:* tag)")
    ] = "client",
) -> Range:
    key = tag.strip().removeprefix("tag:").rstrip(":")
    if not TAG_KEY.fullmatch(key):
        raise HTTPException(422, "tag: a tag key is lower-case letters, digits, _ and - (client)")
    return Range(parse_time("since", since), parse_time("until", until), key)


RangeParams = Annotated[Range, Depends(_range)]


@router.get("/api/costs", response_model=CostReport)
async def api_costs(who: SignedIn, db: Db, r: RangeParams) -> CostReport:
    """Cost of the model calls over a time range by a tag key, origin, model, provider, profile, day and cost status,
    with the budgets; the totals are those of `cos report cost`."""
    async with db.reader(who.user) as conn:
        return await load(conn, r.since, r.until, r.tag_key)


# CSV.


def report_csv(report: CostReport, group_by: str) -> str:
    """One grouping as CSV, laid out as `cos report cost --format csv` (one function writes both): the groups,
    (none), the total."""
    table = _pick(report, group_by)
    rows = [*table.rows, *([table.untagged] if table.untagged else []), report.total]
    return cost_csv(table.group_by, [(row.label, row) for row in rows])


def _pick(report: CostReport, group_by: str) -> CostTable:
    return {
        "tag": report.by_tag,
        "origin": report.by_origin,
        "model": report.by_model,
        "provider": report.by_provider,
        "profile": report.by_profile,
        "day": report.by_day,
    }[group_by]


@router.get(
    "/api/costs.csv",
    response_class=Response,
    responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}, "description": "the table as CSV"}},
)
async def api_costs_csv(
    who: SignedIn,
    db: Db,
    r: RangeParams,
    group_by: Annotated[
        Literal["tag", "origin", "model", "provider", "profile", "day"],
        Query(description="which table: tag (by the `tag` key), origin, model, provider, profile or day"),
    ] = "tag",
) -> Response:
    """One of the page's tables as CSV (cells a spreadsheet would take for a formula are quoted with ')."""
    async with db.reader(who.user) as conn:
        report = await load(conn, r.since, r.until, r.tag_key)
    name = f"cost-by-{r.tag_key if group_by == 'tag' else group_by}-{report.since:%Y%m%d}.csv"
    return Response(
        report_csv(report, group_by),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


# The chart: server-rendered SVG, no script.

CHART_WIDTH: Final = 640
BAR_HEIGHT: Final = 22
LABEL_WIDTH: Final = 200
COLOURS: Final = {"loop": "#1f5fbf", CLAUDE_CODE: "#c2571a", CODEX: "#1d7a43"}


def _money(value: Decimal | None) -> str:
    if value is None:
        return "no price"
    return f"${value:,.4f}"


def bar_chart(chart_id: str, title: str, rows: list[CostRow], colour_of: dict[str, str] | None = None) -> Markup:
    """Horizontal bars of each row's USD, as an accessible SVG image (title, description, a label per bar).

    Every piece of text is escaped: group names are tag values, models, profiles (data, not markup)."""
    shown = rows[:31]
    height = max(1, len(shown)) * BAR_HEIGHT + 10
    top = max((r.usd or Decimal(0) for r in shown), default=Decimal(0))
    scale = (CHART_WIDTH - LABEL_WIDTH - 110) / float(top) if top > 0 else 0.0
    parts: list[str] = []
    desc = "; ".join(f"{r.label}: {_money(r.usd)}, {r.calls} calls" for r in shown) or "no calls"
    parts.append(
        f'<svg class="chart" id="{escape(chart_id)}" role="img" aria-labelledby="{escape(chart_id)}-t '
        f'{escape(chart_id)}-d" viewBox="0 0 {CHART_WIDTH} {height}" width="{CHART_WIDTH}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg">'
    )
    parts.append(f'<title id="{escape(chart_id)}-t">{escape(title)}</title>')
    parts.append(f'<desc id="{escape(chart_id)}-d">{escape(desc)}</desc>')
    for i, r in enumerate(shown):
        y = 5 + i * BAR_HEIGHT
        width = float(r.usd or 0) * scale
        label = r.label if len(r.label) <= 28 else r.label[:27] + "…"
        colour = (colour_of or {}).get(r.label, "#1f5fbf")
        parts.append("<g>")
        parts.append(
            f'<text x="{LABEL_WIDTH - 6}" y="{y + 15}" text-anchor="end" font-size="12" fill="currentColor">'
            f"{escape(label)}</text>"
        )
        parts.append(
            f'<rect x="{LABEL_WIDTH}" y="{y + 3}" width="{width:.1f}" height="{BAR_HEIGHT - 6}" fill="{colour}">'
            f"<title>{escape(r.label)}: {escape(_money(r.usd))} ({r.calls} calls, {r.unpriced_calls} unpriced)"
            "</title></rect>"
        )
        parts.append(
            f'<text x="{LABEL_WIDTH + width + 6:.1f}" y="{y + 15}" font-size="12" fill="currentColor">'
            f"{escape(_money(r.usd))}{' *' if r.unpriced_calls else ''}</text>"
        )
        parts.append("</g>")
    parts.append("</svg>")
    # Built from escaped parts and numbers only.
    return Markup("".join(parts))


@router.get("/costs", include_in_schema=False, response_class=HTMLResponse)
async def costs_page(request: Request, who: SignedIn, db: Db, r: RangeParams) -> HTMLResponse:
    async with db.reader(who.user) as conn:
        report = await load(conn, r.since, r.until, r.tag_key)
    query = {k: v for k, v in request.query_params.items() if k in ("since", "until", "tag") and v.strip()}
    charts = {
        "tag": bar_chart("chart-tag", f"Cost by {report.by_tag.group_by}", report.by_tag.rows),
        "origin": bar_chart(
            "chart-origin", "Cost by origin: the loop and imported work", report.by_origin.rows, COLOURS
        ),
        "day": bar_chart("chart-day", "Cost by day (UTC), the last 31 days of the range", report.by_day.rows[-31:]),
    }
    tables = [
        ("origin", "By origin (the loop's own calls and imported Claude Code / Codex work)", report.by_origin),
        ("model", "By model", report.by_model),
        ("provider", "By provider", report.by_provider),
        ("profile", "By profile", report.by_profile),
        ("day", "By day (UTC)", report.by_day),
    ]
    return render(request, "costs.html", {"report": report, "charts": charts, "tables": tables, "query": query, "r": r})
