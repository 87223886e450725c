"""The whole import pipeline on real servers, for tests that compare what was stored with the dry run.

`cos import` and `cos report` run as subprocesses (the commands users run, each with its own event
loop and memory); the graph-writer and billing run in the test's process, as the other importer
tests run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import nats

from commonos.journal_writer.graph_schema import GRAPH_TABLES
from commonos.proto.graph import GRAPH_LISTS, Graph
from tests.billing.support import billing
from tests.importer.test_store import caught_up, graph_writer

#: Each graph table and the Graph list that fills it.
TABLE_LISTS = dict(zip(GRAPH_TABLES, GRAPH_LISTS, strict=True))
TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


@dataclass
class CosResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        # Costs are decimals: read them as such, not as floats.
        return json.loads(self.out, parse_float=Decimal)


def cos(*argv: str, nats_url: str | None = None, database_url: str | None = None, timeout: float = 600) -> CosResult:
    """Run `cos ARGV` as a subprocess against the given servers."""
    env = {**os.environ}
    if nats_url is not None:
        env["COS_NATS_URL"] = nats_url
    if database_url is not None:
        env["COS_DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return CosResult(done.returncode, done.stdout, done.stderr)


async def acos(*argv: str, **kwargs: Any) -> CosResult:
    return await asyncio.to_thread(cos, *argv, **kwargs)


@contextlib.asynccontextmanager
async def writers(nats_url: str, database_url: str) -> AsyncIterator[None]:
    """The graph-writer and billing, running until the block ends."""
    async with graph_writer(nats_url, database_url), billing(nats_url, database_url):
        yield


async def wait_stored(nats_url: str, database_url: str, calls: int, timeout_s: float = 300) -> None:
    """Wait until the graph-writer has applied every transcript_imported and billing has `calls` rows."""
    nc = await nats.connect(nats_url)
    try:
        await caught_up(nc.jetstream(), database_url)
    finally:
        await nc.close()
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout_s
        n = -1
        while n < calls:
            assert time.monotonic() < deadline, f"{n} of {calls} model calls billed"
            with contextlib.suppress(asyncpg.UndefinedTableError):  # billing is still applying its schema
                n = await conn.fetchval("SELECT count(*) FROM model_calls")
            if n < calls:
                await asyncio.sleep(0.05)
        assert n == calls, f"{n} model calls billed, expected {calls}"
    finally:
        await conn.close()


async def table_counts(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        return {table: int(await conn.fetchval(f"SELECT count(*) FROM {table}")) for table in GRAPH_TABLES}
    finally:
        await conn.close()


def graph_counts(graphs: list[Graph]) -> dict[str, int]:
    """Rows the graph tables must hold for these graphs (every row has its own key)."""
    return {table: sum(len(getattr(g, name)) for g in graphs) for table, name in TABLE_LISTS.items()}


def billed_calls(summary: dict[str, Any]) -> int:
    """Model calls billing will record for a dry run's summary (an invocation without usage is not billed)."""
    return int(summary["totals"]["invocations"])


def merged_models(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model, the dry runs' tokens, calls and cost added up (models do not repeat across vendors)."""
    merged: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        for model in summary["models"]:
            into = merged.setdefault(model["model"], {k: 0 for k in (*TOKEN_KINDS, "invocations", "cost_usd")})
            for key in into:
                into[key] += model[key]
    return merged


def assert_report_equals_dry_runs(report: dict[str, Any], dry_runs: list[dict[str, Any]]) -> None:
    """`cos report cost --group-by model` holds exactly the dry runs' tokens and cost, model by model."""
    models = merged_models(dry_runs)
    groups = {g["group"]: g for g in report["groups"]}
    assert set(groups) == set(models)
    for name, model in models.items():
        group = groups[name]
        for kind in TOKEN_KINDS:
            assert group[kind] == model[kind], (name, kind)
        assert group["calls"] == model["invocations"], name
        assert Decimal(group["usd"]) == model["cost_usd"], name
    total = report["total"]
    for kind in TOKEN_KINDS:
        assert total[kind] == sum(d["totals"][kind] for d in dry_runs)
    assert Decimal(total["usd"]) == sum(d["totals"]["cost_usd"] for d in dry_runs) > 0


async def import_and_compare(sources: list[tuple[Path, str]], nats_url: str, database_url: str) -> list[dict[str, Any]]:
    """Dry-run each (folder, vendor), import them for real, and check the stored cost and each full summary
    against the dry runs. Returns the full imports' JSON summaries."""
    dry_runs = []
    for home, vendor in sources:
        dry = await acos("import", vendor, str(home), "--dry-run", "--format", "json", "--no-progress", "--jobs", "1")
        assert dry.code == 0, dry.err
        dry_runs.append(dry.json())
    fulls = []
    async with writers(nats_url, database_url):
        for home, vendor in sources:
            full = await acos(
                "import", vendor, str(home), "--format", "json", "--no-progress", "--jobs", "1", nats_url=nats_url
            )
            assert full.code == 0, (full.err, full.out[-2000:])
            fulls.append(full.json())
        await wait_stored(nats_url, database_url, sum(billed_calls(d) for d in dry_runs))
    for full, dry in zip(fulls, dry_runs, strict=True):
        assert full["errors"] == [] and full["sessions_not_imported"] == 0
        assert all(s["imported"] is True for s in full["sessions"])
        assert full["totals"] == dry["totals"]
        assert full["models"] == dry["models"]
    report = await acos(
        "report",
        "cost",
        "--group-by",
        "model",
        "--since",
        "2000-01-01",
        "--format",
        "json",
        nats_url=nats_url,
        database_url=database_url,
    )
    assert report.code == 0, report.err
    assert_report_equals_dry_runs(report.json(), dry_runs)
    return fulls
