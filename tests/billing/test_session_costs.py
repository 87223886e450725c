"""The per-session rollup `session_costs` is the sums of `model_calls` per session, always: after billing (the real
service on a real nats-server and PostgreSQL), a redelivery, a reprice (and back), a replay, retention dropping a
month, on an upgraded database and after a change by hand (`cos billing rebuild-days`).

Each test checks the invariant: `session_costs` equal to the sums computed again in Python from every
`model_calls` row (calls, unpriced calls, USD, first and last call time, the profile). The calls are those of
`test_days` (priced, unpriced and reported, around UTC midnights), each session holding several, some of them in
two months.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec

from commonos.accounting.pricing import Pricer, load_price_file
from commonos.billing.days import INSERT_MODEL_CALLS
from commonos.billing.metrics import BillingMetrics
from commonos.billing.projection import BillingProjection, build_row, insert_arguments
from commonos.billing.reprice import reprice
from commonos.billing.schema import SCHEMA
from commonos.billing.service import billing_schemas
from commonos.journal_writer.replay import replay
from commonos.proto import events as ev
from commonos.runtime import partitions
from commonos.runtime.postgres import Conn, apply_schemas, connect
from commonos.runtime.settings import Settings
from tests.billing.raw_costs import days_of_calls, stored_days
from tests.billing.support import POSITIONS, billing, publish_copies
from tests.billing.test_days import PRICES, START, bill, calls
from tests.billing.test_report_cli import acos
from tests.harness import PgServer
from tests.support import fresh_database, wait_for_position

FIRST_INSTANT = datetime.min.replace(tzinfo=UTC)


def in_sessions(rng: random.Random, events: list[ev.ModelCallCompleted], per_profile: int = 12) -> list[Any]:
    """`events` spread over a few sessions of their profile (a session is one profile's: billing refuses another's
    call in it), several calls each."""
    pools: dict[str, list[uuid.UUID]] = defaultdict(lambda: [uuid.uuid4() for _ in range(per_profile)])
    return [msgspec.structs.replace(e, session_id=rng.choice(pools[e.profile_id])) for e in events]


async def sessions_of_calls(conn: Conn) -> dict[uuid.UUID, tuple[Any, ...]]:
    """`session_costs` as it should be, summed here (in Python) from every model_calls row."""
    sums: dict[uuid.UUID, list[Any]] = {}
    for r in await conn.fetch("SELECT * FROM model_calls"):
        s = sums.setdefault(r["session_id"], [r["profile_id"], 0, 0, Decimal(0), r["created_at"], r["created_at"]])
        s[0] = min(s[0], r["profile_id"])
        s[1] += 1
        s[2] += r["cost_usd"] is None
        s[3] += r["cost_usd"] or 0
        s[4] = min(s[4], r["created_at"])
        s[5] = max(s[5], r["created_at"])
    return {key: tuple(s) for key, s in sums.items()}


async def stored_sessions(conn: Conn) -> dict[uuid.UUID, tuple[Any, ...]]:
    cols = "profile_id, calls, unpriced_calls, usd, first_call_at, last_call_at"
    return {r["session_id"]: tuple(r)[1:] for r in await conn.fetch(f"SELECT session_id, {cols} FROM session_costs")}


async def assert_sessions_are_raw(conn: Conn) -> dict[uuid.UUID, tuple[Any, ...]]:
    want = await sessions_of_calls(conn)
    assert await stored_sessions(conn) == want
    return want


async def test_billing_adds_each_session_its_calls_once_a_redelivery_adds_nothing(
    nats_url: str, database_url: str
) -> None:
    rng = random.Random(23)
    billed = in_sessions(rng, calls(rng, 300))
    await bill(nats_url, database_url, list(billed))
    acks = await publish_copies(nats_url, billed, copy=2)
    async with billing(nats_url, database_url, batch_size=64):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    conn = await connect(database_url)
    try:
        want = await assert_sessions_are_raw(conn)
        assert len(want) == 24 and sum(s[1] for s in want.values()) == len(billed)
        assert any(s[2] for s in want.values()) and any(s[3] for s in want.values())
    finally:
        await conn.close()


async def test_a_reprice_moves_the_cost_of_the_calls_it_changes(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    rng = random.Random(29)
    await bill(nats_url, database_url, in_sessions(rng, calls(rng, 300)))
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    conn = await connect(database_url)
    try:
        before = await assert_sessions_are_raw(conn)
        dry = await reprice(conn, START + timedelta(days=1, hours=3), None, load_price_file(prices), dry_run=True)
        assert dry.changed > 0 and await stored_sessions(conn) == before
        done = await reprice(
            conn, START + timedelta(days=1, hours=3), START + timedelta(days=4, hours=2), load_price_file(prices)
        )
        assert done.changed > 0
        assert await assert_sessions_are_raw(conn) != before
        back = await reprice(conn, FIRST_INSTANT, None)
        assert back.changed == done.changed
        assert await assert_sessions_are_raw(conn) == before
    finally:
        await conn.close()


async def test_a_replay_rebuilds_the_sessions_with_the_calls(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    rng = random.Random(31)
    billed = in_sessions(rng, calls(rng, 200))
    await bill(nats_url, database_url, list(billed))
    await publish_copies(nats_url, billed, copy=2)
    rebuilt = await fresh_database(pg_server)
    conn = await connect(rebuilt)
    try:
        await apply_schemas(conn, billing_schemas())
        for truncate in (False, True):
            settings = Settings(nats_url=nats_url, database_url=rebuilt)
            await replay(settings, truncate=truncate, projections=[BillingProjection(Pricer(), BillingMetrics())])
            assert sum(s[1] for s in (await assert_sessions_are_raw(conn)).values()) == len(billed)
        live = await connect(database_url)
        try:
            assert await stored_sessions(conn) == await stored_sessions(live)
        finally:
            await live.close()
    finally:
        await conn.close()


def months_ago(n: int, day: int = 10) -> datetime:
    month = partitions.month_of(datetime.now(UTC))
    index = month.year * 12 + month.month - 1 - n
    return datetime(index // 12, index % 12 + 1, day, 12, tzinfo=UTC)


async def test_retention_takes_a_dropped_months_calls_out_of_their_sessions(nats_url: str, database_url: str) -> None:
    """Sessions whose calls were all in the dropped months go; a session with calls in a dropped month and in a
    kept one keeps the kept calls, its first call found again among them. The dropped months' days go too."""
    from tests.cli.test_retention import _cos

    rng = random.Random(37)
    template = calls(rng, 240)
    # Each call in one of four months (4 and 3 months ago: dropped; 1 month ago and this one: kept).
    spread = [
        msgspec.structs.replace(c, occurred_at=months_ago(rng.choice((4, 3, 1, 0)), day=rng.randrange(1, 6)))
        for c in template
    ]
    await bill(nats_url, database_url, in_sessions(rng, spread, per_profile=20))
    conn = await connect(database_url)
    try:
        before = await assert_sessions_are_raw(conn)
        run = _cos(database_url, "--model-calls-keep-months", "2")
        assert run.returncode == 0, run.stderr
        assert run.stdout.count("dropped ") == 2, run.stdout
        after = await assert_sessions_are_raw(conn)
        kept = months_ago(1, day=1)
        assert after and all(s[4] >= kept for s in after.values())
        assert len(after) < len(before), "sessions whose every call was dropped are gone"
        straddling = [k for k, s in before.items() if s[4] < kept <= s[5]]
        assert straddling and all(after[k][4] > before[k][4] for k in straddling)
        assert not await conn.fetchval("SELECT count(*) FROM session_costs WHERE calls = 0")
        # The daily rollup loses the dropped months' days too: the reports over them give what model_calls does.
        assert await stored_days(conn) == await days_of_calls(conn)
        assert await conn.fetchval("SELECT min(day) FROM model_call_days") >= kept.date()
    finally:
        await conn.close()


