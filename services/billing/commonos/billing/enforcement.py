"""Enforced budgets: billing stores the state of each budget with ``enforce = true`` where the loop reads it.

The state goes to the JetStream key-value bucket ``COS_BUDGETS`` (`commonos.proto.budget_state`), one key per
budget, value = the current period's spend, limit and whether it is exhausted (spent >= limit). Billing creates
the bucket (replicas = ``COS_STREAM_REPLICAS``) and is its only writer:

* at start (:meth:`Enforcement.reconcile`): the stored spend of every enforced budget's current period is put,
  and the keys of budgets no longer enforced are deleted;
* after each commit that changed an enforced budget's current-period spend (:meth:`Enforcement.committed`,
  called by ``BudgetTracker.committed``): the new spend is put, in commit order, by one background task.

Spend only grows between reprices, so a put never lowers the stored spend of the same period (several billing
partitions may commit the same budget): the put is a compare-and-set on the key's revision that keeps the higher
spend. A reprice that lowers spend is stored at the next start (reconcile).

The bound this gives (see ARCHITECTURE.md): spend counted past the limit comes only from model calls that passed
the loop's check before billing stored the exhaustion. While billing is down, or between its commit and the put,
spend is not (yet) stored, so the bound holds only while billing runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Final

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

from commonos.billing.budgets import SpendKey, period_bounds
from commonos.billing.config import Budget
from commonos.proto.budget_state import BUDGETS_BUCKET, BudgetState, budget_key, decode_state, encode_state
from commonos.proto.events import utcnow

if TYPE_CHECKING:
    from commonos.runtime.postgres import Conn

__all__ = ["Enforcement", "budget_state", "budgets_bucket_config"]

log = logging.getLogger("commonos.billing.enforcement")

_CURRENT_SPEND: Final = "SELECT spent_usd FROM budget_spend WHERE tag = $1 AND period = $2 AND period_start = $3"
_PERIOD_SPEND: Final = """
SELECT coalesce(sum(cost_usd), 0) FROM model_calls
WHERE tags @> ARRAY[$1]::text[] AND created_at >= $2 AND created_at < $3
"""


def budgets_bucket_config(replicas: int) -> KeyValueConfig:
    """The bucket: one value per key, no direct gets (a get is answered by the stream's leader)."""
    return KeyValueConfig(
        bucket=BUDGETS_BUCKET,
        description="State of the enforced budgets, written by billing, read by the loop",
        history=1,
        replicas=replicas,
        direct=False,
    )


def budget_state(
    budget: Budget, period_start: datetime, period_end: datetime, spent: Decimal, now: datetime
) -> BudgetState:
    """Pure."""
    return BudgetState(
        budget=budget.name,
        tag=budget.tag,
        period=budget.period.value,
        period_start=period_start,
        period_end=period_end,
        limit_usd=budget.limit_usd,
        spent_usd=spent,
        exhausted=spent >= budget.limit_usd,
        updated_at=now,
    )


class Enforcement:
    """Stores the enforced budgets' state in ``COS_BUDGETS``."""

    def __init__(self, kv: KeyValue, budgets: Sequence[Budget], clock: Callable[[], datetime] = utcnow) -> None:
        self.kv = kv
        self.budgets = {b.name: b for b in budgets if b.enforce}
        self._by_key: dict[tuple[str, str], tuple[Budget, ...]] = {}
        for budget in self.budgets.values():
            key = (budget.tag, budget.period.value)
            self._by_key[key] = (*self._by_key.get(key, ()), budget)
        self.clock = clock
        self._pending: dict[str, BudgetState] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, js: JetStreamContext, budgets: Sequence[Budget], replicas: int) -> Enforcement:
        """Create (or bind) the bucket."""
        kv = await js.create_key_value(budgets_bucket_config(replicas))
        return cls(kv, budgets)

    async def reconcile(self, conn: Conn) -> None:
        """At start: put the current state of every enforced budget, delete the keys of the others."""
        now = self.clock()
        wanted = {budget_key(name) for name in self.budgets}
        try:
            existing = await self.kv.keys()
        except NoKeysError:  # an empty bucket
            existing = []
        for key in existing:
            if key not in wanted:
                await self.kv.purge(key)
        for budget in self.budgets.values():
            start, end = period_bounds(budget.period, now)
            spent = await conn.fetchval(_CURRENT_SPEND, budget.tag, budget.period.value, start)
            if spent is None:
                spent = await conn.fetchval(_PERIOD_SPEND, budget.tag, start, end)
            await self.kv.put(budget_key(budget.name), encode_state(budget_state(budget, start, end, spent, now)))

    def committed(self, spent: Mapping[SpendKey, Decimal]) -> None:
        """A transaction committed ``spent`` (the new spend of the keys it touched): queue the state of the
        enforced budgets' current periods among them for the background put."""
        now = self.clock()
        for key, usd in spent.items():
            for budget in self._by_key.get((key.tag, key.period.value), ()):
                start, end = period_bounds(budget.period, key.period_start)
                if start <= now < end:
                    self._pending[budget.name] = budget_state(budget, start, end, usd, now)
        if self._pending:
            self._wake.set()
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run(), name="budget-enforcement")

    async def flush(self) -> None:
        """Put what is pending now (the background task's work; also for tests and at stop)."""
        while self._pending:
            name, state = next(iter(self._pending.items()))
            del self._pending[name]
            try:
                await self._put_max(budget_key(name), state)
            except Exception as exc:
                log.warning("could not store the state of budget %s (retrying): %s", name, exc)
                self._pending.setdefault(name, state)
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def _put_max(self, key: str, state: BudgetState) -> None:
        """Put ``state`` unless the key holds a higher spend of the same period (compare-and-set)."""
        while True:
            try:
                entry = await self.kv.get(key)
            except KeyNotFoundError:
                try:
                    await self.kv.create(key, encode_state(state))
                    return
                except KeyWrongLastSequenceError:
                    continue
            if entry.value:
                stored = decode_state(entry.value)
                if (
                    stored.period_start == state.period_start
                    and stored.spent_usd >= state.spent_usd
                    and stored.limit_usd == state.limit_usd
                ):
                    return
            try:
                await self.kv.update(key, encode_state(state), last=entry.revision)
                return
            except KeyWrongLastSequenceError:
                continue
