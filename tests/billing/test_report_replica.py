"""`cos report cost` reads the read replica (COS_DATABASE_READ_URL) when there is one: on a real streaming replica
(tests/conftest.py `replicated_pg`) whose replay is paused, a call billed on the primary since is not in the report
until the replica replays it, and it is in the primary's (no read URL); a read URL nothing answers is one line
naming COS_DATABASE_READ_URL. `cos billing reprice`, which writes, never uses it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from commonos.accounting.pricing import Pricer
from commonos.billing.days import insert_calls
from commonos.billing.projection import build_row
from commonos.billing.service import billing_schemas
from commonos.runtime.embedded import free_port
from commonos.runtime.postgres import apply_schemas, connect
from tests.billing.test_report_cli import call
from tests.harness import Replicated


def cos(primary: str, replica: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
    env |= {"COS_DATABASE_URL": primary, "COS_NATS_URL": "nats://127.0.0.1:1"}
    if replica is not None:
        env["COS_DATABASE_READ_URL"] = replica
    argv = [sys.executable, "-m", "commonos.cli.main", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def report(primary: str, replica: str | None) -> subprocess.CompletedProcess[str]:
    return cos(primary, replica, "report", "cost", "--since", "100000d", "--format", "json")


async def calls_in_report(primary: str, replica: str | None) -> int:
    done = await asyncio.to_thread(report, primary, replica)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return int(json.loads(done.stdout)["total"]["calls"])


async def bill(dsn: str, *ats: datetime) -> None:
    pricer = Pricer()
    rows = [build_row(call(at, "o4-mini", input_tokens=1000), pricer) for at in ats]
    conn = await connect(dsn)
    try:
        await apply_schemas(conn, billing_schemas())
        await insert_calls(conn, rows)  # as billing writes them: the calls and their days
    finally:
        await conn.close()


async def test_the_report_reads_the_replica(replicated_pg: Replicated, replica_database: tuple[str, str]) -> None:
    primary, replica = replica_database
    now = datetime.now(UTC)
    await bill(primary, now - timedelta(days=1), now - timedelta(hours=1))
    await replicated_pg.caught_up()
    assert await calls_in_report(primary, replica) == 2

    await replicated_pg.pause()
    await bill(primary, now)
    assert await calls_in_report(primary, replica) == 2
    assert await calls_in_report(primary, None) == 3
    await replicated_pg.resume()
    await replicated_pg.caught_up()
    assert await calls_in_report(primary, replica) == 3

    port = free_port()
    done = await asyncio.to_thread(report, primary, f"postgresql://postgres@127.0.0.1:{port}/commonos")
    assert done.returncode != 0 and done.stdout == "", done
    assert done.stderr.count("\n") == 1, done.stderr
    said = f"cos: error: cannot reach PostgreSQL at postgresql://127.0.0.1:{port} (COS_DATABASE_READ_URL): "
    assert done.stderr.startswith(said), done.stderr
    # Repricing writes: the primary's, whatever the read URL.
    args = ("billing", "reprice", "--since", "100000d", "--dry-run")
    done = await asyncio.to_thread(cos, primary, f"postgresql://postgres@127.0.0.1:{port}/commonos", *args)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
