"""deploy/nats/auth.conf on a real nats-server: billing writes the enforced budgets' bucket (COS_BUDGETS), the
loop's budget guard reads it, and the loop may not write it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from commonos.billing.budgets import period_bounds
from commonos.billing.config import Budget, Period
from commonos.billing.enforcement import Enforcement, budget_state
from commonos.loop.budgets import BudgetGuard, BudgetRefused
from commonos.proto.budget_state import BUDGETS_BUCKET, budget_key, encode_state
from tests.deploy.conftest import SecuredNats


async def test_billing_writes_the_budget_state_the_loop_reads_and_cannot_write(secured_nats: SecuredNats) -> None:
    budget = Budget(name="acme-daily", tag="client:acme", period=Period.DAY, limit_usd=Decimal(1), enforce=True)
    billing = await secured_nats.connect("billing")
    enforcement = await Enforcement.open(billing.jetstream(), [budget], replicas=1)
    now = datetime.now(UTC)
    start, end = period_bounds(budget.period, now)
    await enforcement.kv.put(budget_key(budget.name), encode_state(budget_state(budget, start, end, Decimal(2), now)))
    assert secured_nats.violations("billing") == []

    loop = await secured_nats.connect("loop")
    guard = BudgetGuard(loop.jetstream())
    await guard.start()
    try:
        with pytest.raises(BudgetRefused):
            await guard.check(["client:acme"])
    finally:
        await guard.stop()
    assert secured_nats.violations("loop") == []
    await loop.publish(f"$KV.{BUDGETS_BUCKET}.{budget_key(budget.name)}", b"{}")
    await loop.flush()
    await secured_nats.refused("loop", f"$KV.{BUDGETS_BUCKET}")
