"""``cos billing serve|reprice|rebuild-days`` and ``cos report cost``.

    cos billing serve
    cos billing reprice --since 2026-11-01 [--until 2026-12-01] [--price-file prices.toml] [--dry-run]
                        [--format table|json]
    cos billing rebuild-days [--since 2026-11-01] [--until 2026-11-30]
    cos report cost [--since 2026-11-01|7d] [--until DATE] [--group-by tag:client|model|provider|day|profile]
                    [--format table|json|csv]

The database is ``COS_DATABASE_URL``, or the one of the system ``cos up`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from commonos.accounting.pricing import PriceFile, PriceFileError, load_price_file
from commonos.billing.days import rebuild_days
from commonos.billing.report import (
    FORMATS,
    GroupBy,
    ReportError,
    cost_report,
    parse_group_by,
    parse_when,
    render_report,
)
from commonos.billing.reprice import RepriceError, render_reprice, reprice
from commonos.billing.settings import BillingSettings
from commonos.runtime.args import CliError, command_group
from commonos.runtime.cli_support import cli_database, cli_settings
from commonos.runtime.settings import Settings

T = TypeVar("T")


def _when(text: str) -> datetime:
    try:
        return parse_when(text)
    except ReportError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _group_by(text: str) -> GroupBy:
    try:
        return parse_group_by(text)
    except ReportError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def database_url(settings: Settings) -> str:
    """Only PostgreSQL is needed here: COS_DATABASE_URL alone is enough."""
    url = cli_settings(settings, nats=False).database_url
    assert url is not None  # cli_settings raises CliError when there is none
    return url


def read_database_url(settings: Settings) -> str:
    """Where a report reads: the read replica (COS_DATABASE_READ_URL) when there is one, else COS_DATABASE_URL."""
    if settings.database_read_url:
        return settings.database_read_url
    return database_url(settings)


async def _with_database(dsn: str, work: Callable[[Any], Awaitable[T]], variable: str = "COS_DATABASE_URL") -> T:
    async with cli_database(dsn, variable) as conn:
        try:
            return await work(conn)
        except asyncpg.UndefinedTableError:
            raise CliError("no model_calls table in this database: billing has not run here yet") from None


def _report_cost(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    dsn = read_database_url(settings)
    variable = "COS_DATABASE_READ_URL" if settings.database_read_url else "COS_DATABASE_URL"

    async def work(conn: Any) -> str:
        report = await cost_report(conn, args.group_by, args.since, args.until)
        return render_report(report, args.format)

    # CSV lines end with CRLF (RFC 4180), the last one too.
    print(asyncio.run(_with_database(dsn, work, variable)), end="" if args.format == "csv" else "\n")
    return 0


def _reprice(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    own = BillingSettings.from_env()
    path: Path | None = args.price_file or own.price_file
    price_file: PriceFile | None = None
    if path is not None:
        try:
            price_file = load_price_file(path)
        except PriceFileError as exc:
            raise CliError(str(exc)) from None
    if args.until is not None and args.until <= args.since:
        raise CliError("--until must be after --since")
    dsn = database_url(settings)

    async def work(conn: Any) -> str:
        try:
            result = await reprice(
                conn, args.since, args.until, price_file, dry_run=args.dry_run, priced_events=own.priced_events
            )
        except RepriceError as exc:
            raise CliError(str(exc)) from None
        return render_reprice(result, args.format)

    print(asyncio.run(_with_database(dsn, work)))
    return 0


def _relayout(args: argparse.Namespace) -> int:
    from commonos.billing.schema import BACKFILL, MODEL_CALLS, SCHEMA
    from commonos.runtime import partitions

    dsn = database_url(Settings.from_env())
    columns = [c.name for c in MODEL_CALLS.columns] + ["recorded_at", "repriced_at"]

    async def work(conn: Any) -> int:
        assert MODEL_CALLS.partition_by is not None
        if await conn.fetchval("SELECT to_regclass($1)", MODEL_CALLS.name) is None:
            raise asyncpg.UndefinedTableError("model_calls")
        return await partitions.relayout(
            conn, MODEL_CALLS.name, MODEL_CALLS.partition_by, columns, [SCHEMA], after=[BACKFILL]
        )

    moved = asyncio.run(_with_database(dsn, work))
    if moved < 0:
        print("model_calls is partitioned by month already: nothing to do")
    else:
        print(f"model_calls moved into monthly partitions: {moved} rows, each as it was")
    return 0


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date (2026-11-01)") from None


def _rebuild_days(args: argparse.Namespace) -> int:
    dsn = database_url(Settings.from_env())
    first: date = args.since or date.min
    last: date = args.until or date.max
    if last < first:
        raise CliError("--until must not be before --since")

    async def work(conn: Any) -> str:
        done = await rebuild_days(conn, first, last)
        return (
            f"model_call_days {done.first} .. {done.last}: {done.before} row(s) replaced by {done.after}; "
            f"session_costs: {done.sessions} session(s) computed again, {done.sessions_after} with calls"
        )

    print(asyncio.run(_with_database(dsn, work)))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from commonos.billing.service import main

    return main()


def register(sub: Any) -> None:
    billing_sub = command_group(
        sub,
        "billing",
        "CommonBill: priced model calls, repricing",
        "CommonBill prices every model call into the model_calls table.",
    )
    serve = billing_sub.add_parser(
        "serve", help="run the billing consumer in the foreground (COS_PRICE_FILE, COS_BILLING_CONFIG)"
    )
    serve.set_defaults(handler=_serve)

    billing_sub.add_parser(
        "relayout",
        help="move a model_calls table of an older version into monthly partitions, every row as it is",
        description="Older versions kept model_calls as one table; billing refuses to start on it. Stop billing, "
        "run this once (one transaction: readers wait for it), start billing. Every row is kept as it is, repriced "
        "costs included.",
    ).set_defaults(handler=_relayout)

    rp = billing_sub.add_parser(
        "reprice",
        help="price stored calls again with the current prices and print what changed",
        description="Recompute cost_usd of stored calls with today's genai-prices data and price file. Only rows "
        "whose cost, status or price source change are updated (with the new price version): running it again "
        "changes nothing.",
    )
    rp.add_argument("--since", required=True, type=_when, help="first call time (date, date-time or 7d)")
    rp.add_argument("--until", type=_when, help="end of the range, exclusive (default: no end)")
    rp.add_argument("--price-file", type=Path, help="operator price file (default: COS_PRICE_FILE)")
    rp.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    rp.add_argument("--format", choices=("table", "json"), default="table")
    rp.set_defaults(handler=_reprice)

    rd = billing_sub.add_parser(
        "rebuild-days",
        help="compute the daily cost rollup again from model_calls (after changing model_calls by hand)",
        description="Billing keeps model_call_days (what cost reports read for whole days) and session_costs (what "
        "the console ranks sessions by) equal to the sums of model_calls in the same transactions. After deleting "
        "or editing model_calls rows by hand, rebuild the UTC days that changed (default: every day): the sessions "
        "with a call on them are computed again too.",
    )
    rd.add_argument("--since", type=_day, help="first UTC day (default: the first there is)")
    rd.add_argument("--until", type=_day, help="last UTC day, inclusive (default: the last there is)")
    rd.set_defaults(handler=_rebuild_days)

    report_sub = command_group(sub, "report", "reports over the stored data", metavar="REPORT")
    cost = report_sub.add_parser(
        "cost",
        help="cost of model calls by tag key, model, provider, day or profile",
        description="Per-tag groups count a call once in every group it belongs to; the total counts it once.",
    )
    cost.add_argument("--since", type=_when, help="first call time (default: start of this month)")
    cost.add_argument("--until", type=_when, help="end of the range, exclusive (default: now)")
    cost.add_argument(
        "--group-by",
        type=_group_by,
        default=GroupBy("model"),
        metavar="tag:KEY|model|provider|day|profile",
        help="what to group by (default: model)",
    )
    cost.add_argument("--format", choices=FORMATS, default="table")
    cost.set_defaults(handler=_report_cost)


__all__ = ["database_url", "read_database_url", "register"]
