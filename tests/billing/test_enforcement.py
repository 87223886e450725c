"""Enforced budgets end to end on real servers: billing (PostgreSQL) stores the budget's state in COS_BUDGETS,
three loop replicas (each its own NATS connection and budget guard) run 20 concurrent turns under it.

Measured: the spend and the calls billed past the limit, and billing's lag (the crossing call's event to the
stored exhaustion). Proved: every call billed past the limit had started (the fake model's own clock) before billing
stored the exhaustion (the server's time of that KV put), i.e. was in flight (started, not yet billed) then; no call
started after it; with billing's lag under a call's duration, at most two per turn (a turn's call not yet billed at
the crossing and the next one it started before the put); every turn cut short failed with the reason and has a
`model_call_refused` event.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import asyncpg
import msgspec
import nats
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from commonos.accounting.pricing import Pricer, load_price_file
from commonos.billing.config import BillingConfig, BillingConfigError, Budget, Period, parse_billing_config
from commonos.billing.enforcement import budgets_bucket_config
from commonos.loop.approvals import NatsApprover
from commonos.loop.budgets import BudgetGuard
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.loop.providers.base import ModelRequest, ModelResponse, Provider
from commonos.proto.budget_state import BUDGETS_BUCKET, budget_key, decode_state
from commonos.proto.events import ModelCallCompleted, ModelCallRefused, TurnFinished, TurnStatus
from commonos.proto.subjects import EVENTS_ALL
from tests.billing.support import billing
from tests.loop.helpers import of_type, write_profile
from tests.support import wait_until

TURNS = 20
REPLICAS = 3
CALLS_PER_TURN = 6
CALL_USD = Decimal("1")  # 1000 input tokens at 1000 USD per million
LIMIT = Decimal("10")
TAG = "client:acme"
#: A model call's duration: the N-call bound assumes billing stores a crossing faster than this (see
#: ARCHITECTURE.md); real model calls take seconds, billing's lag here is measured and printed.
CALL_S = 0.5

SCRIPT = (
    "[[conversations]]\n\n"
    + "".join(
        '[[conversations.steps]]\ntool_calls = [{ name = "list_dir", args = { path = "." } }]\n'
        "usage = { input_tokens = 1000 }\n\n"
        for _ in range(CALLS_PER_TURN - 1)
    )
    + '[[conversations.steps]]\ntext = "done"\nusage = { input_tokens = 1000 }\n'
)

CONFIG = """
tags = ["client:acme"]
provider = "scripted"
model = "priced"
system_prompt = "Be brief."
max_steps = 10
tools = ["list_dir"]

[provider_options]
script = "script.toml"

