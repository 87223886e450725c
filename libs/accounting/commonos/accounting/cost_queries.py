"""The SQL of cost by group over `model_calls`, the times of its range and the row it gives (`CostRow`): `cos
report cost` and the console's Costs page run the same queries on the same range, so that their tables agree
call for call (no I/O).

Every query takes ``$1`` since, ``$2`` until (NULL: open) and, where it groups or filters by a tag key,
``$3`` the tag prefix (``client:``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from commonos.proto.errors import DataError

#: A span ago: a whole number of days, hours or minutes (at most 4,000 digits: Python reads no longer int).
_RELATIVE: Final = re.compile(r"(\d{1,4000})([dhm])")


class ReportError(DataError):
    """A report argument that cannot be used; the message is one line."""


def parse_when(text: str, now: datetime | None = None) -> datetime:
    """A date (UTC midnight), an ISO date-time (no offset = UTC), or ``<n>d``/``<n>h``/``<n>m`` ago.

    Every time is one of the years 1 to 9999 in UTC (what a row's time can be); any other is a ReportError.
    """
    text = text.strip()
    relative = _RELATIVE.fullmatch(text)
    if relative:
        amount, unit = int(relative.group(1)), relative.group(2)
        try:
            delta = {"d": timedelta(days=amount), "h": timedelta(hours=amount), "m": timedelta(minutes=amount)}[unit]
            return (now or datetime.now(UTC)) - delta
        except OverflowError:
            raise ReportError(f"{text!r} reaches before the year 1") from None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC)
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(f"{text!r} is not a date (2026-11-01), a date-time or a span ago (7d, 12h)") from None
    if when.tzinfo is None:
        return when.replace(tzinfo=UTC)
    try:
        when.astimezone(UTC)
    except OverflowError:
        edge = "after the year 9999" if when.year == 9999 else "before the year 1"
        raise ReportError(f"{text!r} is {edge} in UTC") from None
    return when


#: Group expressions over model_calls; `tag` groups by the tags' unnest instead (the seed's query).
GROUP_EXPRESSIONS: Final = {
    "model": "model",
    "provider": "provider",
    "profile": "profile_id",
    "day": "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}

#: Token sums are numeric (what sum(bigint) returns), never cast back to bigint: each count is a bigint, their
#: sum over calls need not be. The two cache-write buckets are summed apart for the same reason.
AGGREGATES: Final = """
    sum(cost_usd) AS usd,
    count(*) AS calls,
    count(*) FILTER (WHERE cost_usd IS NULL) AS unpriced_calls,
    coalesce(sum(input_tokens), 0) AS input_tokens,
    coalesce(sum(output_tokens), 0) AS output_tokens,
    coalesce(sum(cache_read_tokens), 0) AS cache_read_tokens,
    coalesce(sum(cache_write_5m_tokens), 0) + coalesce(sum(cache_write_1h_tokens), 0) AS cache_write_tokens,
    coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens"""


#: The labels of the two rows that are no group's: the calls without a tag of the key, and the total.
UNTAGGED_LABEL: Final = "(none)"
TOTAL_LABEL: Final = "(total: each call once)"


# One row of a cost table (the columns of `AGGREGATES`): `cos report cost`'s and the console's (/api/costs). No
# docstring: it would become the row's description in the console's OpenAPI document.
@dataclass(frozen=True, slots=True)
class CostRow:
    #: The group's value; null for the calls without a tag of the key, and for the total.
    group: str | None
    #: What a table shows: the value, `UNTAGGED_LABEL` or `TOTAL_LABEL`.
    label: str
    #: Exact USD of the priced calls; null when none of the group's calls has a price.
    usd: Decimal | None
    calls: int
    #: Calls without a price (cost_status unpriced): counted in `calls`, not in `usd`.
    unpriced_calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int

    @classmethod
    def from_record(cls, record: Any, group: str | None, label: str) -> CostRow:
        """The row of a record of these queries (an asyncpg Record, or any mapping with its keys)."""
        return cls(
            group=group,
            label=label,
            usd=record["usd"],
            calls=record["calls"],
            unpriced_calls=record["unpriced_calls"],
            # numeric sums of whole numbers: exact ints, however large
            input_tokens=int(record["input_tokens"]),
            output_tokens=int(record["output_tokens"]),
            cache_read_tokens=int(record["cache_read_tokens"]),
            cache_write_tokens=int(record["cache_write_tokens"]),
            reasoning_tokens=int(record["reasoning_tokens"]),
        )


RANGE: Final = "created_at >= $1 AND ($2::timestamptz IS NULL OR created_at < $2)"

TOTAL_SQL: Final = f"SELECT {AGGREGATES} FROM model_calls WHERE {RANGE}"
#: The calls without a tag of the key ($3).
UNTAGGED_SQL: Final = f"""
    SELECT {AGGREGATES} FROM model_calls
    WHERE {RANGE} AND NOT EXISTS (SELECT 1 FROM unnest(tags) AS tag WHERE starts_with(tag, $3))"""


def grouped_sql(kind: str, expressions: Mapping[str, str] = GROUP_EXPRESSIONS, limit: int | None = None) -> str:
    """The per-group query of `kind` (`tag`, or a key of `expressions`): the most costly first (days in
    order), at most `limit` groups (None: all)."""
    cut = f"\n            LIMIT {limit}" if limit is not None else ""
    if kind == "tag":
        return f"""
            SELECT tag AS grp, {AGGREGATES}
            FROM model_calls, unnest(tags) AS tag
            WHERE starts_with(tag, $3) AND {RANGE}
            GROUP BY tag
            ORDER BY usd DESC NULLS LAST, grp{cut}"""
    order = "grp" if kind == "day" else "usd DESC NULLS LAST, grp"
    return f"""
            SELECT {expressions[kind]} AS grp, {AGGREGATES}
            FROM model_calls
            WHERE {RANGE}
            GROUP BY grp
            ORDER BY {order}{cut}"""
