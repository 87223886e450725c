"""`cos billing relayout`: a model_calls table of the older, unpartitioned layout moves into monthly partitions
with every row as it was (repriced costs included), and billing goes on from there. Real PostgreSQL and
nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from commonos.accounting.pricing import Pricer
from commonos.billing.projection import build_row, insert_arguments
from commonos.billing.schema import MODEL_CALLS
from commonos.runtime import partitions
from commonos.runtime.postgres import OldLayout, connect
from tests.billing.support import billing, run_cli
from tests.billing.test_service import model_call
from tests.support import publish_all, table_checksums, wait_for_position


async def test_an_unpartitioned_model_calls_moves_into_months_with_every_row_as_it_was(
    nats_url: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_layout = dataclasses.replace(MODEL_CALLS, partition_by=None)
    now = datetime.now(UTC)
    calls = [model_call(now - timedelta(days=d), input_tokens=1000 + d) for d in (0, 40, 400, 401)]
    rows = [build_row(c, Pricer()) for c in calls]
    conn = await connect(database_url)
    try:
        await conn.execute(old_layout.ddl())
        await conn.fetch(old_layout.insert_bulk(), *insert_arguments(rows))
        # a reprice had changed one of them: the stream alone could not give this back
        await conn.execute(
            "UPDATE model_calls SET cost_usd = 1.5, price_source = 'operator', repriced_at = now() WHERE event_id = $1",
            calls[2].event_id,
        )
    finally:
        await conn.close()
    before = await table_checksums(database_url, ["model_calls"])

    with pytest.raises(OldLayout, match=r"model_calls was made unpartitioned.*cos billing relayout"):
        async with billing(nats_url, database_url):
            await asyncio.sleep(30)  # billing refuses at once: never reached

    monkeypatch.setenv("COS_DATABASE_URL", database_url)
    assert await asyncio.to_thread(run_cli, ["billing", "relayout"]) == 0
    assert await table_checksums(database_url, ["model_calls"]) == before
    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT relkind::text FROM pg_class WHERE relname = 'model_calls'") == "p"
        months = {p.month for p in await partitions.list_partitions(conn, "model_calls")}
        assert {partitions.month_of(c.occurred_at) for c in calls} <= months
        assert await conn.fetchval("SELECT to_regnamespace('cos_old_layout')") is None
    finally:
        await conn.close()
    assert await asyncio.to_thread(run_cli, ["billing", "relayout"]) == 0  # again: nothing to do

    # billing starts on it and bills the next call
    new = model_call(now)
    acks = await publish_all(nats_url, [new])
    async with billing(nats_url, database_url):
        await wait_for_position(database_url, "billing", acks[-1].seq, table="billing_positions")
    assert (await table_checksums(database_url, ["model_calls"]))["model_calls"][0] == 5
