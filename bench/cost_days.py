"""The console's Costs page over 90 days, from `model_calls` alone and from the daily rollup `model_call_days`:
`python -m bench.cost_days [--rows 1000000] [--days 120] [--runs 7]`. Not part of `make bench`.

Its own PostgreSQL (fsync off: the load is not what is measured) in a temporary folder. The rows are synthetic
billing rows written with one INSERT … SELECT from generate_series, spread evenly over the last `--days` days:
20 clients (each of one of 5 profiles, 15 of them with a team tag), six models of three providers, the codex
model's calls tagged vendor:codex and a third of the Anthropic models' vendor:claude-code (imported work), one
call of twenty unpriced. The rollup is then filled by billing's own statement
(`commonos.billing.schema.REBUILD_CALL_DAYS`, the consumer's aggregation), VACUUM (ANALYZE).

Measured, each `--runs` times after one warm-up run, on one connection in a repeatable-read transaction as the
console opens it: every cost query of the page for `since = 90d` (a time of day: a partial first day), `until`
open, tag key `client` (the six groupings, the (none) row, the total, the statuses), once as the page ran them
before the rollup (over `model_calls`) and once as it runs them now (`commonos.console.pages.costs.load`, which
reads the rollup for whole days and `model_calls` for the partial one); then the queries of `cos report cost
--group-by tag:client --since 90d` both ways (groups, (none), total, the calls outside the range). The page
gives the same rows both ways, checked before timing. Medians and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from commonos.accounting.cost_queries import (
    GROUP_EXPRESSIONS,
    RANGE,
    TOTAL_SQL,
    UNTAGGED_SQL,
    grouped_sql,
)
from commonos.billing.report import GroupBy, cost_report
from commonos.billing.schema import REBUILD_CALL_DAYS, SCHEMA
from commonos.console.pages.costs import GROUPINGS, MAX_GROUPS, ORIGIN, Params, load
from commonos.runtime.embedded import PostgresCluster

#: The report's count of the calls outside the range as it was, over model_calls.
RAW_OUTSIDE_SQL = f"""
    SELECT count(*) FILTER (WHERE created_at < $1) AS before, min(created_at) AS first,
           count(*) FILTER (WHERE $2::timestamptz IS NOT NULL AND created_at >= $2) AS after
    FROM model_calls WHERE NOT ({RANGE})"""

#: The page's per-status query as it was, over model_calls.
RAW_STATUS_SQL = f"""
    SELECT cost_status, count(*) AS calls, sum(cost_usd) AS usd FROM model_calls WHERE {RANGE}
    GROUP BY cost_status ORDER BY cost_status"""

FILL = """
INSERT INTO model_calls (event_id, profile_id, session_id, provider, model, input_tokens, output_tokens,
    cache_read_tokens, cache_write_5m_tokens, cache_write_1h_tokens, reasoning_tokens, cost_usd, cost_status,
    price_source, price_version, tags, created_at)
SELECT gen_random_uuid(), 'profile-' || (s.client % 5), gen_random_uuid(),
       (ARRAY['anthropic', 'anthropic', 'openai', 'openai', 'openai', 'google'])[s.model + 1],
       (ARRAY['claude-sonnet-4-5', 'claude-haiku-4-5', 'o4-mini', 'gpt-5', 'gpt-5-codex', 'gemini-2.5-pro'])
           [s.model + 1],
       s.input, s.output, s.input * 4, s.input / 10, 0, s.output / 3,
       CASE WHEN s.unpriced THEN NULL ELSE round((s.input * 3 + s.output * 15) / 1e6, 10) END,
       CASE WHEN s.unpriced THEN 'unpriced' ELSE 'priced' END, 'genai-prices', '0.0.0',
       ARRAY['client:c' || s.client]
         || CASE WHEN s.client % 4 < 3 THEN ARRAY['team:t' || (s.client % 4)] ELSE ARRAY[]::text[] END
         || CASE WHEN s.model = 4 THEN ARRAY['vendor:codex']
                 WHEN s.model < 2 AND s.vendor < 6 THEN ARRAY['vendor:claude-code'] ELSE ARRAY[]::text[] END,
       $2::timestamptz + (s.i * $3::double precision) * interval '1 microsecond'
FROM (
    SELECT i, (random() * 19)::int AS client, (random() * 5)::int AS model, (random() * 3)::int AS team,
           (random() * 19)::int AS vendor, random() < 0.05 AS unpriced,
           (random() * 20000)::bigint AS input, (random() * 2000)::bigint AS output
    FROM generate_series(0, $1 - 1) AS i
) s"""


async def raw_page(conn: asyncpg.Connection, since: datetime) -> list[Any]:
    """The page's cost queries as they were (`load` before the rollup), over model_calls."""
    expressions = {**GROUP_EXPRESSIONS, "origin": ORIGIN}
    out: list[Any] = []
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        for kind in GROUPINGS:
            args: list[Any] = [since, None, "client:"] if kind == "tag" else [since, None]
            out.append([tuple(r) for r in await conn.fetch(grouped_sql(kind, expressions, MAX_GROUPS + 1), *args)])
            if kind == "tag":
                out.append(tuple(await conn.fetchrow(UNTAGGED_SQL, *args) or ()))
        out.append(tuple(await conn.fetchrow(TOTAL_SQL, since, None) or ()))
        out.append([tuple(r) for r in await conn.fetch(RAW_STATUS_SQL, since, None)])
    return out


