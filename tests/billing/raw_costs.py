"""The cost reports as they were computed from `model_calls` alone, before the daily rollup: the reference the
rollup's queries are compared with (`cos report cost`, the console's tables, the invariant of `model_call_days`)."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from commonos.accounting.cost_queries import (
    GROUP_EXPRESSIONS,
    RANGE,
    TOTAL_LABEL,
    TOTAL_SQL,
    UNTAGGED_LABEL,
    UNTAGGED_SQL,
    CostRow,
    grouped_sql,
    tag_counting_note,
)
from commonos.billing.report import CostReport, GroupBy
from commonos.runtime.postgres import Conn

#: The outside-the-range query `cos report cost` ran on model_calls.
OUTSIDE_SQL = f"""
    SELECT count(*) FILTER (WHERE created_at < $1) AS before, min(created_at) AS first,
           count(*) FILTER (WHERE $2::timestamptz IS NOT NULL AND created_at >= $2) AS after
    FROM model_calls WHERE NOT ({RANGE})"""

#: The console's per-status query on model_calls.
STATUS_SQL = f"""
    SELECT cost_status, count(*) AS calls, sum(cost_usd) AS usd FROM model_calls WHERE {RANGE}
    GROUP BY cost_status ORDER BY cost_status"""


async def raw_report(conn: Conn, group_by: GroupBy, since: datetime | None, until: datetime | None) -> CostReport:
    """`cost_report` as it was, over model_calls alone (the notes too)."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        resolved = since if since is not None else await conn.fetchval("SELECT date_trunc('month', now())")
        args: list[Any] = [resolved, until]
        if group_by.kind == "tag":
            args.append(f"{group_by.tag_key}:")
        records = await conn.fetch(grouped_sql(group_by.kind), *args)
        total = await conn.fetchrow(TOTAL_SQL, resolved, until)
        untagged = await conn.fetchrow(UNTAGGED_SQL, *args) if group_by.kind == "tag" else None
        outside = await conn.fetchrow(OUTSIDE_SQL, resolved, until)
    assert total is not None and outside is not None
    total_row = CostRow.from_record(total, None, TOTAL_LABEL)
    notes: list[str] = []
    if group_by.tag_key is not None:  # a grouping by a tag key
        notes.append(tag_counting_note(group_by.tag_key))
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
    return CostReport(
        group_by,
        resolved,
        until,
        [CostRow.from_record(r, r["grp"], r["grp"] or "") for r in records],
        total_row,
        CostRow.from_record(untagged, None, UNTAGGED_LABEL) if untagged is not None and untagged["calls"] else None,
        notes,
    )


async def raw_grouped(
    conn: Conn, kind: str, since: datetime, until: datetime | None, tag_key: str, expressions: Any = None
) -> list[tuple[Any, ...]]:
    """One grouping's rows over model_calls (as tuples), then its (none) row for a tag grouping."""
    args: list[Any] = [since, until, f"{tag_key}:"] if kind == "tag" else [since, until]
    sql = grouped_sql(kind, expressions or GROUP_EXPRESSIONS)
    rows = [tuple(r) for r in await conn.fetch(sql, *args)]
    if kind == "tag":
        rows.append(tuple(await conn.fetchrow(UNTAGGED_SQL, *args) or ()))
    return rows


async def days_of_calls(conn: Conn) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """`model_call_days` as it should be, summed here (in Python) from every model_calls row."""
    sums: dict[tuple[Any, ...], list[Any]] = defaultdict(lambda: [0, 0, Decimal(0), 0, 0, 0, 0, 0, 0])
    for r in await conn.fetch("SELECT * FROM model_calls"):
        day: date = r["created_at"].date()  # asyncpg gives UTC times
        key = (day, r["profile_id"], r["provider"], r["model"], r["cost_status"], tuple(sorted(r["tags"])))
        s = sums[key]
        s[0] += 1
        s[1] += r["cost_usd"] is None
        s[2] += r["cost_usd"] or 0
        for i, column in enumerate(
            (
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_5m_tokens",
                "cache_write_1h_tokens",
                "reasoning_tokens",
            ),
            3,
        ):
            s[i] += r[column]
    return {key: tuple(s) for key, s in sums.items()}


async def stored_days(conn: Conn) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    out: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for r in await conn.fetch("SELECT * FROM model_call_days"):
        key = (r["day"], r["profile_id"], r["provider"], r["model"], r["cost_status"], tuple(r["tags"]))
        assert key not in out
        out[key] = (
            r["calls"],
            r["unpriced_calls"],
            r["usd"],
            *(
                int(r[c])
                for c in (
                    "input_tokens",
                    "output_tokens",
                    "cache_read_tokens",
                    "cache_write_5m_tokens",
                    "cache_write_1h_tokens",
                    "reasoning_tokens",
                )
            ),
        )
    return out
