"""``cos report cost``: cost of model calls over a time range, grouped by a tag key, model, provider, day or
profile.

Grouping by ``tag:<key>`` counts a call once in each ``<key>:`` group it carries (the seed's "cost per client"
query does the same), so the groups can add up to more than the total; calls without such a tag form the
``(none)`` group. The total counts every call once. The report says both. Times are the calls' own times
(``created_at``); ``since`` defaults to the start of the current month as the database sees it
(``date_trunc('month', now())``, like the seed's query) and ``until`` is exclusive.

The queries read the daily rollup (``model_call_days``) for the whole UTC days of the range and ``model_calls``
for the rest (`commonos.accounting.cost_queries.days_args`): the sums are those of ``model_calls`` alone, exactly.

The SQL and the rendering are here; the CLI only parses arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from commonos.accounting.cost_queries import (
    DAYS_CALLS_SQL,
    DAYS_TOTAL_SQL,
    DAYS_UNTAGGED_SQL,
    FIRST_INSTANT,
    GROUP_EXPRESSIONS,
    TOTAL_LABEL,
    UNTAGGED_LABEL,
    CostRow,
    ReportError,
    days_args,
    days_grouped_sql,
    parse_when,
    tag_counting_note,
)
from commonos.accounting.csv_cells import cost_csv
from commonos.runtime.cli_support import shown
from commonos.runtime.postgres import Conn

__all__ = [
    "FORMATS",
    "GROUP_BY_HELP",
    "CostReport",
    "CostRow",
    "GroupBy",
    "ReportError",
    "columns",
    "cost_report",
    "parse_group_by",
    "parse_when",
    "render_report",
]

FORMATS: Final = ("table", "json", "csv")
GROUP_BY_HELP: Final = "tag:<key>, model, provider, day or profile"

_TAG_KEY = re.compile(r"[a-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class GroupBy:
    kind: str  # "tag", "model", "provider", "day" or "profile"
    tag_key: str | None = None

    def __str__(self) -> str:
        return f"tag:{self.tag_key}" if self.kind == "tag" else self.kind


def parse_group_by(text: str) -> GroupBy:
    text = text.strip()
    if text.startswith("tag:"):
        key = text[4:]
        if not _TAG_KEY.fullmatch(key):
            raise ReportError(f"{text!r}: a tag key is lower-case letters, digits, _ and - (tag:client)")
        return GroupBy("tag", key)
    if text in GROUP_EXPRESSIONS:
        return GroupBy(text)
    raise ReportError(f"{text!r} is not a grouping: use {GROUP_BY_HELP}")


def row_json(row: CostRow) -> dict[str, Any]:
    """A row as `--format json` writes it (its label is the table's, not the JSON's)."""
    return {
        "group": row.group,
        "usd": str(row.usd) if row.usd is not None else None,
        "calls": row.calls,
        "unpriced_calls": row.unpriced_calls,
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "cache_read_tokens": row.cache_read_tokens,
        "cache_write_tokens": row.cache_write_tokens,
        "reasoning_tokens": row.reasoning_tokens,
    }


@dataclass(frozen=True, slots=True)
class CostReport:
    group_by: GroupBy
    since: datetime
    until: datetime | None
    groups: list[CostRow]
    total: CostRow
    untagged: CostRow | None = None  # tag grouping only
    notes: list[str] = field(default_factory=list)


async def cost_report(
    conn: Conn, group_by: GroupBy, since: datetime | None = None, until: datetime | None = None
) -> CostReport:
    """Run the report in one read-only snapshot, so groups and total agree."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        # Only the default is asked of the database: a given time read back could be asyncpg's naive
        # datetime.min/max, which is how it reads -infinity/infinity (what it sends for the first/last instant).
        resolved = since if since is not None else await conn.fetchval("SELECT date_trunc('month', now())")
        times = days_args(resolved, until)
        args: list[Any] = [*times, f"{group_by.tag_key}:"] if group_by.kind == "tag" else times
        records = await conn.fetch(days_grouped_sql(group_by.kind), *args)
        total = await conn.fetchrow(DAYS_TOTAL_SQL, *times)
        untagged = await conn.fetchrow(DAYS_UNTAGGED_SQL, *args) if group_by.kind == "tag" else None
        # The calls outside the range: how many before it (and the first one's day) and after it.
        before = await conn.fetchrow(DAYS_CALLS_SQL, *days_args(FIRST_INSTANT, resolved))
        after = await conn.fetchval(DAYS_CALLS_SQL, *days_args(until, None)) if until is not None else 0
    assert total is not None and before is not None
    groups = [CostRow.from_record(r, r["grp"], r["grp"] or "") for r in records]
    total_row = CostRow.from_record(total, None, TOTAL_LABEL)
    untagged_row = (
        CostRow.from_record(untagged, None, UNTAGGED_LABEL) if untagged is not None and untagged["calls"] else None
    )
    notes: list[str] = []
    if group_by.tag_key is not None:  # a grouping by a tag key
        notes.append(tag_counting_note(group_by.tag_key))
    if before["calls"]:
        first = before["first"].isoformat()
        notes.append(
            f"{before['calls']:,} call(s) are before this range (the first on {first}, by the calls' own times): "
            f"`--since {first}` shows them."
        )
    if after:
        notes.append(f"{after:,} call(s) are after this range: leave out `--until` to show them.")
    if total_row.unpriced_calls:
        notes.append(
            f"{total_row.unpriced_calls} call(s) have no price (cost_status unpriced): they count as calls, not "
            "in USD. Add a price (COS_PRICE_FILE) and run `cos billing reprice`."
        )
    return CostReport(group_by, resolved, until, groups, total_row, untagged_row, notes)


