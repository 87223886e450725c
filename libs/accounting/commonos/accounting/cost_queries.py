"""The SQL of cost by group, the times of its range and the row it gives (`CostRow`): `cos report cost` and the
console's Costs page run the same queries on the same range, so that their tables agree call for call (no I/O).

Two sets of the same queries. Over `model_calls` alone (`TOTAL_SQL`, `UNTAGGED_SQL`, `grouped_sql`): each
takes ``$1`` since, ``$2`` until (NULL: open) and, where it groups or filters by a tag key, ``$3`` the tag
prefix (``client:``). And over the daily rollup (`DAYS_TOTAL_SQL`, `DAYS_UNTAGGED_SQL`, `days_grouped_sql`),
which the reports run: billing keeps `model_call_days` (the sums of each UTC day's calls per profile, provider,
model, cost status and tag set) in the same transaction as the calls, so its rows are the calls' exact sums.
A range of arbitrary times reads the rollup for the whole UTC days it covers and `model_calls` for the parts
of days at its ends (`days_args` splits it: ``$1`` since, ``$2`` until, ``$3`` the first whole day's start,
``$4`` the end of the last one, and ``$5`` the tag prefix); the two never hold the same call, so every sum is
the one the queries over `model_calls` give, to the digit.

The rollup's queries also take a `CallFilter` (a profile, a model, tag values such as ``client:acme``): its
condition reads only the rollup's key, so a filtered sum is as exact as an unfiltered one; its arguments follow
the query's own. What the rollup cannot answer, the calls per UTC hour, is read from `model_calls`
(`hours_source`) with the same columns.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
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


# --- the same queries over the daily rollup ------------------------------------------------------------------

#: The first and last instants: asyncpg sends them as -infinity and infinity.
FIRST_INSTANT: Final = datetime.min.replace(tzinfo=UTC)
LAST_INSTANT: Final = datetime.max.replace(tzinfo=UTC)


def days_args(since: datetime, until: datetime | None) -> list[datetime]:
    """The range's four times for the rollup queries: since, until (the last instant when open), the start of
    the first whole UTC day in it and the end of the last (both until, when it holds no whole day). The calls
    from since to the first, and from the end to until, are read from `model_calls`; the days between from
    `model_call_days`. Pure."""
    since = since.astimezone(UTC)
    end = LAST_INSTANT if until is None else until.astimezone(UTC)
    midnight = datetime.combine(since.date(), time(), UTC)
    if midnight < since:
        try:
            midnight += timedelta(days=1)
        except OverflowError:  # a time on the last day there is: no whole day follows it
            midnight = LAST_INSTANT
    last = LAST_INSTANT if end == LAST_INSTANT else datetime.combine(end.date(), time(), UTC)
    if midnight >= last:
        midnight = last = end
    return [since, end, midnight, last]


@dataclass(frozen=True, slots=True)
class CallFilter:
    """Which calls a report counts: those of one profile, of one model and carrying every one of `tags` (None or
    empty: any). It reads only columns of the rollup's key (`profile_id`, `model`, the tag set), so the rollup
    answers it as exactly as `model_calls` does."""

    profile: str | None = None
    model: str | None = None
    tags: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.profile is not None or self.model is not None or bool(self.tags)

    def condition(self, first: int) -> tuple[str, list[Any]]:
        """The SQL condition (over the columns `model_calls` and `model_call_days` share) and its arguments,
        numbered from ``$first``: ``true`` and none when it lets every call through."""
        parts: list[str] = []
        args: list[Any] = []
        for column, value in (("profile_id", self.profile), ("model", self.model)):
            if value is not None:
                args.append(value)
                parts.append(f"{column} = ${first + len(args) - 1}")
        if self.tags:
            args.append(list(self.tags))
            parts.append(f"tags @> ${first + len(args) - 1}::text[]")
        return " AND ".join(parts) or "true", args


#: One call as a row of the rollup's columns (after its day).
_CALL_AS_SUMS: Final = """profile_id, provider, model, cost_status, tags, 1 AS calls,
           (cost_usd IS NULL)::int AS unpriced_calls, coalesce(cost_usd, 0) AS usd, input_tokens, output_tokens,
           cache_read_tokens, cache_write_5m_tokens, cache_write_1h_tokens, reasoning_tokens"""


def days_source(where: str = "true") -> str:
    """One row per call of the range's partial days, one per rollup row of its whole days: the same columns.
    Only the rows where `where` (a `CallFilter.condition`) holds."""
    return f"""(
    SELECT day, profile_id, provider, model, cost_status, tags, calls, unpriced_calls, usd, input_tokens,
           output_tokens, cache_read_tokens, cache_write_5m_tokens, cache_write_1h_tokens, reasoning_tokens
    FROM model_call_days
    WHERE day >= ($3::timestamptz AT TIME ZONE 'UTC')::date AND day < ($4::timestamptz AT TIME ZONE 'UTC')::date
      AND ({where})
    UNION ALL
    SELECT (created_at AT TIME ZONE 'UTC')::date, {_CALL_AS_SUMS}
    FROM model_calls
    WHERE ((created_at >= $1 AND created_at < $3) OR (created_at >= $4 AND created_at < $2)) AND ({where})
) AS c"""


def hours_source(where: str = "true") -> str:
    """The calls from ``$1`` to ``$2`` (exclusive) where `where` holds, each a row of the rollup's columns with its
    UTC hour (`hour`, a timestamptz) for a day: what the rollup cannot answer, read from `model_calls` (whose
    monthly partitions the range prunes)."""
    return f"""(
    SELECT date_trunc('hour', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS hour, {_CALL_AS_SUMS}
    FROM model_calls
    WHERE created_at >= $1 AND created_at < $2 AND ({where})
) AS c"""


#: Every call of the range: what `cos report cost` reads.
DAYS_SOURCE: Final = days_source()

#: The columns a source's rows are summed by (`DAYS_AGGREGATES`).
SUM_COLUMNS: Final = (
    "calls",
    "unpriced_calls",
    "usd",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "reasoning_tokens",
)


def days_by_tags(where: str = "true") -> str:
    """`days_source(where)` summed per tag set first: what a grouping by the tags alone reads (far fewer rows to
    unnest or to look into than the days' rows)."""
    return f"""(
    SELECT tags, {", ".join(f"sum({c}) AS {c}" for c in SUM_COLUMNS)}
    FROM {days_source(where)}
    GROUP BY tags
) AS t"""


DAYS_BY_TAGS: Final = days_by_tags()


#: `AGGREGATES` over `DAYS_SOURCE`: the USD is null when no call of the group is priced.
DAYS_AGGREGATES: Final = """
    CASE WHEN sum(calls) > sum(unpriced_calls) THEN sum(usd) END AS usd,
    coalesce(sum(calls), 0)::bigint AS calls,
    coalesce(sum(unpriced_calls), 0)::bigint AS unpriced_calls,
    coalesce(sum(input_tokens), 0) AS input_tokens,
    coalesce(sum(output_tokens), 0) AS output_tokens,
    coalesce(sum(cache_read_tokens), 0) AS cache_read_tokens,
    coalesce(sum(cache_write_5m_tokens), 0) + coalesce(sum(cache_write_1h_tokens), 0) AS cache_write_tokens,
    coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens"""

#: `GROUP_EXPRESSIONS` over `DAYS_SOURCE` (its `day` is the UTC date already).
DAYS_GROUP_EXPRESSIONS: Final = {**GROUP_EXPRESSIONS, "day": "to_char(day, 'YYYY-MM-DD')"}


def days_total_sql(where: str = "true") -> str:
    return f"SELECT {DAYS_AGGREGATES} FROM {days_source(where)}"


def days_untagged_sql(where: str = "true") -> str:
    """The calls without a tag of the key ($5)."""
    return f"""
    SELECT {DAYS_AGGREGATES} FROM {days_by_tags(where)}
    WHERE NOT EXISTS (SELECT 1 FROM unnest(tags) AS tag WHERE starts_with(tag, $5))"""


def days_calls_sql(where: str = "true") -> str:
    """How many calls the range holds, and the UTC days of the first and of the last (null when none)."""
    return (
        "SELECT coalesce(sum(calls), 0)::bigint AS calls, min(day) AS first, max(day) AS last "
        f"FROM {days_source(where)}"
    )


DAYS_TOTAL_SQL: Final = days_total_sql()
#: The calls without a tag of the key ($5).
DAYS_UNTAGGED_SQL: Final = days_untagged_sql()
#: How many calls the range holds and the UTC days of the first and the last (null when none).
DAYS_CALLS_SQL: Final = days_calls_sql()


def days_grouped_sql(
    kind: str,
    expressions: Mapping[str, str] = DAYS_GROUP_EXPRESSIONS,
    limit: int | None = None,
    of_tags: Collection[str] = (),
    where: str = "true",
) -> str:
    """`grouped_sql` over `days_source(where)` (the tag prefix is $5): the same groups, in the same order. `tag`
    and the kinds of `of_tags` (an expression of `tags` alone) read the sums per tag set (`days_by_tags`)."""
    cut = f"\n            LIMIT {limit}" if limit is not None else ""
    if kind == "tag":
        return f"""
            SELECT tag AS grp, {DAYS_AGGREGATES}
            FROM {days_by_tags(where)}, unnest(tags) AS tag
            WHERE starts_with(tag, $5)
            GROUP BY tag
            ORDER BY usd DESC NULLS LAST, grp{cut}"""
    order = "grp" if kind == "day" else "usd DESC NULLS LAST, grp"
    return f"""
            SELECT {expressions[kind]} AS grp, {DAYS_AGGREGATES}
            FROM {days_by_tags(where) if kind in of_tags else days_source(where)}
            GROUP BY grp
            ORDER BY {order}{cut}"""


#: The kinds `days_tables_sql` answers besides its `expressions`: the calls without a tag of the key, every call
#: once, and the calls per cost status.
UNTAGGED_KIND: Final = "untagged"
TOTAL_KIND: Final = "total"
STATUS_KIND: Final = "status"


def days_tables_sql(
    expressions: Mapping[str, str], of_tags: Collection[str] = (), limit: int | None = None, where: str = "true"
) -> str:
    """Every table of a cost page in one statement over `DAYS_SOURCE` ($1 to $4 as `days_args` gives them, $5
    the tag prefix; `where` filters the calls as `days_source` does): rows of (kind, grp, the `DAYS_AGGREGATES`
    columns), kind being `tag`, a key of
    `expressions`, `UNTAGGED_KIND`, `TOTAL_KIND` or `STATUS_KIND` (grp the cost status); each kind's groups
    in `days_grouped_sql`'s order, at most `limit` of them. The same sums as those queries one by one.

    The range's rows are read once: summed per day (the `day` table) and per profile, provider, model, cost
    status and tag set, whose far fewer rows every other table sums again (those of `of_tags`, expressions of
    `tags` alone, and `tag` from the sums per tag set)."""
    cut = f" LIMIT {limit}" if limit is not None else ""
    sums = ", ".join(f"sum({c}) AS {c}" for c in SUM_COLUMNS)
    by_cost = "usd DESC NULLS LAST, grp"
    parts = [
        f"(SELECT 'tag' AS kind, tag AS grp, {DAYS_AGGREGATES} FROM by_tags, unnest(tags) AS tag "
        f"WHERE starts_with(tag, $5) GROUP BY tag ORDER BY {by_cost}{cut})",
        f"(SELECT '{UNTAGGED_KIND}', NULL, {DAYS_AGGREGATES} FROM by_tags "
        "WHERE NOT EXISTS (SELECT 1 FROM unnest(tags) AS tag WHERE starts_with(tag, $5)))",
        f"(SELECT '{TOTAL_KIND}', NULL, {DAYS_AGGREGATES} FROM combos)",
        f"(SELECT '{STATUS_KIND}', cost_status, {DAYS_AGGREGATES} FROM combos GROUP BY cost_status "
        "ORDER BY cost_status)",
    ]
    for kind, expression in expressions.items():
        if kind == "day":
            parts.append(
                f"(SELECT 'day', to_char(day, 'YYYY-MM-DD'), {DAYS_AGGREGATES} FROM src GROUP BY day ORDER BY day{cut})"
            )
            continue
        source = "by_tags" if kind in of_tags else "combos"
        parts.append(
            f"(SELECT '{kind}', {expression} AS grp, {DAYS_AGGREGATES} FROM {source} "
            f"GROUP BY 2 ORDER BY {by_cost}{cut})"
        )
    union = "\nUNION ALL\n".join(parts)
    return f"""
WITH src AS MATERIALIZED (SELECT * FROM {days_source(where)}),
combos AS MATERIALIZED (
    SELECT profile_id, provider, model, cost_status, tags, {sums}
    FROM src GROUP BY profile_id, provider, model, cost_status, tags
),
by_tags AS MATERIALIZED (SELECT tags, {sums} FROM combos GROUP BY tags)
{union}"""


def tag_counting_note(tag_key: str) -> str:
    """What a grouping by a tag key says of the calls that carry two tags of the key, in one sentence: `cos report
    cost`'s note and the console's."""
    return (
        f"A call that carries more than one {tag_key} tag ({tag_key}:a and {tag_key}:b) is counted in the group of "
        "each, so the groups can add up to more than the total, which counts every call once."
    )
