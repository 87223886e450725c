"""The daily rollup `model_call_days` is the sums of `model_calls`, always, and the reports that read it give
what the queries over `model_calls` alone give, to the digit, over any range.

Billing itself (the real service on a real nats-server and PostgreSQL, and a replay of the stream) bills the
calls: calls at and around UTC midnights, priced, unpriced and reported, with two tags of a key, none, the same
tags in another order, and delivered twice. Each test then checks the invariant (`model_call_days` summed again
in Python from every `model_calls` row) and compares every grouping of the rollup's queries with the raw ones
over random ranges: partial days at both ends, within one day, whole days, open-ended, reaching the years 1 and
9999.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from commonos.accounting.cost_queries import (
    DAYS_GROUP_EXPRESSIONS,
    DAYS_TOTAL_SQL,
    DAYS_UNTAGGED_SQL,
    FIRST_INSTANT,
    GROUP_EXPRESSIONS,
    LAST_INSTANT,
    STATUS_KIND,
    TOTAL_KIND,
    TOTAL_SQL,
    UNTAGGED_KIND,
    days_args,
    days_grouped_sql,
    days_tables_sql,
)
from commonos.accounting.pricing import Pricer, load_price_file
from commonos.billing.days import INSERT_MODEL_CALLS, rebuild_days
from commonos.billing.metrics import BillingMetrics
from commonos.billing.projection import BillingProjection, build_row, insert_arguments
from commonos.billing.report import GroupBy, cost_report, render_report
from commonos.billing.reprice import reprice
from commonos.billing.service import billing_schemas
from commonos.console.pages.costs import ORIGIN
from commonos.console.pages.costs import STATUS_SQL as DAYS_STATUS_SQL
from commonos.journal_writer.replay import replay
from commonos.proto import events as ev
from commonos.runtime import partitions
from commonos.runtime.postgres import Conn, apply_schemas, connect
from commonos.runtime.settings import Settings
from tests.billing.raw_costs import STATUS_SQL, days_of_calls, raw_grouped, raw_report, stored_days
from tests.billing.support import POSITIONS, billing, publish_copies
from tests.billing.test_report_cli import acos
from tests.harness import PgServer
from tests.support import fresh_database, publish_all, wait_for_position

#: The first of the days the calls fall on (UTC); they span DAYS days.
START = datetime(2026, 10, 3, tzinfo=UTC)
DAYS = 6

TAG_SETS: list[tuple[str, ...]] = [
    (),
    ("client:acme",),
    ("client:acme", "client:globex"),  # counts in both groups, once in the total
    ("client:globex", "client:acme"),  # the same set in another order: the same rollup row
    ("client:acme", "vendor:codex"),
    ("team:web",),
    ("client:initech", "team:web", "vendor:claude-code"),
]
#: (provider, model, reported cost): priced, unpriced, and unpriced but with a reported cost.
MODELS: list[tuple[str, str, Decimal | None]] = [
    ("openai", "o4-mini", None),
    ("anthropic", "claude-sonnet-4-5", None),
    ("openai", "gpt-99-imaginary", None),
    ("nobody", "local-llama", Decimal("0.0123")),
]
PROFILES = ("default", "ops")


def instants(rng: random.Random) -> list[datetime]:
    """Times at and around each UTC midnight of the span, and random ones in it."""
    out: list[datetime] = []
    for day in range(DAYS + 1):
        midnight = START + timedelta(days=day)
        out += [midnight, midnight - timedelta(microseconds=1), midnight + timedelta(microseconds=1)]
        out += [
            midnight + timedelta(seconds=rng.randrange(86_400), microseconds=rng.randrange(10**6)) for _ in range(3)
        ]
    return out


def calls(rng: random.Random, n: int, profiles: tuple[str, ...] = PROFILES) -> list[ev.ModelCallCompleted]:
    times = instants(rng)
    out: list[ev.ModelCallCompleted] = []
    for _ in range(n):
        provider, model, reported = rng.choice(MODELS)
        output = rng.randrange(0, 5000)
        out.append(
            ev.ModelCallCompleted(
                profile_id=rng.choice(profiles),
                session_id=uuid.uuid4(),
                provider=provider,
                model=model,
                input_tokens=rng.randrange(0, 100_000),
                output_tokens=output,
                reasoning_tokens=rng.randrange(0, output + 1),
                cache_read_tokens=rng.randrange(0, 50_000),
                cache_write_5m_tokens=rng.choice((0, rng.randrange(0, 9000))),
                cache_write_1h_tokens=rng.choice((0, rng.randrange(0, 9000))),
                reported_cost_usd=reported,
                tags=rng.choice(TAG_SETS),
                occurred_at=rng.choice(times),
            )
        )
    return out


async def bill(nats_url: str, dsn: str, events: list[ev.Event], pricer: Pricer | None = None) -> None:
    acks = await publish_all(nats_url, events)
    async with billing(nats_url, dsn, pricer=pricer, batch_size=64):
        await wait_for_position(dsn, "billing", acks[-1].seq, table=POSITIONS)


def ranges(rng: random.Random, n: int) -> list[tuple[datetime, datetime | None]]:
    """Random ranges over the span's instants (and beyond it), open-ended ones, ones within a day, empty ones."""
    times = [*instants(rng), FIRST_INSTANT, LAST_INSTANT, START - timedelta(days=400), START + timedelta(days=900)]
    out: list[tuple[datetime, datetime | None]] = [
        (START, None),
        (START + timedelta(hours=5), START + timedelta(hours=7)),  # within one day
        (START + timedelta(hours=5), START + timedelta(days=3, hours=7)),  # partial days at both ends
        (START, START + timedelta(days=3)),  # whole days only
        (START + timedelta(hours=23), START + timedelta(days=1, hours=1)),  # two partial days, no whole one
        (START + timedelta(days=2), START + timedelta(days=1)),  # until before since: nothing
        (FIRST_INSTANT, None),
        (FIRST_INSTANT, LAST_INSTANT),
    ]
    for _ in range(n):
        since = rng.choice(times)
        until = rng.choice([*times, None])
        out.append((since, until))
    return out


