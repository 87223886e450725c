"""The loop's budget guard on a real nats-server: it applies the state billing stores in COS_BUDGETS."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from prometheus_client import REGISTRY

from commonos.billing.enforcement import budgets_bucket_config
from commonos.loop.approvals import NatsApprover
from commonos.loop.budgets import BudgetGuard, BudgetRefused, refusal
from commonos.loop.cli import _Chat
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.proto.budget_state import BudgetState, budget_key, encode_state
from commonos.proto.events import ModelCallCompleted, ModelCallRefused
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import Settings
from tests.loop.helpers import of_type
from tests.support import wait_until

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
DAY = datetime(2026, 11, 30, tzinfo=UTC)
TAG = "client:acme"


def state(spent: str, limit: str = "5", start: datetime = DAY, name: str = "acme daily", tag: str = TAG) -> BudgetState:
    return BudgetState(
        budget=name,
        tag=tag,
        period="day",
        period_start=start,
        period_end=start + timedelta(days=1),
        limit_usd=Decimal(limit),
        spent_usd=Decimal(spent),
        exhausted=Decimal(spent) >= Decimal(limit),
        updated_at=NOW,
    )


def refused_count(budget: str) -> float:
    return REGISTRY.get_sample_value("cos_loop_model_calls_refused_total", {"budget": budget}) or 0.0


def test_refusal_is_exhausted_in_its_period_for_its_tag_only() -> None:
    assert refusal(state("5"), [TAG, "team:x"], NOW) == state("5")
    assert refusal(state("4.99"), [TAG], NOW) is None
    assert refusal(state("5"), ["client:other"], NOW) is None
    assert refusal(None, [TAG], NOW) is None
    # The next period is allowed again, until billing stores its own exhaustion.
    assert refusal(state("5"), [TAG], DAY + timedelta(days=1)) is None
    # A raised limit.
    assert refusal(state("5", limit="10"), [TAG], NOW) is None


@pytest.fixture
async def bucket(js: JetStreamContext) -> KeyValue:
    return await js.create_key_value(budgets_bucket_config(1))


@pytest.fixture
async def guard(js: JetStreamContext) -> AsyncIterator[BudgetGuard]:
    running = BudgetGuard(js, clock=lambda: NOW)
    yield running
    await running.stop()


async def test_no_bucket_enforces_nothing(guard: BudgetGuard) -> None:
    await guard.start(wait_s=2)
    await guard.check([TAG])


async def test_refuses_an_exhausted_budget_and_allows_once_raised_rolled_over_or_no_longer_enforced(
    bucket: KeyValue, guard: BudgetGuard
) -> None:
    key = budget_key("acme daily")
    assert all(ch.isalnum() or ch in "-/_=." for ch in key)
    await bucket.put(key, encode_state(state("2")))
    await guard.start()
    await guard.check([TAG])  # under the limit

    await bucket.put(key, encode_state(state("5.5")))
    counted = refused_count("acme daily")
    with pytest.raises(BudgetRefused) as refused:
        await guard.check([TAG, "team:core"])  # read fresh: no waiting for the watch
    assert refused_count("acme daily") == counted + 1
    assert str(refused.value) == (
        "model call refused: budget 'acme daily' (tag client:acme) is exhausted: spent 5.5 USD of its 5 USD limit "
        "for the day from 2026-11-30T00:00Z to 2026-12-01T00:00Z"
    )
    await guard.check(["client:other"])  # other tags are not concerned

    await bucket.put(key, encode_state(state("5.5", limit="10")))  # the limit raised
    await guard.check([TAG])

    await bucket.put(key, encode_state(state("10", limit="10", start=DAY - timedelta(days=1))))  # yesterday's
    await guard.check([TAG])

    await bucket.put(key, encode_state(state("10", limit="10")))
    with pytest.raises(BudgetRefused):
        await guard.check([TAG])
    await bucket.purge(key)  # billing no longer enforces it
    await guard.check([TAG])
    await wait_until(lambda: not guard.enforced_keys([TAG]), what="the watch dropping the budget")


async def test_a_bucket_created_later_is_found(js: JetStreamContext, guard: BudgetGuard) -> None:
    await guard.start(wait_s=1)
    kv = await js.create_key_value(budgets_bucket_config(1))
    await kv.put(budget_key("acme daily"), encode_state(state("6")))
    await wait_until(lambda: bool(guard.enforced_keys([TAG])), timeout_s=10, what="the guard finding the bucket")
    with pytest.raises(BudgetRefused):
        await guard.check([TAG])


async def test_cos_chat_says_why_a_turn_was_refused(
    nc: Client, js: JetStreamContext, bucket: KeyValue, guard: BudgetGuard, profile: Profile, capsys: Any
) -> None:
    """The loop service with its guard, `cos chat` asking it: the failed turn's reason is printed."""
    await ensure_streams(js)
    await bucket.put(budget_key("core daily"), encode_state(state("7", name="core daily", tag="team:core")))
    await guard.start()
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
        budgets=guard,
    )
    svc = LoopService(nc, loop, handle_signals=False, grace_s=0.1)
    await svc.start()
    serving = asyncio.create_task(svc.serve())
    try:
        args = argparse.Namespace(
            profile=profile.id, session=None, tag=[], yes=False, local=False, timeout=20.0, verbose=False
        )
        chat = _Chat(nc, Settings(nats_url=nc.connected_url.geturl() if nc.connected_url else ""), args)
        assert await chat.turn("hello") == 1
    finally:
        svc.stop_event.set()
        await serving
        await svc.shutdown()
    err = capsys.readouterr().err
    assert (
        "[turn failed: model call refused: budget 'core daily' (tag team:core) is exhausted: spent 7 USD of its "
        "5 USD limit for the day from 2026-11-30T00:00Z to 2026-12-01T00:00Z]"
    ) in err
    events = await NatsJournal(js).events([EVENTS_ALL])
    (refused,) = of_type(events, ModelCallRefused)
    assert (refused.budget, refused.tag, refused.spent_usd) == ("core daily", "team:core", Decimal(7))
    assert not of_type(events, ModelCallCompleted)
