"""`cos retention`: keep N months of the tables that grow without end, dropping older months whole.

The core tables `turns`, `messages`, `tool_calls` and `approvals` are partitioned by month. A month is dropped
once it ended at least N whole months ago (N = 3 on 5 December keeps September to December): its partitions are
detached and dropped, with no DELETE and no VACUUM, so it takes the same time however many rows it holds and the
disk comes back at once. `sessions` and `profiles` stay. The session graph (imported transcripts) keeps the
same months: its sessions that started before them are deleted with every row of theirs (its ids are minted
from identities, not times, so it is not partitioned; a delete, the one retention that is not a drop).
`model_calls` is an accounting record: its months are dropped only with --model-calls-keep-months (or
COS_MODEL_CALLS_RETENTION_MONTHS).

With --export DIR each month is first written to DIR/<table>/<partition>.parquet and listed in
DIR/manifest.json (rows, SHA-256, columns); a month whose export fails is not dropped. DuckDB reads the files
as they are: SELECT * FROM 'DIR/messages/*.parquet'.

What the stream still holds can be rebuilt (`cos replay`): COS_EVENTS keeps what COS_EVENTS_MAX_AGE allows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from commonos.runtime.args import CliError, positive_int
from commonos.runtime.cli_support import cli_database, cli_settings


def _plan_and_run(args: argparse.Namespace) -> int:
    from commonos.runtime import retention

    configured = retention.RetentionSettings.from_env()
    keep = args.keep_months or configured.keep_months
    keep_calls = args.model_calls_keep_months or configured.model_calls_keep_months
    if keep is None and keep_calls is None:
        raise CliError(
            "say how many months to keep: --keep-months N (or COS_RETENTION_MONTHS), and for model_calls "
            "--model-calls-keep-months N (or COS_MODEL_CALLS_RETENTION_MONTHS)"
        )
    export_dir: Path | None = args.export or configured.export_dir
    if export_dir is not None:
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise CliError("--export writes Parquet with pyarrow, which is not installed") from None
        export_dir.mkdir(parents=True, exist_ok=True)
    dsn = cli_settings(nats=False).database_url
    assert dsn is not None
    now = datetime.now(UTC)
    table = args.format == "table"

    def show(item: Any) -> None:
        if table:
            what = "would drop" if item.dry_run else "dropped"
            if item.deleted:
                what = "would delete" if item.dry_run else "deleted"
                rows = f"{item.rows} rows" + (f", exported with theirs to {item.export}" if item.export else "")
                print(f"{what} {item.table} of {item.month} and every row of theirs ({rows}) in {item.seconds:.2f} s")
                return
            rows = "" if item.rows is None else f", {item.rows} rows exported to {item.export}"
            print(f"{what} {item.partition} ({item.month}, {item.bytes / 1e6:.1f} MB{rows}) in {item.seconds:.2f} s")

    async def go() -> list[Any]:
        async with cli_database(dsn) as conn:
            plan = []
            if keep is not None:
                plan += await retention.due(conn, retention.tables_kept_by(False), keep, now)
            if keep_calls is not None:
                plan += await retention.due(conn, retention.tables_kept_by(True), keep_calls, now)
            expiring = []
            if keep is not None:
                for name, (key, column) in retention.tables_expiring().items():
                    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", name):
                        expiring += [
                            (m, key, column) for m in await retention.expiring_due(conn, name, column, keep, now)
                        ]
            if not plan and not expiring and table:
                print("nothing to drop: every month is within the months kept")
            done = await retention.run(conn, plan, export_dir=export_dir, dry_run=args.dry_run, progress=show)
            for month, key, column in expiring:
                item = await retention.expire(conn, month, key, column, export_dir=export_dir, dry_run=args.dry_run)
                show(item)
                done.append(item)
            return done

    done = asyncio.run(go())
    if not table:
        print(json.dumps({"dropped": retention.as_json(done), "dry_run": args.dry_run}, indent=2))
    return 0


def register(sub: Any) -> None:
    cmd = sub.add_parser(
        "retention",
        help="keep N months of the core tables (and of model_calls if asked): drop older months whole",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument(
        "--keep-months", type=positive_int, metavar="N", help="months of the core tables to keep (COS_RETENTION_MONTHS)"
    )
    cmd.add_argument(
        "--model-calls-keep-months",
        type=positive_int,
        metavar="N",
        help="months of model_calls to keep (COS_MODEL_CALLS_RETENTION_MONTHS; default: all of them)",
    )
    cmd.add_argument(
        "--export", type=Path, metavar="DIR", help="write each month to Parquet first (COS_RETENTION_EXPORT_DIR)"
    )
    cmd.add_argument("--dry-run", action="store_true", help="say what would be dropped, drop nothing")
    cmd.add_argument("--format", choices=("table", "json"), default="table")
    cmd.set_defaults(handler=_plan_and_run)
