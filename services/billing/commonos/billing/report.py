"""``cos report cost``: cost of model calls over a time range, grouped by a tag key, model, provider, day or
profile.

Grouping by ``tag:<key>`` counts a call once in each ``<key>:`` group it carries (the seed's "cost per client"
query does the same), so the groups can add up to more than the total; calls without such a tag form the
``(none)`` group. The total counts every call once. The report says both. Times are the calls' own times
(``created_at``); ``since`` defaults to the start of the current month as the database sees it
(``date_trunc('month', now())``, like the seed's query) and ``until`` is exclusive.

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
    GROUP_EXPRESSIONS,
    RANGE,
    TOTAL_LABEL,
    TOTAL_SQL,
    UNTAGGED_LABEL,
    UNTAGGED_SQL,
    CostRow,
    ReportError,
    grouped_sql,
    parse_when,
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


#: The calls outside the range: how many before it and after it, and the first one's time.
_OUTSIDE_SQL: Final = f"""
    SELECT count(*) FILTER (WHERE created_at < $1) AS before, min(created_at) AS first,
           count(*) FILTER (WHERE $2::timestamptz IS NOT NULL AND created_at >= $2) AS after
    FROM model_calls WHERE NOT ({RANGE})"""


async def cost_report(
    conn: Conn, group_by: GroupBy, since: datetime | None = None, until: datetime | None = None
) -> CostReport:
    """Run the report in one read-only snapshot, so groups and total agree."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        # Only the default is asked of the database: a given time read back could be asyncpg's naive
        # datetime.min/max, which is how it reads -infinity/infinity (what it sends for the first/last instant).
        resolved = since if since is not None else await conn.fetchval("SELECT date_trunc('month', now())")
        args: list[Any] = [resolved, until]
        if group_by.kind == "tag":
            args.append(f"{group_by.tag_key}:")
        records = await conn.fetch(grouped_sql(group_by.kind), *args)
        total = await conn.fetchrow(TOTAL_SQL, resolved, until)
        untagged = await conn.fetchrow(UNTAGGED_SQL, *args) if group_by.kind == "tag" else None
        outside = await conn.fetchrow(_OUTSIDE_SQL, resolved, until)
    assert total is not None and outside is not None
    groups = [CostRow.from_record(r, r["grp"], r["grp"] or "") for r in records]
    total_row = CostRow.from_record(total, None, TOTAL_LABEL)
    untagged_row = (
        CostRow.from_record(untagged, None, UNTAGGED_LABEL) if untagged is not None and untagged["calls"] else None
    )
    notes: list[str] = []
    if group_by.kind == "tag":
        notes.append(
            f"Each call is counted once in every {group_by.tag_key}: group it carries, so groups can add up to "
            "more than the total; the total counts each call once."
        )
    if outside["before"]:
        first = outside["first"].date().isoformat()
        notes.append(
            f"{outside['before']:,} call(s) are before this range (the first on {first}, by the calls' own times): "
            f"`--since {first}` shows them."
        )
    if outside["after"]:
        notes.append(f"{outside['after']:,} call(s) are after this range: leave out `--until` to show them.")
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