[approval]
tools = { list_dir = "auto" }
"""


class TimedModel:
    """The scripted model, slowed down, recording when each call started (by its request id)."""

    def __init__(self, inner: Provider, started: dict[str, datetime]) -> None:
        self.inner = inner
        self.name = inner.name
        self.started = started

    async def complete(self, request: ModelRequest) -> ModelResponse:
        request_id = f"req-{uuid.uuid4()}"
        self.started[request_id] = datetime.now(UTC)
        await asyncio.sleep(CALL_S)
        response = await self.inner.complete(request)
        return msgspec.structs.replace(response, request_id=request_id)

    async def close(self) -> None:
        await self.inner.close()


async def replica(nats_url: str, profile: Profile, started: dict[str, datetime]) -> tuple[Client, Loop, BudgetGuard]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    guard = BudgetGuard(js)
    await guard.start()
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: TimedModel(build_provider(profile), started)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
        budgets=guard,
    )
    return nc, loop, guard


@pytest.fixture
def price_file(tmp_path: Path) -> Pricer:
    path = tmp_path / "prices.toml"
    path.write_text('[[price]]\nprovider = "scripted"\nmodel = "priced"\ninput_mtok = "1000"\noutput_mtok = "0"\n')
    return Pricer(load_price_file(path))


async def test_concurrent_turns_on_three_replicas_overshoot_only_by_calls_in_flight(
    streams: JetStreamContext, nats_url: str, database_url: str, tmp_path: Path, price_file: Pricer
) -> None:
    profile = write_profile(tmp_path / "profiles", "acme", config=CONFIG, script=SCRIPT)
    budget = Budget(name="acme-daily", tag=TAG, period=Period.DAY, limit_usd=LIMIT, enforce=True)
    stored: list[tuple[datetime, bool]] = []  # (server time of the put, exhausted)

    async def on_put(msg: Msg) -> None:
        stored.append((msg.metadata.timestamp, decode_state(msg.data).exhausted))
        await msg.ack()

    async with billing(nats_url, database_url, BillingConfig(budgets=(budget,)), price_file):
        deadline = time.monotonic() + 30
        while True:
            try:
                await streams.key_value(BUDGETS_BUCKET)
                break
            except Exception:
                assert time.monotonic() < deadline, "billing did not create the budgets bucket"
                await asyncio.sleep(0.05)
        sub = await streams.subscribe(f"$KV.{BUDGETS_BUCKET}.>", cb=on_put, ordered_consumer=True)
        await wait_until(lambda: bool(stored), what="the budget's state at billing start")
        assert stored[-1][1] is False  # nothing spent yet

        started: dict[str, datetime] = {}
        replicas = [await replica(nats_url, profile, started) for _ in range(REPLICAS)]
        try:
            results = await asyncio.gather(
                *(
                    replicas[i % REPLICAS][1].run_turn(TurnRequest(profile_id=profile.id, text=f"turn {i}"))
                    for i in range(TURNS)
                )
            )
        finally:
            for nc, _, guard in replicas:
                await guard.stop()
                await nc.close()

        events = await NatsJournal(streams).events([EVENTS_ALL])
        calls = of_type(events, ModelCallCompleted)
        async with asyncpg.create_pool(database_url, min_size=1, max_size=1) as pool:

            async def billed() -> int:
                return int(await pool.fetchval("SELECT count(*) FROM model_calls"))

            deadline = time.monotonic() + 30
            while await billed() < len(calls):
                assert time.monotonic() < deadline, "billing did not bill every call"
                await asyncio.sleep(0.05)
            spent = Decimal(await pool.fetchval("SELECT sum(cost_usd) FROM model_calls"))
            crossed_by = await pool.fetchval(
                "SELECT crossed_by_event_id FROM budget_alerts WHERE budget = 'acme-daily'"
            )
        await sub.unsubscribe()

    assert len(calls) == len(started) and spent == CALL_USD * len(calls)
    exhausted_at = min(at for at, exhausted in stored if exhausted)
    over_usd = spent - LIMIT
    over_calls = len(calls) - int(LIMIT / CALL_USD)
    crossing = next(c for c in calls if c.event_id == crossed_by)
    lag_s = (exhausted_at - crossing.occurred_at).total_seconds()
    in_flight = [rid for rid, at in started.items() if at < exhausted_at]
    later = [rid for rid, at in started.items() if at >= exhausted_at]
    print(
        f"\nenforced budget: limit {LIMIT} USD, {len(calls)} calls billed ({spent} USD); past the limit: "
        f"{over_calls} calls, {over_usd} USD; calls started before the exhaustion was stored: {len(in_flight)}; "
        f"after: {len(later)}; billing's lag from the crossing call to the stored exhaustion: {lag_s:.3f} s"
    )
    # The bound: spend past the limit comes only from calls started before billing stored the exhaustion...
    assert later == []
    assert over_calls <= len(in_flight) - int(LIMIT / CALL_USD)
    # ... at most two per turn when billing stores the crossing within a model call's duration: the turn's
    # call billed in or after the crossing batch, and the one it started before the exhaustion was stored.
    assert lag_s < CALL_S
    assert 0 <= over_calls <= 2 * TURNS
    # Every turn cut short failed with the reason, and its refusal is an event.
    refused = {e.turn_id: e for e in of_type(events, ModelCallRefused)}
    finished = {e.turn_id: e for e in of_type(events, TurnFinished)}
    failed = [r for r in results if r.status is not TurnStatus.COMPLETED]
    assert failed, "the budget never stopped a turn"
    for result in failed:
        assert result.status is TurnStatus.FAILED
        assert (
            result.error is not None and "budget 'acme-daily'" in result.error and f"{LIMIT} USD limit" in result.error
        )
        assert finished[result.turn_id].error == result.error
        refusal = refused[result.turn_id]
        assert refusal.budget == "acme-daily" and refusal.tag == TAG and refusal.limit_usd == LIMIT
        assert refusal.spent_usd >= LIMIT and refusal.reason == result.error
    assert len(refused) == len(failed)


async def test_billing_start_stores_enforced_budgets_and_deletes_the_others(
    streams: JetStreamContext, nats_url: str, database_url: str
) -> None:
    kv = await streams.create_key_value(budgets_bucket_config(1))
    stale = budget_key("old-budget")
    await kv.put(stale, b"{}")
    enforced = Budget(name="acme-daily", tag=TAG, period=Period.DAY, limit_usd=LIMIT, enforce=True)
    watched = Budget(name="beta-daily", tag="client:beta", period=Period.DAY, limit_usd=LIMIT)
    async with billing(nats_url, database_url, BillingConfig(budgets=(enforced, watched))):
        deadline = time.monotonic() + 30
        while await stored_keys(kv) != {budget_key("acme-daily")}:
            assert time.monotonic() < deadline, await stored_keys(kv)
            await asyncio.sleep(0.05)
    entry = await kv.get(budget_key("acme-daily"))
    assert entry.value is not None
    stored = decode_state(entry.value)
    assert (stored.budget, stored.tag, stored.limit_usd, stored.spent_usd, stored.exhausted) == (
        "acme-daily",
        TAG,
        LIMIT,
        Decimal(0),
        False,
    )
    assert stored.period_start <= datetime.now(UTC) < stored.period_end


def test_enforce_is_read_per_budget_and_off_by_default() -> None:
    raw = (
        b'[[budget]]\ntag = "client:acme"\nlimit_usd = 1\nenforce = true\n'
        b'[[budget]]\ntag = "client:beta"\nlimit_usd = 1\n'
    )
    assert [b.enforce for b in parse_billing_config(raw, name="billing.toml").budgets] == [True, False]
    with pytest.raises(BillingConfigError, match=r"^billing.toml: .*budget\[0\]\.enforce"):
        parse_billing_config(b'[[budget]]\ntag = "client:acme"\nlimit_usd = 1\nenforce = "yes"\n', name="billing.toml")


async def stored_keys(kv: KeyValue) -> set[str]:
    """The bucket's keys; none while billing has deleted the stale one and not yet written its own."""
    try:
        return set(await kv.keys())
    except nats.js.errors.NoKeysError:
        return set()