async def test_a_month_left_detached_by_a_killed_retention_is_dropped_with_its_share_of_the_rollups(
    nats_url: str, database_url: str
) -> None:
    """`cos retention` killed after detaching a month and before dropping it: the next run finds the detached
    month, takes its calls out of `session_costs` and `model_call_days`, and drops it."""
    from tests.cli.test_retention import _cos

    rng = random.Random(41)
    spread = [
        msgspec.structs.replace(c, occurred_at=months_ago(rng.choice((4, 3, 0)), day=rng.randrange(1, 6)))
        for c in calls(rng, 120)
    ]
    await bill(nats_url, database_url, in_sessions(rng, spread, per_profile=20))
    oldest = months_ago(4, day=1)
    leftover = f"model_calls_p{oldest.year:04d}_{oldest.month:02d}"
    conn = await connect(database_url)
    try:
        await assert_sessions_are_raw(conn)
        # What the killed run did: the detach (committed on its own), not the drop.
        await conn.execute(f"ALTER TABLE model_calls DETACH PARTITION {leftover}")
        assert await conn.fetchval(f"SELECT count(*) FROM {leftover}") > 0
        run = _cos(database_url, "--model-calls-keep-months", "2")
        assert run.returncode == 0, run.stderr
        assert run.stdout.count("dropped ") == 2, run.stdout
        assert await conn.fetchval("SELECT to_regclass($1)", leftover) is None
        await assert_sessions_are_raw(conn)
        assert await stored_days(conn) == await days_of_calls(conn)
    finally:
        await conn.close()


async def test_an_upgraded_database_is_filled_and_a_change_by_hand_is_rebuilt(database_url: str) -> None:
    rng = random.Random(41)
    pricer = Pricer()
    rows = [build_row(c, pricer) for c in in_sessions(rng, calls(rng, 200))]
    conn = await connect(database_url)
    try:
        # A database billed before the table existed: its calls are there, the sessions' rows are not...
        await apply_schemas(conn, billing_schemas())
        await partitions.ensure(conn, {"model_calls": [r.created_at for r in rows]})
        await conn.fetch(INSERT_MODEL_CALLS, *insert_arguments(rows))
        assert not await conn.fetchval("SELECT count(*) FROM session_costs")
        # ...until billing's schema is applied again (every start does): it fills them from the calls, once.
        await apply_schemas(conn, [SCHEMA])
        assert sum(s[1] for s in (await assert_sessions_are_raw(conn)).values()) == len(rows)
        await apply_schemas(conn, [SCHEMA])
        await assert_sessions_are_raw(conn)

        # An operator deletes calls by hand, every call of some sessions among them, and rebuilds those days.
        gone = await conn.fetchval("SELECT session_id FROM model_calls WHERE profile_id = 'ops' LIMIT 1")
        await conn.execute("DELETE FROM model_calls WHERE session_id = $1 OR provider = 'openai'", gone)
        assert await stored_sessions(conn) != await sessions_of_calls(conn)
        run = await acos(database_url, "billing", "rebuild-days", "--since", "2026-10-02", "--until", "2026-10-09")
        assert (run.code, run.err) == (0, "")
        assert "session_costs: " in run.out
        assert gone not in await assert_sessions_are_raw(conn)
        assert await days_of_calls(conn)  # the days too (tests/billing/test_days.py checks them)
    finally:
        await conn.close()
