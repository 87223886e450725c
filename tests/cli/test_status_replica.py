"""`cos status` and the read replica (COS_DATABASE_READ_URL), against a real streaming replica (tests/conftest.py
`replicated_pg`): "no replica" without the variable; 0 s / 0 bytes behind once it has replayed everything; the
seconds and bytes behind, "replay paused", while its replay is paused and the primary writes (in the table and in
`--format json`); a read URL that is no standby, or that does not answer, is a problem (exit 1)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats

from commonos.runtime.embedded import free_port
from commonos.runtime.nats import ensure_streams
from commonos.runtime.postgres import connect
from tests.harness import Replicated


def cos_status(env: dict[str, str], tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COS_")}
    clean |= {"COS_DATA_DIR": str(tmp_path / "none"), **env}
    return subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", "status", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def as_json(env: dict[str, str], tmp_path: Path) -> tuple[int, dict[str, Any]]:
    done = cos_status(env, tmp_path, "--format", "json")
    return done.returncode, json.loads(done.stdout)


async def test_status_reports_the_replicas_lag(
    replicated_pg: Replicated, replica_database: tuple[str, str], nats_url: str, tmp_path: Path
) -> None:
    primary_dsn, replica_dsn = replica_database
    nc = await nats.connect(nats_url)
    await ensure_streams(nc.jetstream())
    await nc.close()
    env = {"COS_NATS_URL": nats_url, "COS_DATABASE_URL": primary_dsn}

    done = await asyncio.to_thread(cos_status, env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PostgreSQL read replica: no replica (COS_DATABASE_READ_URL is not set)" in done.stdout, done.stdout
    code, body = await asyncio.to_thread(as_json, env, tmp_path)
    assert code == 0 and body["replica"] == "no replica" and body["replica_url"] is None, body
    assert body["replica_lag_seconds"] is None and body["replica_lag_bytes"] is None

    env["COS_DATABASE_READ_URL"] = replica_dsn
    code, body = await asyncio.to_thread(as_json, env, tmp_path)
    assert code == 0, body
    assert (body["replica_lag_seconds"], body["replica_lag_bytes"], body["replica_paused"]) == (0.0, 0, False), body
    assert body["replica"] == "0.0 s behind (0 bytes received, not yet replayed)"

    await replicated_pg.pause()
    conn = await connect(primary_dsn)
    try:
        await conn.execute("CREATE TABLE written_while_paused AS SELECT generate_series(1, 1000) AS n")
    finally:
        await conn.close()
    code, body = await asyncio.to_thread(as_json, env, tmp_path)
    assert code == 0, body  # a lagging replica is reported, not a failure
    assert body["replica_paused"] is True and body["replica_lag_bytes"] > 0 and body["replica_lag_seconds"] > 0, body
    done = await asyncio.to_thread(cos_status, env, tmp_path)
    line = next(x for x in done.stdout.splitlines() if x.startswith("PostgreSQL read replica: "))
    assert line.startswith(f"PostgreSQL read replica: {replica_dsn}: ") and " s behind (" in line, line
    assert line.endswith("received, not yet replayed), replay paused"), line
    await replicated_pg.resume()
    await replicated_pg.caught_up()
    code, body = await asyncio.to_thread(as_json, env, tmp_path)
    assert (body["replica_lag_seconds"], body["replica_lag_bytes"], body["replica_paused"]) == (0.0, 0, False), body

    # A read URL that is the primary itself, or that nothing answers: problems.
    code, body = await asyncio.to_thread(as_json, env | {"COS_DATABASE_READ_URL": primary_dsn}, tmp_path)
    assert code == 1 and body["replica"] == "not a standby (pg_is_in_recovery() is false)", body
    assert [p for p in body["problems"] if "is not a standby" in p], body["problems"]
    gone = f"postgresql://postgres@127.0.0.1:{free_port()}/commonos"
    code, body = await asyncio.to_thread(as_json, env | {"COS_DATABASE_READ_URL": gone}, tmp_path)
    assert code == 1 and body["replica"].startswith("no answer"), body
    assert f"the read replica does not answer at {gone} (COS_DATABASE_READ_URL)" in body["problems"], body["problems"]