def _usd(value: Decimal | None) -> str:
    return "n/a" if value is None else f"{value:,.4f}"


def columns(header: tuple[str, ...], rows: Sequence[tuple[str, ...]], right_from: int) -> str:
    """Plain aligned text columns; cells from ``right_from`` on are right-aligned (numbers). A cell's control
    characters (a model name's, a tag's) are shown as escapes, never sent to the terminal."""
    header, rows = tuple(map(shown, header)), [tuple(map(shown, r)) for r in rows]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i >= right_from else cell.ljust(widths[i]) for i, cell in enumerate(cells)
        ).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def _labelled(report: CostReport) -> list[tuple[str, CostRow]]:
    rows = [*report.groups, *([report.untagged] if report.untagged is not None else []), report.total]
    return [(row.label, row) for row in rows]


def render_report(report: CostReport, fmt: str = "table") -> str:
    if fmt == "json":
        return json.dumps(
            {
                "group_by": str(report.group_by),
                "since": report.since.isoformat(),
                "until": report.until.isoformat() if report.until else None,
                "groups": [row_json(row) for row in report.groups],
                "untagged": row_json(report.untagged) if report.untagged else None,
                "total": row_json(report.total),
                "notes": report.notes,
            },
            indent=2,
        )
    header = (
        str(report.group_by),
        "usd",
        "calls",
        "unpriced",
        "input",
        "output",
        "reasoning",
        "cache_read",
        "cache_write",
    )
    if fmt == "csv":
        return cost_csv(str(report.group_by), _labelled(report))
    table = [
        (
            label,
            _usd(row.usd),
            f"{row.calls:,}",
            f"{row.unpriced_calls:,}",
            f"{row.input_tokens:,}",
            f"{row.output_tokens:,}",
            f"{row.reasoning_tokens:,}",
            f"{row.cache_read_tokens:,}",
            f"{row.cache_write_tokens:,}",
        )
        for label, row in _labelled(report)
    ]
    until = report.until.isoformat() if report.until else "now"
    lines = [f"Cost by {report.group_by}, {report.since.isoformat()} .. {until} (calls' own times, until exclusive)"]
    lines.append(columns(header, table, right_from=1))
    lines.extend(f"Note: {note}" for note in report.notes)
    return "\n".join(lines)
