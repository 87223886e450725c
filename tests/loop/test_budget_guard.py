"""The loop's budget guard on a real nats-server: it applies the state billing stores in COS_BUDGETS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from commonos.billing.enforcement import budgets_bucket_config
from commonos.loop.budgets import BudgetGuard, BudgetRefused, refusal
from commonos.proto.budget_state import BudgetState, budget_key, encode_state
from tests.support import wait_until

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
DAY = datetime(2026, 11, 30, tzinfo=UTC)
TAG = "client:acme"


def state(spent: str, limit: str = "5", start: datetime = DAY, name: str = "acme daily") -> BudgetState:
    return BudgetState(
        budget=name,
        tag=TAG,
        period="day",
        period_start=start,
        period_end=start + timedelta(days=1),
        limit_usd=Decimal(limit),
        spent_usd=Decimal(spent),
        exhausted=Decimal(spent) >= Decimal(limit),
        updated_at=NOW,
    )


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
    with pytest.raises(BudgetRefused) as refused:
        await guard.check([TAG, "team:core"])  # read fresh: no waiting for the watch
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