async def rollup_page(conn: asyncpg.Connection, since: datetime) -> Any:
    async with conn.transaction():
        return await load(conn, Params(since, None, "client"))


def same(raw: list[Any], page: Any) -> bool:
    """The page's tables hold the raw queries' rows (Decimal sums equal the page's ints)."""
    kinds = {kind: getattr(page, f"by_{kind}") for kind in GROUPINGS}
    position = 0
    for kind in GROUPINGS:
        rows = raw[position]
        position += 1
        mine = [
            (
                r.group,
                r.usd,
                r.calls,
                r.unpriced_calls,
                r.input_tokens,
                r.output_tokens,
                r.cache_read_tokens,
                r.cache_write_tokens,
                r.reasoning_tokens,
            )
            for r in kinds[kind].rows
        ]
        if mine != rows[:MAX_GROUPS]:
            return False
        if kind == "tag":
            position += 1  # the (none) row: compared through the total below
    total = page.total
    have = (
        total.usd,
        total.calls,
        total.unpriced_calls,
        total.input_tokens,
        total.output_tokens,
        total.cache_read_tokens,
        total.cache_write_tokens,
        total.reasoning_tokens,
    )
    return (
        bool(have == raw[position]) and [(s.cost_status, s.calls, s.usd) for s in page.by_status] == raw[position + 1]
    )


async def timed(runs: int, step: Callable[[], Awaitable[Any]]) -> list[float]:
    await step()  # warm-up
    out: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        await step()
        out.append(time.perf_counter() - start)
    return out


def line(name: str, samples: list[float]) -> str:
    ms = [s * 1000 for s in samples]
    return f"{name:<44} median {statistics.median(ms):9.1f} ms   (min {min(ms):.1f}, max {max(ms):.1f})"


def start_pg(root: str) -> PostgresCluster:
    Path(root).chmod(0o755)  # the server may run as another user (as root: `cos up`'s own)
    return PostgresCluster(Path(root) / "pg", durable=False).start()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="cos-bench-days-") as root:
        pg = start_pg(root)
        try:
            conn = await asyncpg.connect(pg.url)
            try:
                await conn.execute(SCHEMA)
                now = datetime.now(UTC)
                first = now - timedelta(days=args.days)
                step_us = args.days * 86_400e6 / args.rows
                started = time.perf_counter()
                await conn.execute(FILL, args.rows, first, step_us)
                await conn.execute(REBUILD_CALL_DAYS, first.date(), now.date())
                await conn.execute("VACUUM (ANALYZE) model_calls, model_call_days")
                counts = await conn.fetchrow(
                    "SELECT (SELECT count(*) FROM model_calls) AS calls, (SELECT count(*) FROM model_call_days) AS days"
                )
                assert counts is not None
                print(
                    f"{counts['calls']:,} model_calls rows over {args.days} days -> {counts['days']:,} model_call_days "
                    f"rows (loaded in {time.perf_counter() - started:.0f} s); PostgreSQL "
                    + str(await conn.fetchval("SHOW server_version"))
                )
                since = now - timedelta(days=90)
                if not same(await raw_page(conn, since), await rollup_page(conn, since)):
                    raise SystemExit("the page's tables differ from the raw queries: not timing")
                raw = await timed(args.runs, lambda: raw_page(conn, since))
                rollup = await timed(args.runs, lambda: rollup_page(conn, since))
                print(f"Costs page, since 90d, tag client, {args.runs} runs each after a warm-up:")
                print(line("  over model_calls (before)", raw))
                print(line("  model_call_days + model_calls' partial day", rollup))
                print(f"  ratio {statistics.median(raw) / statistics.median(rollup):.1f}x")

                group = GroupBy("tag", "client")

                async def report_raw() -> Any:
                    """`cost_report`'s queries as they were."""
                    async with conn.transaction(isolation="repeatable_read", readonly=True):
                        await conn.fetch(grouped_sql("tag"), since, None, "client:")
                        await conn.fetchrow(TOTAL_SQL, since, None)
                        await conn.fetchrow(UNTAGGED_SQL, since, None, "client:")
                        return await conn.fetchrow(RAW_OUTSIDE_SQL, since, None)

                report_rollup = await timed(args.runs, lambda: cost_report(conn, group, since))
                report_before = await timed(args.runs, report_raw)
                print("cos report cost --group-by tag:client --since 90d, its queries:")
                print(line("  over model_calls (before)", report_before))
                print(line("  model_call_days + model_calls' partial day", report_rollup))
                print(f"  ratio {statistics.median(report_before) / statistics.median(report_rollup):.1f}x")
            finally:
                await conn.close()
        finally:
            pg.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.cost_days", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=120)
    parser.add_argument("--runs", type=int, default=7)
    asyncio.run(main(parser.parse_args()))
