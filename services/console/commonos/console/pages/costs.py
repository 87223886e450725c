"""Costs: what the model calls cost (/costs, /api/costs, /api/costs.csv), grouped as `cos report cost` groups them,
filtered as people ask (one tag value such as `client:acme`, a profile, a model) and shown over time.

Every table is `model_calls` (billing's projection) over a time range of the calls' own times: `since` (default
the start of the current month as the database sees it, `date_trunc('month', now())`) to `until` (exclusive,
default open), grouped by a tag key (a call that carries two tags of the key is counted in the group of each; the
calls without one form the "(none)" row), by model, provider, profile, day (UTC) and origin (the loop's own
calls, or the vendor of imported Claude Code / Codex work: the `vendor:` tag). The sums are PostgreSQL's exact
numeric sums, as `cos report cost` makes them (services/billing/commonos/billing/report.py): the same SQL shapes,
the same grouping and ordering, the total counting each call once. Like it, the page reads billing's daily
rollup (`model_call_days`) for the range's whole UTC days and `model_calls` for the parts of days at its ends
(`commonos.accounting.cost_queries.days_args`): the same sums as `model_calls` alone, read from far fewer rows.

The filters (`has_tag`, `profile`, `model`) read only the rollup's key, so every table stays exact under them.
Over time, the calls per UTC day come from the rollup the same way; per UTC hour, which the rollup cannot say,
from `model_calls` (a range of at most `MAX_HOUR_DAYS` days, so that the chart keeps one bar per hour). Each
time's bar is stacked by the tag key (each call in each of its groups, as the tag table counts) or by model,
provider, profile or origin (each call once); the `MAX_STACKS` largest groups of the range get a colour each,
the rest are "(other)".

The calls the range leaves out are counted (before it, after it, their first and last days) and the page links
to the range that holds them, filters kept. A parameter the page cannot use is said on the page (422), the form
kept as typed; a tag value typed as the key to group by gets the link that shows that value's calls.

Unpriced calls (`cost_status` unpriced) are counted in every row (`unpriced_calls`) and never hidden; a group of
unpriced calls only has no USD (null).

Budgets are billing's: the running spend per budgeted tag and period (`budget_spend`), the alerts sent
(`budget_alerts`), and the limits of the budgets file (COS_BILLING_CONFIG, when the console can read it). Both
tables span every profile: only a reader the database lets read them (an operator) sees them. They are not
filtered.

An analyst reads as its database role: row-level security leaves it its profiles' calls only.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response
from markupsafe import Markup, escape
from pydantic import BaseModel, Field

from commonos.accounting.cost_queries import (
    DAYS_AGGREGATES,
    FIRST_INSTANT,
    STATUS_KIND,
    SUM_COLUMNS,
    TOTAL_KIND,
    TOTAL_LABEL,
    UNTAGGED_KIND,
    UNTAGGED_LABEL,
    CallFilter,
    CostRow,
    ReportError,
    days_args,
    days_calls_sql,
    days_source,
    days_tables_sql,
    hours_source,
    parse_when,
    tag_counting_note,
)
from commonos.accounting.cost_queries import DAYS_GROUP_EXPRESSIONS as REPORT_GROUPS
from commonos.accounting.csv_cells import COST_COLUMNS, cost_csv, csv_table
from commonos.console.auth import SignedIn
from commonos.console.db import Database, get_db
from commonos.console.templating import render
from commonos.proto.errors import DataError
from commonos.proto.tags import InvalidTag, parse_tag
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

Interval = Literal["day", "hour"]
#: What each time's bar is stacked by: the tag key of the page (`tag`), or a grouping of each call once.
Stack = Literal["tag", "model", "provider", "profile", "origin"]
Measure = Literal["usd", "calls"]
#: The groups of the range that get a bar segment (and a colour) of their own; the rest are "(other)".
MAX_STACKS: Final = 8
#: The most times the chart and its table show (the last ones of the range when it has more).
MAX_BUCKETS: Final = 1000
#: The longest range shown per hour (one bar an hour: 744 at most).
MAX_HOUR_DAYS: Final = 31
#: The most tag values a filter takes (each call must carry all of them).
MAX_FILTER_TAGS: Final = 8
OTHER_LABEL: Final = "(other)"


class CostTable(BaseModel):
    #: "tag:client", "model", "provider", "profile", "day", "hour" or "origin".
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


class Filters(BaseModel):
    """Which calls every table, the total and the chart count (the budgets are not filtered)."""

    #: Tag values each counted call carries, all of them (`client:acme`); empty: any.
    has_tag: list[str] = Field(default_factory=list)
    profile: str | None = None
    model: str | None = None


class OutsideRange(BaseModel):
    """The calls of the filters that the time range leaves out."""

    #: Calls before `since`.
    before: int
    #: Calls at or after `until` (0 when it is open).
    after: int
    #: The UTC days of the first and of the last of them; null when there are none.
    first_day: date | None
    last_day: date | None


class SeriesPoint(BaseModel):
    #: The start of the UTC day or hour.
    at: datetime
    #: The sums of one stack in that time: `group` null for "(none)" (no tag of the key) and for "(other)".
    row: CostRow


class CostSeries(BaseModel):
    """Cost over time: per UTC day or hour, each time's calls stacked by a tag key or a grouping."""

    interval: Interval
    #: "tag:client", "model", "provider", "profile" or "origin".
    stack_by: str
    #: The stacks' labels: the largest groups of the range first, then "(none)" and "(other)" when present.
    stacks: list[str]
    #: Every time from the first to the last the range shows, empty ones included, oldest first; each call once.
    by_time: CostTable
    #: The stacks of each time (empty ones left out), oldest first.
    points: list[SeriesPoint]
    #: More times than MAX_BUCKETS: only the last ones are shown (the tables and the total count them all).
    truncated: bool = False