KINDS = ("tag", "model", "provider", "profile", "day", "origin")


async def assert_rollup_is_raw(conn: Conn, rng: random.Random, n: int = 40) -> int:
    """The invariant, then every grouping, the total, the (none) rows and the per-status rows of the rollup's
    queries equal the raw ones over `n` random ranges and the fixed ones; returns how many ranges held calls."""
    assert await stored_days(conn) == await days_of_calls(conn)
    raw_expressions = {**GROUP_EXPRESSIONS, "origin": ORIGIN}
    day_expressions = {**DAYS_GROUP_EXPRESSIONS, "origin": ORIGIN}
    with_calls = 0
    for since, until in ranges(rng, n):
        times = days_args(since, until)
        total = await conn.fetchrow(DAYS_TOTAL_SQL, *times)
        assert total is not None
        assert tuple(total) == tuple(await conn.fetchrow(TOTAL_SQL, since, until) or ()), (since, until)
        with_calls += total["calls"] > 0
        statuses = [tuple(r) for r in await conn.fetch(DAYS_STATUS_SQL, *times)]
        assert statuses == [tuple(r) for r in await conn.fetch(STATUS_SQL, since, until)], (since, until)
        for tag_key in ("client", "vendor"):
            args: list[Any] = [*times, f"{tag_key}:"]
            rows = [tuple(r) for r in await conn.fetch(days_grouped_sql("tag", day_expressions), *args)]
            rows.append(tuple(await conn.fetchrow(DAYS_UNTAGGED_SQL, *args) or ()))
            assert rows == await raw_grouped(conn, "tag", since, until, tag_key, raw_expressions), (since, until)
        for kind in KINDS[1:]:
            # Origin as the console reads it (from the sums per tag set), the others from the days' rows.
            sql = days_grouped_sql(kind, day_expressions, of_tags=("origin",))
            rows = [tuple(r) for r in await conn.fetch(sql, *times)]
            assert rows == await raw_grouped(conn, kind, since, until, "", raw_expressions), (kind, since, until)
        # The console's one statement for every table gives the same rows as the queries one by one.
        for tag_key in ("client", "vendor"):
            page: dict[str, list[tuple[Any, ...]]] = {}
            for r in await conn.fetch(days_tables_sql(day_expressions, of_tags=("origin",)), *times, f"{tag_key}:"):
                page.setdefault(r["kind"], []).append(tuple(r)[1:])
            tagged = page.get("tag", []) + [row[1:] for row in page[UNTAGGED_KIND]]
            assert tagged == await raw_grouped(conn, "tag", since, until, tag_key, raw_expressions), (since, until)
            assert page[TOTAL_KIND] == [(None, *total)], (since, until)
            assert [(g, calls, usd) for g, usd, calls, *_ in page.get(STATUS_KIND, [])] == statuses
            for kind in KINDS[1:]:
                want = await raw_grouped(conn, kind, since, until, "", raw_expressions)
                assert page.get(kind, []) == want, (kind, since, until)
    return with_calls


