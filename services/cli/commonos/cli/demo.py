"""`cos demo`: the whole system on one machine, one scripted conversation, the seed's three queries.

It starts what `cos up` starts (its own NATS and PostgreSQL unless URLs are configured, the
journal-writer, billing, the loop, the OTLP gateway and the console, whose addresses it prints), sends
the demo profile a message whose scripted replies make a tool call, a risky call that is approved, one
refused by policy and a delegated child turn, waits until every event is projected, prints the results
of the specification's three queries and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import nats
import nats.js.errors
from rich.console import Console
from rich.table import Table
from rich.text import Text

from commonos.cli.up import NATS_IDENTITY, price_scripted_calls, start_system
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.args import CliError
from commonos.runtime.cli_support import as_text
from commonos.runtime.postgres import connect
from commonos.runtime.settings import Settings
from commonos.runtime.system import Endpoints, clear_state

MESSAGE = "Do I need an umbrella in Charleston today?"

QUERIES = {
    "The last ten turns, with their status": """
SELECT t.started_at, t.profile_id, t.status, t.depth, s.title
FROM turns t JOIN sessions s ON s.id = t.session_id
ORDER BY t.started_at DESC
LIMIT 10;""",
    "Tool calls that needed approval, and the answer": """
SELECT tc.name, tc.args, a.status, a.decided_at
FROM approvals a JOIN tool_calls tc ON tc.id = a.tool_call_id
ORDER BY a.decided_at DESC;""",
    "Cost per client this month": """
SELECT tag, sum(cost_usd) AS usd, count(*) AS calls
FROM model_calls, unnest(tags) AS tag
WHERE tag LIKE 'client:%' AND created_at >= date_trunc('month', now())
GROUP BY tag
ORDER BY usd DESC;""",
}

#: The consumers whose tables the queries read.
CONSUMERS = ("journal-writer", "billing")


async def wait_projected(endpoints: Endpoints, timeout_s: float = 60.0) -> None:
    """Until every consumer the queries depend on has applied everything in the stream."""
    nc = await nats.connect(endpoints.nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout_s
        for name in CONSUMERS:
            while True:
                try:
                    info = await js.consumer_info(EVENTS_STREAM, name)
                    if info.num_pending == 0 and info.num_ack_pending == 0:
                        break
                except nats.js.errors.NotFoundError:
                    pass
                if time.monotonic() > deadline:
                    raise CliError(f"{name} did not catch up with the stream within {timeout_s:.0f}s")
                await asyncio.sleep(0.1)
    finally:
        await nc.close()


async def run_queries(database_url: str) -> dict[str, list[asyncpg.Record]]:
    conn = await connect(database_url)
    try:
        return {title: await conn.fetch(sql) for title, sql in QUERIES.items()}
    finally:
        await conn.close()


def print_results(console: Console, results: dict[str, list[asyncpg.Record]]) -> None:
    for title, rows in results.items():
        table = Table(title=as_text(title), title_justify="left")
        columns = list(rows[0].keys()) if rows else ["(no rows)"]
        for col in columns:
            table.add_column(as_text(col), overflow="fold")
        for row in rows:
            table.add_row(*(as_text(_cell(v)) for v in row.values()))
        console.print(table)


def explore_command(data_dir: Path) -> str:
    """The command that runs the system again on the demo's data: `cos up` in the demo's COS_DATA_DIR (its
    own is `.cos`, where the demo's tables are not)."""
    return f"COS_DATA_DIR={shlex.quote(str(data_dir))} cos up"


def explore_hint(data_dir: Path) -> str:
    folder = shlex.quote(str(data_dir))
    return (
        "To explore the demo's data, run cos up on its folder:\n"
        f"  {explore_command(data_dir)}\n"
        f"and give the other commands the same folder (COS_DATA_DIR={folder} cos report cost)"
    )


def _cell(value: Any) -> str:
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return "" if value is None else str(value)


def _demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("COS_DATA_DIR", str(Path(".cos") / "demo"))
    price_scripted_calls()
    settings = Settings.from_env()
    console = Console()
    console.print("[bold]Starting CommonOS[/bold] (embedded NATS and PostgreSQL unless COS_*_URL are set)")
    system = start_system(settings)
    try:
        system.print_state(console)
        assert system.endpoints is not None
        console.print(Text.assemble("\n", ("you>", "bold"), " ", as_text(args.message)))
        env = {
            **os.environ,
            "COS_NATS_URL": system.endpoints.nats_url,
            "COS_DATABASE_URL": system.endpoints.database_url,
        }
        if system.nats is not None:  # its URL carries the admin's login; a COS_NATS_USER of ours is for others
            env = {k: v for k, v in env.items() if k not in NATS_IDENTITY}
        chat = subprocess.run(
            [
                sys.executable,
                "-m",
                "commonos.cli.main",
                "chat",
                "--profile",
                args.profile,
                "--tag",
                "client:acme",
                "--tag",
                "project:site",
                "--yes",
                "-v",
                args.message,
            ],
            env=env,
            check=False,
        )
        if chat.returncode != 0:
            raise CliError(f"the demo turn failed (exit {chat.returncode}); logs in {settings.data_dir / 'logs'}")
        asyncio.run(wait_projected(system.endpoints))
        console.print()
        print_results(console, asyncio.run(run_queries(system.endpoints.database_url)))
        console.print(as_text(f"\nData and logs: {settings.data_dir.resolve()} (the tables stay)."))
        # Unwrapped: the command is copied from here.
        console.print(as_text(explore_hint(settings.data_dir)), soft_wrap=True)
    finally:
        clear_state(settings)
        system.stop()
    return 0


def register(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="run the system, one scripted conversation, and the seed's three queries",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--profile", default="default", help="profile to talk to (default: default)")
    demo.add_argument("message", nargs="?", default=MESSAGE, help=f"the message (default: {MESSAGE!r})")
    demo.set_defaults(handler=_demo)