class CostReport(BaseModel):
    since: datetime
    until: datetime | None
    tag_key: str
    filters: Filters
    #: Every call of the range once.
    total: CostRow
    by_tag: CostTable
    by_origin: CostTable
    by_model: CostTable
    by_provider: CostTable
    by_profile: CostTable
    by_day: CostTable
    by_status: list[StatusRow]
    over_time: CostSeries
    outside: OutsideRange
    budgets: Budgets
    notes: list[str]


# Parameters.


class ParamError(DataError):
    """A parameter the page cannot use: which one, why, and (maybe) the parameters that do what was meant."""

    def __init__(self, name: str, message: str, instead: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.instead = dict(instead) if instead is not None else None


TIME_HELP: Final = "a date (2026-11-01, UTC), an ISO date-time (no offset: UTC) or a span ago (7d, 12h, 30m)"
DEFAULTS: Final = {"tag": "client", "interval": "day", "stack": "tag", "measure": "usd"}


def parse_time(name: str, raw: str | None, now: datetime | None = None) -> datetime | None:
    """`cos report cost`'s times (`commonos.accounting.cost_queries.parse_when`); blank: none."""
    if raw is None or not raw.strip():
        return None
    try:
        return parse_when(raw, now)
    except ReportError as exc:
        raise ParamError(name, str(exc)) from None


def parse_tag_key(raw: str | None) -> str:
    """The tag key to group by (`client`, also written `tag:client` or `client:`); blank: client. A tag value
    (`client:acme`) is refused with the parameters that show that value's calls."""
    text = (raw or "").strip()
    key = text.removeprefix("tag:").rstrip(":") or DEFAULTS["tag"]
    if TAG_KEY.fullmatch(key):
        return key
    try:
        value = parse_tag(text.removeprefix("tag:"))
    except InvalidTag:
        raise ParamError(
            "tag", f"{text!r} is not a tag key: a key is lower-case letters, digits, _ and - (client)"
        ) from None
    key = value.split(":")[0]
    raise ParamError(
        "tag",
        f"{value!r} is a tag value, not a key to group by: to see only its calls, filter by it (has_tag) and group "
        f"by its key {key!r}",
        {"tag": key, "has_tag": value},
    )


def parse_tag_values(raws: Sequence[str]) -> tuple[str, ...]:
    """The tag values to filter by: each parameter may hold several, separated by spaces or commas."""
    values: list[str] = []
    for raw in raws:
        for item in re.split(r"[\s,]+", raw.strip()):
            if not item:
                continue
            if TAG_KEY.fullmatch(item):
                raise ParamError("has_tag", f"{item!r} is a tag key: filter by a tag value, key:value ({item}:acme)")
            try:
                values.append(parse_tag(item))
            except InvalidTag as exc:
                raise ParamError("has_tag", f"{exc}; a tag is key:value (client:acme)") from None
    if len(set(values)) > MAX_FILTER_TAGS:
        raise ParamError("has_tag", f"at most {MAX_FILTER_TAGS} tag values at once")
    return tuple(dict.fromkeys(values))


def _choice(name: str, raw: str | None, allowed: tuple[str, ...]) -> str:
    text = (raw or "").strip() or DEFAULTS[name]
    if text not in allowed:
        raise ParamError(name, f"{text!r} is not one of {', '.join(allowed)}")
    return text


def _text(name: str, raw: str | None, limit: int) -> str | None:
    text = (raw or "").strip()
    if len(text) > limit:
        raise ParamError(name, f"longer than {limit} characters")
    return text or None


@dataclass(frozen=True)
class Params:
    since: datetime | None
    until: datetime | None
    tag_key: str
    only: CallFilter = field(default_factory=CallFilter)
    interval: Interval = "day"
    stack: Stack = "tag"
    measure: Measure = "usd"

    @property
    def filters(self) -> Filters:
        return Filters(has_tag=list(self.only.tags), profile=self.only.profile, model=self.only.model)


def parse_params(query: Mapping[str, Sequence[str]], now: datetime | None = None) -> Params:
    """The page's and the API's parameters, each as typed (a ParamError names the first that cannot be used)."""

    def one(name: str) -> str | None:
        values = query.get(name) or []
        return values[-1] if values else None

    for name in ("since", "until"):
        if len(one(name) or "") > 64:
            raise ParamError(name, "longer than 64 characters")
    since = parse_time("since", one("since"), now)
    until = parse_time("until", one("until"), now)
    if since is not None and until is not None and until <= since:
        raise ParamError("until", "the end of the range must be after its start (since)")
    return Params(
        since=since,
        until=until,
        tag_key=parse_tag_key(_text("tag", one("tag"), 256)),
        only=CallFilter(
            profile=_text("profile", one("profile"), 64),
            model=_text("model", one("model"), 200),
            tags=parse_tag_values(query.get("has_tag") or []),
        ),
        interval=_choice("interval", one("interval"), get_args(Interval)),  # type: ignore[arg-type]
        stack=_choice("stack", one("stack"), get_args(Stack)),  # type: ignore[arg-type]
        measure=_choice("measure", one("measure"), get_args(Measure)),  # type: ignore[arg-type]
    )


def _api_params(
    since: Annotated[str | None, Query(max_length=64, description="first call time; " + TIME_HELP)] = None,
    until: Annotated[str | None, Query(max_length=64, description="end of the range, exclusive; " + TIME_HELP)] = None,
    tag: Annotated[
        str, Query(max_length=256, description="the tag key to group by (client: every client:* tag)")
    ] = "client",
    has_tag: Annotated[
        list[str] | None,
        Query(
            description="only the calls carrying this tag value (client:acme); repeat it, or separate values by "
            f"spaces or commas, for calls carrying all of them (at most {MAX_FILTER_TAGS})"
        ),
    ] = None,
    profile: Annotated[str | None, Query(max_length=64, description="only the calls of this profile")] = None,
    model: Annotated[str | None, Query(max_length=200, description="only the calls of this model")] = None,
    interval: Annotated[
        Interval, Query(description=f"cost over time per UTC day, or per UTC hour (at most {MAX_HOUR_DAYS} days)")
    ] = "day",
    stack: Annotated[
        Stack, Query(description="what each time's cost is stacked by: the tag key (`tag`), or a grouping")
    ] = "tag",
    measure: Annotated[Measure, Query(description="what the chart measures: USD or calls")] = "usd",
) -> Params:
    query: dict[str, list[str]] = {"tag": [tag], "interval": [interval], "stack": [stack], "measure": [measure]}
    for name, value in (("since", since), ("until", until), ("profile", profile), ("model", model)):
        if value is not None:
            query[name] = [value]
    query["has_tag"] = list(has_tag or [])
    try:
        return parse_params(query)
    except ParamError as exc:
        raise HTTPException(422, str(exc)) from None


ApiParams = Annotated[Params, Depends(_api_params)]


# Queries.


def with_filter(base: Sequence[Any], only: CallFilter) -> tuple[str, list[Any]]:
    """The filter's condition, its parameters numbered after the query's own (`base`), and all the arguments."""
    where, extra = only.condition(len(base) + 1)
    return where, [*base, *extra]


def status_sql(where: str) -> str:
    """Calls and USD per cost status (the USD null for unpriced calls)."""
    return f"""
    SELECT cost_status, coalesce(sum(calls), 0)::bigint AS calls,
           CASE WHEN sum(calls) > sum(unpriced_calls) THEN sum(usd) END AS usd
    FROM {days_source(where)}
    GROUP BY cost_status ORDER BY cost_status"""


#: Every call's statuses (no filter).
STATUS_SQL: Final = status_sql("true")


async def _tables(
    conn: Conn, times: list[datetime], tag_key: str, only: CallFilter
) -> tuple[dict[str, CostTable], CostRow, list[StatusRow]]:
    """Every table, the total and the statuses in one statement (`days_tables_sql`: the range's rows read once)."""
    where, args = with_filter([*times, f"{tag_key}:"], only)
    sql = days_tables_sql(GROUP_EXPRESSIONS, of_tags=("origin",), limit=MAX_GROUPS + 1, where=where)
    by_kind: dict[str, list[Any]] = {}
    for record in await conn.fetch(sql, *args):
        by_kind.setdefault(record["kind"], []).append(record)
    tables: dict[str, CostTable] = {}
    for kind in GROUPINGS:
        records = by_kind.get(kind, [])
        rows = [CostRow.from_record(r, r["grp"], str(r["grp"])) for r in records[:MAX_GROUPS]]
        untagged: CostRow | None = None
        if kind == "tag":
            found = by_kind[UNTAGGED_KIND][0]
            untagged = CostRow.from_record(found, None, UNTAGGED_LABEL) if found["calls"] else None
        name = f"tag:{tag_key}" if kind == "tag" else kind
        tables[kind] = CostTable(group_by=name, rows=rows, untagged=untagged, truncated=len(records) > MAX_GROUPS)
    total = CostRow.from_record(by_kind[TOTAL_KIND][0], None, TOTAL_LABEL)
    statuses = [StatusRow(cost_status=r["grp"], calls=r["calls"], usd=r["usd"]) for r in by_kind.get(STATUS_KIND, [])]
    return tables, total, statuses


async def _outside(conn: Conn, since: datetime, until: datetime | None, only: CallFilter) -> OutsideRange:
    where, args = with_filter(days_args(FIRST_INSTANT, since), only)
    before = await conn.fetchrow(days_calls_sql(where), *args)
    assert before is not None
    after: Any = None
    if until is not None:
        where, args = with_filter(days_args(until, None), only)
        after = await conn.fetchrow(days_calls_sql(where), *args)
    ends = [before["first"], before["last"], *((after["first"], after["last"]) if after is not None else ())]
    days = [d for d in ends if d is not None]
    return OutsideRange(
        before=before["calls"],
        after=after["calls"] if after is not None else 0,
        first_day=min(days, default=None),
        last_day=max(days, default=None),
    )


def _floor(at: datetime, interval: Interval) -> datetime:
    at = at.astimezone(UTC)
    if interval == "hour":
        return at.replace(minute=0, second=0, microsecond=0)
    return datetime(at.year, at.month, at.day, tzinfo=UTC)


def time_label(at: datetime, interval: Interval) -> str:
    return at.strftime("%Y-%m-%d %H:00" if interval == "hour" else "%Y-%m-%d")


def _empty(group: str | None, label: str) -> CostRow:
    return CostRow(group, label, None, 0, 0, 0, 0, 0, 0, 0)


async def _series(
    conn: Conn, p: Params, since: datetime, reach: datetime, times: list[datetime], tables: Mapping[str, CostTable]
) -> CostSeries:
    """Cost per UTC day (the rollup for whole days) or hour (`model_calls`) from `since` to `reach` (the range's
    end, or now), each time stacked by the page's tag key or a grouping of the calls."""
    if p.interval == "day":
        source_of, base, start = days_source, list(times), "(c.day::timestamp AT TIME ZONE 'UTC')"
    else:
        source_of, base, start = hours_source, [times[0], times[1]], "c.hour"
    where, args = with_filter(base, p.only)
    totals = {
        r["bucket"]: CostRow.from_record(r, None, "")
        for r in await conn.fetch(
            f"SELECT {start} AS bucket, {DAYS_AGGREGATES} FROM {source_of(where)} GROUP BY 1", *args
        )
    }

    table = tables[p.stack]
    top = [row.group for row in table.rows[:MAX_STACKS] if row.group is not None]
    stack_base = [*base, f"{p.tag_key}:", top] if p.stack == "tag" else [*base, top]
    where, args = with_filter(stack_base, p.only)
    n_top = len(stack_base)
    if p.stack == "tag":
        join = f" LEFT JOIN LATERAL (SELECT t FROM unnest(c.tags) AS t WHERE starts_with(t, ${n_top - 1})) AS k ON true"
        group = "k.t"
    else:
        join, group = "", GROUP_EXPRESSIONS[p.stack]
    records = await conn.fetch(
        f"""
        SELECT bucket, grp, is_other, {DAYS_AGGREGATES}
        FROM (
            SELECT {start} AS bucket, CASE WHEN {group} = ANY(${n_top}::text[]) THEN {group} END AS grp,
                   coalesce(NOT ({group} = ANY(${n_top}::text[])), false) AS is_other,
                   {", ".join(f"c.{column}" for column in SUM_COLUMNS)}
            FROM {source_of(where)}{join}
        ) AS s
        GROUP BY 1, 2, 3
        ORDER BY 1""",
        *args,
    )

    step = timedelta(days=1) if p.interval == "day" else timedelta(hours=1)
    buckets: list[datetime] = []
    truncated = False
    if totals:
        first, last = min(totals), max(totals)
        low = min(_floor(since, p.interval), first)
        high = max(_floor(reach - timedelta(microseconds=1), p.interval) if reach > since else first, last)
        if (high - low) // step >= MAX_BUCKETS:
            low = first
        if (high - low) // step >= MAX_BUCKETS:
            low, truncated = high - (MAX_BUCKETS - 1) * step, True
        count = (high - low) // step + 1
        buckets = [low + i * step for i in range(count)]
    shown = set(buckets)
    labels = {b: time_label(b, p.interval) for b in buckets}
    by_time = CostTable(
        group_by=p.interval,
        rows=[
            replace(totals[b], group=b.isoformat(), label=labels[b])
            if b in totals
            else _empty(b.isoformat(), labels[b])
            for b in buckets
        ],
    )
    points: list[SeriesPoint] = []
    has_none = has_other = False
    for r in records:
        if r["bucket"] not in shown:
            continue
        label = OTHER_LABEL if r["is_other"] else (str(r["grp"]) if r["grp"] is not None else UNTAGGED_LABEL)
        has_other |= r["is_other"]
        has_none |= not r["is_other"] and r["grp"] is None
        points.append(SeriesPoint(at=r["bucket"], row=CostRow.from_record(r, r["grp"], label)))
    stacks = [str(g) for g in top] + [UNTAGGED_LABEL] * has_none + [OTHER_LABEL] * has_other
    stack_by = f"tag:{p.tag_key}" if p.stack == "tag" else p.stack
    return CostSeries(
        interval=p.interval, stack_by=stack_by, stacks=stacks, by_time=by_time, points=points, truncated=truncated
    )


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
        "FROM budget_alerts WHERE percent = 100 ORDER BY sent_at DESC, budget LIMIT 50"
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


async def load(conn: Conn, p: Params) -> CostReport:
    """The whole page in one snapshot (repeatable read), so that every table, the chart and the total agree."""
    await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    resolved: datetime = p.since if p.since is not None else await conn.fetchval("SELECT date_trunc('month', now())")
    now: datetime = await conn.fetchval("SELECT now()")
    reach = min(p.until, now) if p.until is not None else now
    if p.interval == "hour" and (p.until or now) - resolved > timedelta(days=MAX_HOUR_DAYS):
        raise ParamError(
            "interval",
            f"per hour shows at most {MAX_HOUR_DAYS} days, and this range is longer: shorten it (since, until) or "
            "show it per day",
            {"interval": "day"},
        )
    times = days_args(resolved, p.until)
    tables, total_row, statuses = await _tables(conn, times, p.tag_key, p.only)
    series = await _series(conn, p, resolved, reach, times, tables)
    outside = await _outside(conn, resolved, p.until, p.only)
    notes = [tag_counting_note(p.tag_key)]
    if total_row.unpriced_calls:
        notes.append(
            f"{total_row.unpriced_calls} call(s) have no price (cost_status unpriced): they are counted as calls, not "
            "in USD. Add a price (COS_PRICE_FILE) and run `cos billing reprice`."
        )
    for table in tables.values():
        if table.truncated:
            notes.append(f"Only the first {MAX_GROUPS} groups by {table.group_by} are shown.")
    if series.truncated:
        notes.append(f"Over time shows the last {MAX_BUCKETS} {p.interval}s of the range; the tables count them all.")
    return CostReport(
        since=resolved,
        until=p.until,
        tag_key=p.tag_key,
        filters=p.filters,
        total=total_row,
        by_tag=tables["tag"],
        by_origin=tables["origin"],
        by_model=tables["model"],
        by_provider=tables["provider"],
        by_profile=tables["profile"],
        by_day=tables["day"],
        by_status=statuses,
        over_time=series,
        outside=outside,
        budgets=await load_budgets(conn, now),
        notes=notes,
    )


def outside_note(outside: OutsideRange) -> str | None:
    """The calls the range leaves out, in a sentence (None when it leaves none)."""
    calls = outside.before + outside.after
    if not calls or outside.first_day is None or outside.last_day is None:
        return None
    where = " and ".join(
        part
        for part in (
            f"{outside.before:,} before it" if outside.before else "",
            f"{outside.after:,} after it" if outside.after else "",
        )
        if part
    )
    span = (
        f"on {outside.first_day}"
        if outside.first_day == outside.last_day
        else f"from {outside.first_day} to {outside.last_day}"
    )
    return f"{calls:,} call(s) outside this range ({where}), {span} (UTC days, the calls' own times)."


async def _report(db: Database, who: SignedIn, p: Params) -> CostReport:
    async with db.reader(who.user) as conn:
        return await load(conn, p)


@router.get("/api/costs", response_model=CostReport)
async def api_costs(who: SignedIn, db: Db, p: ApiParams) -> CostReport:
    """Cost of the model calls over a time range by a tag key, origin, model, provider, profile, day and cost status,
    and over time (per day or hour, stacked), of the calls of a tag value, profile or model when asked, with the
    calls the range leaves out and the budgets; the totals are those of `cos report cost`."""
    try:
        return await _report(db, who, p)
    except ParamError as exc:
        raise HTTPException(422, str(exc)) from None


# CSV.

CsvTable = Literal["tag", "origin", "model", "provider", "profile", "day", "time", "series"]


def report_csv(report: CostReport, group_by: str) -> str:
    """One table as CSV, laid out as `cos report cost --format csv` (one function writes both): the groups, (none),
    the total. `time` is the chart's times (each call once), `series` its stacks: a line per time and stack."""
    if group_by == "series":
        series = report.over_time
        return csv_table(
            (series.interval, series.stack_by, *COST_COLUMNS),
            (
                (
                    time_label(point.at, series.interval),
                    point.row.label,
                    point.row.usd,
                    point.row.calls,
                    point.row.unpriced_calls,
                    point.row.input_tokens,
                    point.row.output_tokens,
                    point.row.reasoning_tokens,
                    point.row.cache_read_tokens,
                    point.row.cache_write_tokens,
                )
                for point in series.points
            ),
        )
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
        "time": report.over_time.by_time,
    }[group_by]