async def test_the_rollup_is_the_sums_of_the_calls_over_any_range_and_redeliveries_add_nothing(
    nats_url: str, database_url: str
) -> None:
    rng = random.Random(3)
    billed = calls(rng, 400)
    await bill(nats_url, database_url, list(billed))
    # Every call delivered again (new stream messages, the same event ids): nothing is counted twice.
    acks = await publish_copies(nats_url, billed, copy=2)
    async with billing(nats_url, database_url, batch_size=64):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM model_calls") == len(billed)
        assert await conn.fetchval("SELECT sum(calls) FROM model_call_days") == len(billed)
        statuses = {r[0] for r in await conn.fetch("SELECT DISTINCT cost_status FROM model_calls")}
        assert {"priced", "unpriced", "reported"} <= statuses
        # Two orders of one tag set share their rows.
        assert not await conn.fetchval(
            "SELECT count(*) FROM model_call_days WHERE tags = '{client:globex,client:acme}'"
        )
        assert await assert_rollup_is_raw(conn, rng, 60) > 30
    finally:
        await conn.close()


PRICES = """
[[price]]
provider = "openai"
model = "gpt-99-imaginary"
input_mtok = "7"
output_mtok = "9"

[[price]]
provider = "openai"
model = "o4-mini"
input_mtok = "0.5"
output_mtok = "1.5"
"""


