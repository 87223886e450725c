"""`python -m clients gateway`: the real CLIs' telemetry through our OTLP gateway, then their transcripts through
`cos import`, billed once each, exactly the fake model server's usage.

For each scenario of each CLI (the same scenarios `make clients` records): a profile of its own
(`<cli>-<scenario>`) and a gateway token for it; the CLI runs against the fake model server with its
OpenTelemetry sent to the gateway of a `cos up` running in a temporary folder (Claude Code's OTLP logs and
metrics, over OTLP/HTTP JSON or, with ``--protocol``, OTLP/HTTP protobuf or OTLP/gRPC; Codex's OTLP logs over
OTLP/HTTP JSON); then `cos import` reads the transcripts the CLI wrote into the same profile.
Billing must then hold exactly one row per call the fake server answered (a call it stalled, which the CLI
never received, in neither source), with the server's own token counts, whichever source stored it first.
Prints one line per scenario and exits 1 on any difference.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg

from clients.fakemodel import FakeModel
from clients.run import Otlp, install, real, run_scenario
from clients.scenarios import CLAUDE, SCENARIOS

REPO = Path(__file__).resolve().parent.parent
#: Our buckets, from the server's `expected` per call (the cache write total is 5m + 1h).
BUCKETS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
ROWS = """
SELECT count(*) AS calls,
       coalesce(sum(input_tokens), 0) AS input_tokens,
       coalesce(sum(output_tokens), 0) AS output_tokens,
       coalesce(sum(cache_read_tokens), 0) AS cache_read_tokens,
       coalesce(sum(cache_write_5m_tokens + cache_write_1h_tokens), 0) AS cache_write_tokens,
       coalesce(sum(reasoning_tokens), 0) AS reasoning_tokens,
       count(reported_cost_usd) AS with_reported_cost
FROM model_calls WHERE profile_id = $1
"""


def _cos(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COS_DATA_DIR": str(data)}
    for name in ("COS_NATS_URL", "COS_DATABASE_URL"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", *args], env=env, capture_output=True, text=True, check=False
    )


class Up:
    """A `cos up` in a folder of its own, for the duration of the check."""

    def __init__(self, root: Path) -> None:
        self.data = root / "data"
        self.out = root / "cos-up.out"
        env = {k: v for k, v in os.environ.items() if k not in ("COS_NATS_URL", "COS_DATABASE_URL")}
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "commonos.cli.main", "up"],
                cwd=REPO,
                env={**env, "COS_DATA_DIR": str(self.data)},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait(self, timeout_s: float = 180.0) -> tuple[str, str, str]:
        """(the gateway's OTLP/HTTP and OTLP/gRPC endpoints, the database URL) once `cos up` has said it is ready."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"cos up exited {self.proc.returncode}: {self.out.read_text()[-2000:]}")
            said = self.out.read_text(errors="replace")
            found = re.search(r"^OpenTelemetry \(OTLP/HTTP\): (\S+)", said, re.MULTILINE)
            grpc = re.search(r"^OpenTelemetry \(OTLP/gRPC\): (\S+)", said, re.MULTILINE)
            state = self.data / "state.json"
            if found and grpc and state.exists():
                return found.group(1), grpc.group(1), str(json.loads(state.read_text())["database_url"])
            time.sleep(0.5)
        raise SystemExit(f"cos up was not ready within {timeout_s:.0f} s: {self.out.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def expected(log: list[dict[str, Any]]) -> dict[str, int]:
    """The answered calls of the server's log, in our buckets."""
    answered = [line for line in log if not line.get("stalled")]
    sums = Counter[str]()
    for line in answered:
        for bucket in BUCKETS:
            sums[bucket] += int(line["expected"].get(bucket) or 0)
    return {"calls": len(answered), **{b: sums[b] for b in BUCKETS}}


async def billed(dsn: str, profile: str, calls: int, timeout_s: float = 90.0) -> dict[str, int]:
    """The profile's rows once billing has `calls` of them and nothing more arrives for a moment."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        last: dict[str, int] = {}
        stable_since = time.monotonic()
        while True:
            record = await conn.fetchrow(ROWS, profile)
            assert record is not None  # an aggregate always has its row
            row = dict(record)
            now = time.monotonic()
            if row != last:
                last, stable_since = row, now
            if (row["calls"] >= calls and now - stable_since > 3.0) or now > deadline:
                return {k: int(v) for k, v in row.items()}
            await asyncio.sleep(0.5)
    finally:
        await conn.close()


async def check(
    versions: dict[str, str], only_cli: list[str] | None, only: list[str] | None, protocol: str = "http/json"
) -> int:
    """Every scenario through the gateway; Claude Code's telemetry over `protocol`."""
    failures = 0
    with tempfile.TemporaryDirectory(prefix="cos-clients-gateway-") as tmp:
        root = real(tmp)
        root.chmod(0o755)  # PostgreSQL runs as an unprivileged user when this runs as root: it must reach its folder
        up = Up(root)
        server = FakeModel()
        try:
            endpoint, grpc_endpoint, dsn = up.wait()
            print(f"cos up in {up.data}; OTLP gateway at {endpoint} and {grpc_endpoint} (gRPC)", flush=True)
            print(f"Claude Code sends OTEL_EXPORTER_OTLP_PROTOCOL={protocol}", flush=True)
            await server.start()
            for cli, version in versions.items():
                if only_cli and cli not in only_cli:
                    continue
                exe = install(cli, version)
                for scenario in SCENARIOS[cli]():
                    if only and scenario.name not in only:
                        continue
                    profile = f"{cli}-{scenario.name}"
                    made = _cos(up.data, "otlp", "token", "create", "--profile", profile)
                    if made.returncode != 0:
                        raise SystemExit(f"cos otlp token create: {made.stderr.strip()}")
                    token = made.stdout.split()[0]
                    otlp = (
                        Otlp(grpc_endpoint if protocol == "grpc" else endpoint, token, protocol)
                        if cli == CLAUDE
                        else Otlp(endpoint, token)
                    )
                    home = root / profile
                    outcomes, _, _, tree = await run_scenario(cli, exe, scenario, server, home, otlp)
                    want = expected(server.log)
                    telemetry_only = await billed(dsn, profile, 0, timeout_s=10.0)
                    vendor = "claude" if cli == CLAUDE else "codex"
                    imported = _cos(up.data, "import", vendor, str(tree), "--profile", profile, "--no-progress")
                    if imported.returncode not in (0, 1):
                        raise SystemExit(f"cos import {vendor} exited {imported.returncode}: {imported.stderr}")
                    got = await billed(dsn, profile, want["calls"])
                    same = {k: got[k] for k in want} == want
                    failures += not same
                    runs = ", ".join(str(o.code) for o in outcomes)
                    print(
                        f"{cli} {scenario.name}: {'ok' if same else 'DIFFERENT'} - server answered "
                        f"{want['calls']} call(s); over OTLP {telemetry_only['calls']} billed before the import, "
                        f"{got['calls']} after it ({got['with_reported_cost']} with the client's reported cost); "
                        f"runs exited {runs}",
                        flush=True,
                    )
                    if not same:
                        print(f"  expected {want}\n  billed   { {k: got[k] for k in want} }", flush=True)
        finally:
            await server.stop()
            up.stop()
    return 1 if failures else 0