@router.get(
    "/api/costs.csv",
    response_class=Response,
    responses={200: {"content": {"text/csv": {"schema": {"type": "string"}}}, "description": "the table as CSV"}},
)
async def api_costs_csv(
    who: SignedIn,
    db: Db,
    p: ApiParams,
    group_by: Annotated[
        CsvTable,
        Query(
            description="which table: tag (by the `tag` key), origin, model, provider, profile, day, time (the "
            "chart's days or hours) or series (the chart's stacks)"
        ),
    ] = "tag",
) -> Response:
    """One of the page's tables as CSV (cells a spreadsheet would take for a formula are quoted with ')."""
    try:
        report = await _report(db, who, p)
    except ParamError as exc:
        raise HTTPException(422, str(exc)) from None
    named = {"tag": p.tag_key, "time": p.interval, "series": f"{p.interval}-by-{p.stack}"}.get(group_by, group_by)
    only = "".join(f"-{re.sub(r'[^A-Za-z0-9_.-]', '-', v)}" for v in (*p.only.tags, p.only.profile, p.only.model) if v)
    name = f"cost-by-{named}{only}-{report.since:%Y%m%d}.csv"
    return Response(
        report_csv(report, group_by),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


# The charts: server-rendered SVG, no script.

CHART_WIDTH: Final = 640
BAR_HEIGHT: Final = 22
LABEL_WIDTH: Final = 200
COLOURS: Final = {"loop": "#1f5fbf", CLAUDE_CODE: "#c2571a", CODEX: "#1d7a43"}
#: The stacks' colours, in the order of the stacks (Tableau 10); then "(none)" and "(other)" in greys.
PALETTE: Final = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7")
NONE_COLOUR: Final = "#bab0ac"
OTHER_COLOUR: Final = "#79706e"


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


def stack_colours(stacks: Sequence[str]) -> dict[str, str]:
    """Each stack's colour: the palette's in order, greys for "(none)" and "(other)"."""
    colours: dict[str, str] = {}
    for label in stacks:
        if label == UNTAGGED_LABEL:
            colours[label] = NONE_COLOUR
        elif label == OTHER_LABEL:
            colours[label] = OTHER_COLOUR
        else:
            colours[label] = PALETTE[len(colours) % len(PALETTE)]
    return colours


def _measure(row: CostRow, measure: Measure) -> float:
    return float(row.usd or 0) if measure == "usd" else float(row.calls)


def _amount(value: float, measure: Measure) -> str:
    if measure == "calls":
        return f"{value:,.0f} calls"
    return f"${value:,.4f}" if value < 10 else f"${value:,.2f}"


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least `value` (the axis' top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value * (1 - 1e-12))


TIME_CHART_WIDTH: Final = 960
PLOT_LEFT: Final = 80
PLOT_TOP: Final = 12
PLOT_HEIGHT: Final = 220
LEGEND_ITEM_WIDTH: Final = 220


def time_chart(chart_id: str, series: CostSeries, measure: Measure) -> Markup:
    """Cost (or calls) per day or hour as stacked columns, an accessible SVG image: a title, a description of the
    range and its largest times, a tooltip per column segment, axis labels and a legend of the stacks.

    Every piece of text is escaped: stack names are tag values, models, profiles (data, not markup)."""
    times = series.by_time.rows
    colours = stack_colours(series.stacks)
    per_time: dict[str, list[SeriesPoint]] = {}
    for point in series.points:
        per_time.setdefault(point.at.isoformat(), []).append(point)
    order = {label: i for i, label in enumerate(series.stacks)}
    heights = [sum(_measure(p.row, measure) for p in per_time.get(t.group or "", [])) for t in times]
    top = _nice_ceiling(max(heights, default=0.0))
    plot_width = TIME_CHART_WIDTH - PLOT_LEFT - 12
    per_row = max(1, plot_width // LEGEND_ITEM_WIDTH)
    legend_rows = math.ceil(len(series.stacks) / per_row) if series.stacks else 0
    height = PLOT_TOP + PLOT_HEIGHT + 34 + legend_rows * 20
    unit = "USD" if measure == "usd" else "calls"
    what = f"{'Cost' if measure == 'usd' else 'Calls'} per {series.interval} (UTC), stacked by {series.stack_by}"
    esc_id = escape(chart_id)
    if times:
        largest = sorted(zip(times, heights, strict=True), key=lambda th: -th[1])[:3]
        desc = (
            f"{len(times)} {series.interval}s from {times[0].label} to {times[-1].label}; the largest: "
            + "; ".join(f"{t.label} {_amount(h, measure)}" for t, h in largest if h > 0)
            + f". Stacks: {', '.join(series.stacks)}. The table below holds every value."
        )
    else:
        desc = "No calls in this range."
    parts = [
        f'<svg class="chart time-chart" id="{esc_id}" role="img" aria-labelledby="{esc_id}-t {esc_id}-d" '
        f'viewBox="0 0 {TIME_CHART_WIDTH} {height}" width="{TIME_CHART_WIDTH}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{esc_id}-t">{escape(what)}</title>',
        f'<desc id="{esc_id}-d">{escape(desc)}</desc>',
    ]
    baseline = PLOT_TOP + PLOT_HEIGHT
    for i in range(5):  # the value axis: 0, a quarter, ..., the top
        value = top * i / 4
        y = baseline - PLOT_HEIGHT * i / 4
        parts.append(
            f'<line x1="{PLOT_LEFT}" x2="{TIME_CHART_WIDTH - 12}" y1="{y:.1f}" y2="{y:.1f}" stroke="currentColor" '
            f'stroke-opacity="{0.5 if i == 0 else 0.15}"/>'
        )
        tick = (f"{value:,.0f}" if value >= 10 or value == 0 else f"{value:,.4g}") if measure == "calls" else None
        text = tick if tick is not None else ("$0" if value == 0 else f"${value:,.4g}")
        parts.append(
            f'<text x="{PLOT_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" fill="currentColor">'
            f"{escape(text)}</text>"
        )
    parts.append(
        f'<text x="12" y="{PLOT_TOP + PLOT_HEIGHT / 2:.0f}" font-size="11" fill="currentColor" '
        f'transform="rotate(-90 12 {PLOT_TOP + PLOT_HEIGHT / 2:.0f})" text-anchor="middle">{unit}</text>'
    )
    if not times:
        parts.append(
            f'<text x="{PLOT_LEFT + plot_width / 2:.0f}" y="{PLOT_TOP + PLOT_HEIGHT / 2:.0f}" text-anchor="middle" '
            'font-size="13" fill="currentColor">No calls in this range</text>'
        )
    slot = plot_width / max(1, len(times))
    bar = max(1.0, slot * (0.8 if slot >= 4 else 1.0))
    label_every = max(1, math.ceil(len(times) / 8))
    scale = PLOT_HEIGHT / top
    for i, t in enumerate(times):
        x = PLOT_LEFT + i * slot + (slot - bar) / 2
        y = float(baseline)
        stacked = sorted(per_time.get(t.group or "", []), key=lambda p: order.get(p.row.label, len(order)))
        total = _amount(_measure(t, measure), measure)
        parts.append(f'<g class="time" data-time="{escape(t.label)}"><title>{escape(t.label)}: {escape(total)}')
        parts.append(f" ({t.calls:,} calls)</title>" if measure == "usd" else "</title>")
        for point in stacked:
            value = _measure(point.row, measure)
            if value <= 0:
                continue
            h = value * scale
            y -= h
            tip = f"{point.row.label}, {t.label}: {_amount(value, measure)}"
            if measure == "usd":
                unpriced = f", {point.row.unpriced_calls:,} unpriced" if point.row.unpriced_calls else ""
                tip += f" ({point.row.calls:,} calls{unpriced})"
            parts.append(
                f'<rect x="{x:.2f}" y="{y:.2f}" width="{bar:.2f}" height="{h:.2f}" '
                f'fill="{colours.get(point.row.label, OTHER_COLOUR)}"><title>{escape(tip)}</title></rect>'
            )
        parts.append("</g>")
        if i % label_every == 0:
            label = t.label if series.interval == "day" else t.label[5:]
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{baseline + 16}" text-anchor="middle" font-size="11" '
                f'fill="currentColor">{escape(label)}</text>'
            )
    for i, label in enumerate(series.stacks):
        lx = PLOT_LEFT + (i % per_row) * LEGEND_ITEM_WIDTH
        ly = baseline + 34 + (i // per_row) * 20
        shown = label if len(label) <= 30 else label[:29] + "…"
        parts.append(
            f'<g class="legend"><rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{colours[label]}"/>'
            f'<text x="{lx + 18}" y="{ly}" font-size="12" fill="currentColor">{escape(shown)}</text></g>'
        )
    parts.append("</svg>")
    # Built from escaped parts and numbers only.
    return Markup("".join(parts))


# The page.

PAGE_PARAMS: Final = ("since", "until", "tag", "has_tag", "profile", "model", "interval", "stack", "measure")
INTERVALS: Final = (("day", "per day"), ("hour", f"per hour ({MAX_HOUR_DAYS} days at most)"))
STACKS: Final = (
    ("tag", "the tag key"),
    ("model", "model"),
    ("provider", "provider"),
    ("profile", "profile"),
    ("origin", "origin (loop, imported)"),
)
MEASURES: Final = (("usd", "USD"), ("calls", "calls"))
#: The most values each filter field suggests.
MAX_SUGGESTIONS: Final = 300


def as_typed(raw: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """The page's parameters as typed (blank ones left out; the tag values joined by spaces): the form's values
    and every link's starting point."""
    out: dict[str, str] = {}
    for name in PAGE_PARAMS:
        values = [v.strip() for v in raw.get(name, []) if v.strip()]
        if values:
            out[name] = " ".join(values) if name == "has_tag" else values[-1]
    return out


def costs_href(query: Mapping[str, str], **changes: str | None) -> str:
    """/costs with `query` changed: a value replaces one, None removes it."""
    merged = {**query, **changes}
    kept = {k: v for k, v in merged.items() if v is not None and v != "" and DEFAULTS.get(k) != v}
    return "/costs" + ("?" + urlencode(kept) if kept else "")


async def suggestions(conn: Conn) -> dict[str, list[str]]:
    """What the filter fields suggest: the profiles, models and tag values the calls have (the rollup's)."""
    limit = MAX_SUGGESTIONS
    return {
        "profile": [
            r[0] for r in await conn.fetch(f"SELECT DISTINCT profile_id FROM model_call_days ORDER BY 1 LIMIT {limit}")
        ],
        "model": [
            r[0] for r in await conn.fetch(f"SELECT DISTINCT model FROM model_call_days ORDER BY 1 LIMIT {limit}")
        ],
        "has_tag": [
            r[0]
            for r in await conn.fetch(
                f"SELECT DISTINCT t FROM model_call_days, unnest(tags) AS t ORDER BY 1 LIMIT {limit}"
            )
        ],
    }


@router.get("/costs", include_in_schema=False, response_class=HTMLResponse)
async def costs_page(request: Request, who: SignedIn, db: Db) -> HTMLResponse:
    raw = {name: request.query_params.getlist(name) for name in PAGE_PARAMS}
    query = as_typed(raw)

    def link(**changes: str | None) -> str:
        return costs_href(query, **changes)

    context: dict[str, Any] = {
        "query": query,
        "link": link,
        "intervals": INTERVALS,
        "stacks": STACKS,
        "measures": MEASURES,
        "defaults": DEFAULTS,
        "report": None,
        "error": None,
        "instead": None,
        "suggest": {"profile": [], "model": [], "has_tag": []},
    }
    try:
        p = parse_params(raw)
        async with db.reader(who.user) as conn:
            report = await load(conn, p)
            context["suggest"] = await suggestions(conn)
    except ParamError as exc:
        context["error"] = str(exc)
        context["instead"] = link(**exc.instead) if exc.instead is not None else None
        return render(request, "costs.html", context, status_code=422)
    context |= {
        "report": report,
        "p": p,
        "outside_note": outside_note(report.outside),
        "widen": link(
            since=str(report.outside.first_day) if report.outside.before else query.get("since"),
            until=None if report.outside.after else query.get("until"),
        ),
        "time_chart": time_chart("chart-time", report.over_time, p.measure),
        "colours": stack_colours(report.over_time.stacks),
        "stack_cells": stack_cells(report.over_time),
        "charts": {
            "tag": bar_chart("chart-tag", f"Cost by {report.by_tag.group_by}", report.by_tag.rows),
            "origin": bar_chart(
                "chart-origin", "Cost by origin: the loop and imported work", report.by_origin.rows, COLOURS
            ),
        },
        "tables": [
            ("origin", "By origin (the loop's own calls and imported Claude Code / Codex work)", report.by_origin),
            ("model", "By model", report.by_model),
            ("provider", "By provider", report.by_provider),
            ("profile", "By profile", report.by_profile),
            ("day", "By day (UTC)", report.by_day),
        ],
    }
    return render(request, "costs.html", context)


def stack_cells(series: CostSeries) -> dict[str, dict[str, CostRow]]:
    """The over-time table's cells: for each time (its ISO start), each stack's sums."""
    cells: dict[str, dict[str, CostRow]] = {}
    for point in series.points:
        cells.setdefault(point.at.isoformat(), {})[point.row.label] = point.row
    return cells
