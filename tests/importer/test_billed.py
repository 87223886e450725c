"""Imported work is billed like our own: `cos report cost --group-by tag:vendor` shows it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest

from commonos.cli.main import main
from commonos.runtime.settings import Settings
from tests.billing.support import billing
from tests.importer.test_store import import_all
from tests.importer.transcripts import copy_corpus, needs_corpus


@needs_corpus
async def test_imported_cost_shows_in_the_report_by_vendor(
    tmp_path: Path,
    nats_url: str,
    database_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    corpus = copy_corpus(tmp_path)
    runs = await import_all(corpus, Settings(nats_url=nats_url), settle_s=0.0)
    calls = sum(r.published.model_calls for r in runs.values())
    async with billing(nats_url, database_url):
        conn = await asyncpg.connect(database_url)
        try:
            deadline = time.monotonic() + 60
            n = 0
            while n < calls:
                assert time.monotonic() < deadline, f"{n} of {calls} model calls billed"
                await asyncio.sleep(0.05)
                with contextlib.suppress(asyncpg.UndefinedTableError):  # billing is still applying its schema
                    n = await conn.fetchval("SELECT count(*) FROM model_calls")
        finally:
            await conn.close()

    monkeypatch.setenv("COS_DATABASE_URL", database_url)
    monkeypatch.setenv("COS_NATS_URL", nats_url)
    argv = ["report", "cost", "--group-by", "tag:vendor", "--since", "2000-01-01", "--format", "json"]
    assert await asyncio.to_thread(main, argv) == 0  # the CLI runs its own event loop
    report = json.loads(capsys.readouterr().out)
    by_vendor = {g["group"]: g for g in report["groups"]}
    assert set(by_vendor) == {"vendor:claude-code", "vendor:codex"}
    for vendor, source in (("vendor:claude-code", "claude"), ("vendor:codex", "codex")):
        # The dry-run summary prices the same invocations with the same pricer, independently of billing.
        expected = sum((t.cost_usd for t in runs[source].trees.values()), Decimal(0))
        assert Decimal(by_vendor[vendor]["usd"]) == expected > 0
        assert by_vendor[vendor]["calls"] == sum(t.invocations for t in runs[source].trees.values())