async def test_a_reprice_moves_the_calls_it_changes_in_the_rollup(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    rng = random.Random(5)
    billed = calls(rng, 300)
    await bill(nats_url, database_url, list(billed))
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    conn = await connect(database_url)
    try:
        before = await stored_days(conn)
        dry = await reprice(conn, START + timedelta(days=1, hours=3), None, load_price_file(prices), dry_run=True)
        assert dry.changed > 0 and await stored_days(conn) == before
        # From mid-day: only the calls from then on change (unpriced -> override, priced -> another cost).
        done = await reprice(
            conn, START + timedelta(days=1, hours=3), START + timedelta(days=4, hours=2), load_price_file(prices)
        )
        assert done.changed > 0 and ("unpriced", "override") in {
            (c.old_status, c.new_status) for c in done.changes.values()
        }
        assert await stored_days(conn) != before
        assert await assert_rollup_is_raw(conn, rng) > 0
        # And back: the rows the first run created are emptied and deleted, the rollup is what it was.
        back = await reprice(conn, FIRST_INSTANT, None)
        assert back.changed == done.changed
        assert await stored_days(conn) == before
        assert await conn.fetchval("SELECT count(*) FROM model_call_days WHERE calls = 0") == 0
        await assert_rollup_is_raw(conn, rng, 10)
    finally:
        await conn.close()


async def test_a_deleted_profiles_calls_stay_in_the_rollup_and_later_ones_are_refused(
    nats_url: str, database_url: str
) -> None:
    rng = random.Random(7)
    first = calls(rng, 150)
    after = calls(rng, 50, profiles=("ops",))
    deleted = ev.ProfileDeleted(profile_id="ops", deleted_by="cli:alice", occurred_at=START + timedelta(days=DAYS))
    await bill(nats_url, database_url, [*first, deleted, *after])
    conn = await connect(database_url)
    try:
        ops = sum(1 for c in first if c.profile_id == "ops")
        assert ops > 0
        assert await conn.fetchval("SELECT sum(calls) FROM model_call_days WHERE profile_id = 'ops'") == ops
        assert await conn.fetchval("SELECT sum(calls) FROM model_call_days") == len(first)
        await assert_rollup_is_raw(conn, rng)
    finally:
        await conn.close()


async def test_a_replay_rebuilds_the_rollup_with_the_calls(
    nats_url: str, database_url: str, pg_server: PgServer
) -> None:
    rng = random.Random(19)
    billed = calls(rng, 200)
    await bill(nats_url, database_url, list(billed))
    await publish_copies(nats_url, billed, copy=2)  # each call twice in the stream: a replay counts it once
    rebuilt = await fresh_database(pg_server)
    conn = await connect(rebuilt)
    try:
        await apply_schemas(conn, billing_schemas())
        for truncate in (False, True):  # into an empty database, then over the rebuilt one (emptied first)
            settings = Settings(nats_url=nats_url, database_url=rebuilt)
            done = await replay(
                settings, truncate=truncate, projections=[BillingProjection(Pricer(), BillingMetrics())]
            )
            assert done.applied >= len(billed)
            assert await conn.fetchval("SELECT sum(calls) FROM model_call_days") == len(billed)
            await assert_rollup_is_raw(conn, rng, 10)
        live = await connect(database_url)
        try:
            assert await stored_days(conn) == await stored_days(live)
        finally:
            await live.close()
    finally:
        await conn.close()


async def test_a_change_by_hand_is_rebuilt_and_an_upgraded_database_is_filled(database_url: str) -> None:
    rng = random.Random(11)
    pricer = Pricer()
    rows = [build_row(c, pricer) for c in calls(rng, 200)]
    conn = await connect(database_url)
    try:
        # A database billed before the rollup existed: its calls are there, the rollup is empty...
        await apply_schemas(conn, billing_schemas())
        await partitions.ensure(conn, {"model_calls": [r.created_at for r in rows]})
        await conn.fetch(INSERT_MODEL_CALLS, *insert_arguments(rows))
        assert await conn.fetchval("SELECT count(*) FROM model_call_days") == 0
        # ...until billing's schema is applied again (every start does): it fills it from the calls.
        await apply_schemas(conn, billing_schemas())
        assert await assert_rollup_is_raw(conn, rng) > 0
        await apply_schemas(conn, billing_schemas())  # and only when it is empty
        assert await conn.fetchval("SELECT sum(calls) FROM model_call_days") == len(rows)

        # An operator deletes calls by hand (docs/import.md) and rebuilds the days they were on.
        await conn.execute("DELETE FROM model_calls WHERE provider = 'openai' AND tags @> '{client:acme}'")
        assert await stored_days(conn) != await days_of_calls(conn)
        run = await acos(database_url, "billing", "rebuild-days", "--since", "2026-10-02", "--until", "2026-10-09")
        assert (run.code, run.err) == (0, "")
        assert run.out.startswith("model_call_days 2026-10-02 .. 2026-10-09: ")
        await assert_rollup_is_raw(conn, rng)
        done = await rebuild_days(conn)  # every day: nothing to change
        assert done.before == done.after == len(await stored_days(conn))
    finally:
        await conn.close()


async def test_cos_report_cost_prints_what_the_raw_queries_give(nats_url: str, database_url: str) -> None:
    rng = random.Random(13)
    await bill(nats_url, database_url, list(calls(rng, 200)))
    conn = await connect(database_url)
    try:
        for since, until in ranges(rng, 25):
            for group_by in (GroupBy("tag", "client"), GroupBy("model"), GroupBy("day"), GroupBy("profile")):
                report = await cost_report(conn, group_by, since, until)
                raw = await raw_report(conn, group_by, since, until)
                for fmt in ("json", "table", "csv"):
                    assert render_report(report, fmt) == render_report(raw, fmt), (group_by, since, until, fmt)
        # This month's default range too (no calls in it: the notes say where they are).
        default = await cost_report(conn, GroupBy("tag", "client"))
        assert render_report(default, "json") == render_report(
            await raw_report(conn, GroupBy("tag", "client"), None, None), "json"
        )
        assert any("before this range" in note for note in default.notes)
    finally:
        await conn.close()
    # And as the command line prints it.
    args = ("--since", "2026-10-03T05:00:00", "--until", "2026-10-07T13:30:00", "--group-by", "tag:client")
    run = await acos(database_url, "report", "cost", *args, "--format", "json")
    assert (run.code, run.err) == (0, "")
    conn = await connect(database_url)
    try:
        raw = await raw_report(
            conn,
            GroupBy("tag", "client"),
            datetime(2026, 10, 3, 5, tzinfo=UTC),
            datetime(2026, 10, 7, 13, 30, tzinfo=UTC),
        )
    finally:
        await conn.close()
    assert run.out == render_report(raw, "json") + "\n"
