"""Billing throughput: the pure hot path alone, then model calls into PostgreSQL end to end.

    .venv/bin/python -m tests.billing.bench_billing [calls] [batch size]

End to end, the same published calls are consumed twice in the same run: by a consumer whose projection
writes nothing (the baseline: NATS, decoding, acks, positions) and by billing. Servers are started on free
ports in a temporary folder, as the tests do.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Sequence
from decimal import Decimal

import nats
from prometheus_client import REGISTRY

from commonos.accounting.pricing import Pricer
from commonos.billing.budgets import BudgetTracker, spend_deltas
from commonos.billing.config import BillingConfig, Budget, MetricsConfig, Period
from commonos.billing.metrics import BillingMetrics
from commonos.billing.projection import BillingProjection, insert_arguments
from commonos.billing.service import billing_schemas
from commonos.proto.events import Event, ModelCallCompleted, decode_event, encode_event
from commonos.proto.subjects import MODEL_CALLS_FILTER
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions
from commonos.runtime.http import Health
from commonos.runtime.postgres import Conn, apply_schemas, connect, create_pool
from tests.billing.support import billing, publish_copies
from tests.billing.test_crash import make_calls
from tests.harness import cleanup, make_temp_root, new_nats, start_pg, stop_pg
from tests.support import fresh_database, wait_for_position

CONFIG = BillingConfig(
    budgets=(
        Budget("acme-month", "client:acme", Period.MONTH, Decimal("1000000")),
        Budget("acme-day", "client:acme", Period.DAY, Decimal("1000000")),
    ),
    metrics=MetricsConfig(tag_label_keys=("client",)),
)


def pure(calls: Sequence[ModelCallCompleted]) -> None:
    payloads = [encode_event(c) for c in calls]
    metrics = BillingMetrics(CONFIG.metrics)
    projection = BillingProjection(Pricer(), metrics, BudgetTracker(CONFIG.budgets, sink=None))
    started = time.perf_counter()
    for start in range(0, len(payloads), 500):
        events = [decode_event(p) for p in payloads[start : start + 500]]
        rows = []
        for event in events:
            assert isinstance(event, ModelCallCompleted)
            projection.check(event)  # the consumer's check: the call's checks, price, row, budget periods
            rows.append(projection.row_for(event))
        insert_arguments(rows)
        metrics.stage(rows)
        spend_deltas(CONFIG.budgets, rows)
        projection.committed()
    elapsed = time.perf_counter() - started
    print(f"pure hot path (decode, check, price, row, columns, metrics, budgets): {len(calls) / elapsed:,.0f} calls/s")


class NoRows:
    """The baseline projection: everything a consumer does except writing rows."""

    position_table = "billing_positions"
    name = "baseline"

    def check(self, event: Event) -> None:
        pass

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        pass


async def end_to_end(calls: Sequence[ModelCallCompleted], batch: int = 500) -> None:
    root = make_temp_root("cos-bench-")
    pg = start_pg(root)
    server = new_nats(root)
    try:
        dsn = await fresh_database(pg)
        conn = await connect(dsn)
        await apply_schemas(conn, billing_schemas())
        await conn.close()
        acks = await publish_copies(server.url, calls, copy=1)
        last = acks[-1].seq

        nc = await nats.connect(server.url)
        pool = await create_pool(dsn)
        stop = asyncio.Event()
        options = ConsumerOptions(batch_size=batch, filter_subjects=(MODEL_CALLS_FILTER,))
        consumer = BatchConsumer(nc.jetstream(), pool, NoRows(), Health(), options)
        started = time.perf_counter()
        task = asyncio.create_task(consumer.run(stop))
        await wait_for_position(dsn, "baseline", last, timeout_s=300, table="billing_positions")
        baseline = time.perf_counter() - started
        stop.set()
        await task
        await pool.close()
        await nc.close()

        started = time.perf_counter()
        async with billing(server.url, dsn, CONFIG, Pricer(), batch_size=batch):
            await wait_for_position(dsn, "billing", last, timeout_s=300, table="billing_positions")
            elapsed = time.perf_counter() - started
        conn = await connect(dsn)
        rows = await conn.fetchval("SELECT count(*) FROM model_calls")
        await conn.close()
        assert rows == len(calls), rows
        print(f"baseline consumer (no rows):      {len(calls) / baseline:,.0f} calls/s ({baseline:.2f}s)")
        print(f"billing into PostgreSQL:          {len(calls) / elapsed:,.0f} calls/s ({elapsed:.2f}s, start included)")
        for name in ("baseline", "billing"):
            batches = REGISTRY.get_sample_value("cos_consumer_batch_duration_seconds_count", {"consumer": name}) or 0
            seconds = REGISTRY.get_sample_value("cos_consumer_batch_duration_seconds_sum", {"consumer": name}) or 0
            print(f"  {name}: {batches:.0f} batches, {seconds:.2f}s applying and committing them")
    finally:
        server.kill()
        stop_pg(pg)
        cleanup(root)


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    rng = random.Random(1)
    calls: list[ModelCallCompleted] = []
    while len(calls) < total:
        calls += make_calls(rng)
    calls = calls[:total]
    pure(calls)
    asyncio.run(end_to_end(calls, batch))


if __name__ == "__main__":
    main()
