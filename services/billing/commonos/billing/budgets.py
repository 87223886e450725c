"""Budgets: running spend per budgeted tag and period, and one alert per budget and period.

Periods are calendar days or months in UTC; a call belongs to the period of its own time (``created_at``),
so replaying the stream puts every call in the same period again.

In the consumer's transaction, after the batch's rows are inserted (:meth:`BudgetTracker.apply`):

1. ``budget_spend`` (tag, period, period_start) gets the cost of the batch's NEW rows added; a key seen for
   the first time is initialised from ``model_calls`` instead (that sum already includes the batch), so a
   budget added to the config later still counts the whole period.
2. Each budget whose period has reached its limit (spent >= limit) and has no ``budget_alerts`` row gets one
   (``INSERT … ON CONFLICT DO NOTHING``) and, for the current or the previous period, an alert on
   ``cos.alerts.budget`` whose id (``event_id`` = ``ce-id`` = ``Nats-Msg-Id``) is derived from the budget and
   the period. The publish waits
   for JetStream's PubAck inside the transaction: if the transaction then fails, the batch is redelivered,
   the alert is published again with the same id and JetStream drops it as a duplicate; once committed, the
   row stops any further alert for that period. A crossing found for an older period (a replay of history)
   is recorded with ``published = false``.
3. The same for each ``warn_at`` percent of a budget (spent >= limit × percent / 100): a ``budget_warning``
   alert, once per budget, period and percent (the ``budget_alerts`` row's key includes the percent; the
   limit's row has 100). A batch that crosses several thresholds publishes their alerts in ascending order.
   A warning says when the limit will be reached at the period's rate so far (``projected_exhausted_at``).

Concurrency (several billing partitions, a reprice): spend rows only ever get deltas added by writers, which
row locks order and which commute. A key is created only under a transaction-scoped advisory lock. A reprice
holds that lock for its whole transaction, locks the spend rows it recomputes (``FOR UPDATE``, so writers that
already added a delta commit first) and recomputes them in a later statement, which sees those writers' rows;
writers that come later add their delta to the recomputed value.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import MAXYEAR, UTC, date, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Final, Protocol

import msgspec

from commonos.billing.config import Budget, Period
from commonos.billing.metrics import BUDGET_ALERTS, BUDGET_EXCEEDED, BUDGET_LIMIT, BUDGET_SPENT, BUDGET_WARNINGS
from commonos.proto.alerts import Alert, BudgetExceeded, BudgetWarning
from commonos.proto.events import utcnow
from commonos.proto.ids import ALERT_NAMESPACE

if TYPE_CHECKING:
    from commonos.billing.rows import ModelCallRow
    from commonos.runtime.postgres import Conn

__all__ = [
    "BUDGET_LOCK_KEY",
    "AlertSink",
    "BudgetAlert",
    "BudgetStep",
    "BudgetTracker",
    "SpendKey",
    "alert_for",
    "alert_id",
    "alert_key",
    "alert_percent",
    "is_recent",
    "period_bounds",
    "projected_exhaustion",
    "spend_deltas",
    "threshold_usd",
    "warning_for",
]

#: Advisory lock (transaction scope) serialising spend updates of the consumer and of a reprice ("cosbudg").
BUDGET_LOCK_KEY: Final = 0x636F7362756467
ALERT_TYPE: Final = "budget_exceeded"


def period_bounds(period: Period, at: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar day or month containing ``at`` (naive = UTC): ``[start, end)``.

    Raises ``OverflowError`` when ``at`` is no UTC time, or its period ends after the year 9999.
    """
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    if period is Period.DAY:
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        if start.date() == date.max:
            raise OverflowError(f"the day {start:%Y-%m-%d} ends after the year {MAXYEAR}")
        return start, start + timedelta(days=1)
    start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month < 12:
        return start, start.replace(month=start.month + 1)
    if start.year == MAXYEAR:
        raise OverflowError(f"the month {start:%Y-%m} ends after the year {MAXYEAR}")
    return start, start.replace(year=start.year + 1, month=1)


def is_recent(period: Period, period_start: datetime, now: datetime) -> bool:
    """True for the current period of ``now`` and the one before it: the periods worth an alert."""
    current_start, _ = period_bounds(period, now)
    previous_start, _ = period_bounds(period, current_start - timedelta(microseconds=1))
    return period_start >= previous_start


class SpendKey(msgspec.Struct, frozen=True, order=True):
    tag: str
    period: Period
    period_start: datetime


@dataclass(slots=True)
class SpendDelta:
    """What a batch's new rows add to one key: cost, calls, and the priced rows in batch order."""

    period_end: datetime
    usd: Decimal = Decimal(0)
    calls: int = 0
    rows: list[tuple[uuid.UUID, Decimal]] = field(default_factory=list)


def spend_deltas(budgets: Sequence[Budget], rows: Iterable[ModelCallRow]) -> dict[SpendKey, SpendDelta]:
    """Per budgeted (tag, period, period start): what ``rows`` add. Pure."""
    periods_by_tag: dict[str, list[Period]] = {}
    for budget in budgets:
        periods_by_tag.setdefault(budget.tag, []).append(budget.period)
    deltas: dict[SpendKey, SpendDelta] = {}
    for row in rows:
        for tag in row.tags:
            periods = periods_by_tag.get(tag)
            if not periods:
                continue
            for period in periods:
                start, end = period_bounds(period, row.created_at)
                key = SpendKey(tag, period, start)
                delta = deltas.get(key)
                if delta is None:
                    delta = deltas[key] = SpendDelta(end)
                delta.calls += 1
                if row.cost_usd is not None:
                    delta.usd += row.cost_usd
                    delta.rows.append((row.event_id, row.cost_usd))
    return deltas


#: The bodies published on ``cos.alerts.budget`` (``commonos.proto.alerts``, schema'd like the events).
BudgetAlert = Alert

#: The percent of the limit itself: the ``budget_exceeded`` alert.
LIMIT_PERCENT: Final = 100


def alert_key(budget: Budget, period_start: datetime, percent: int = LIMIT_PERCENT) -> str:
    """The one alert of a budget, period and percent, named: its id is derived from this (and was its
    ``Nats-Msg-Id`` before alerts carried ``event_id``). The limit's (100) keeps the name it always had."""
    key = f"cos-budget-alert:{budget.name}:{budget.period}:{period_start.astimezone(UTC):%Y-%m-%dT%H:%MZ}"
    return key if percent == LIMIT_PERCENT else f"{key}:{percent}"


def alert_id(budget: Budget, period_start: datetime, percent: int = LIMIT_PERCENT) -> uuid.UUID:
    """``event_id`` (= ``ce-id`` = ``Nats-Msg-Id``) of the one alert of a budget, period and percent:
    JetStream drops a republish of it."""
    return uuid.uuid5(ALERT_NAMESPACE, alert_key(budget, period_start, percent))


def threshold_usd(budget: Budget, percent: int) -> Decimal:
    """The spend at which ``percent`` of the budget's limit is reached (exact)."""
    return budget.limit_usd * percent / 100


def projected_exhaustion(limit: Decimal, spent: Decimal, period_start: datetime, now: datetime) -> datetime | None:
    """When ``spent`` reaches ``limit`` at the rate ``spent / (now - period_start)``; None when that rate is 0
    (or not positive) or the limit is already reached. May fall after the period's end. Pure."""
    elapsed = now - period_start
    if spent <= 0 or elapsed <= timedelta(0) or spent >= limit:
        return None
    elapsed_us = Decimal(elapsed // timedelta(microseconds=1))
    remaining_us = (limit - spent) * elapsed_us / spent
    try:
        return now + timedelta(microseconds=int(remaining_us))
    except OverflowError:
        return None


def _crossed_by(threshold: Decimal, spent: Decimal, delta: SpendDelta | None) -> uuid.UUID | None:
    if delta is None:
        return None
    running = spent - delta.usd  # the period's spend before this batch
    if running >= threshold:
        return None
    for event_id, usd in delta.rows:
        running += usd
        if running >= threshold:
            return event_id
    return None


def warning_for(
    budget: Budget,
    percent: int,
    key: SpendKey,
    period_end: datetime,
    spent: Decimal,
    delta: SpendDelta | None,
    now: datetime,
) -> BudgetWarning:
    """The warning for ``budget`` at ``percent`` whose period ``key`` now has ``spent`` (>= the threshold). Pure."""
    return BudgetWarning(
        event_id=alert_id(budget, key.period_start, percent),
        occurred_at=now,
        budget=budget.name,
        tag=budget.tag,
        period=budget.period,
        period_start=key.period_start,
        period_end=period_end,
        limit_usd=budget.limit_usd,
        percent=percent,
        spent_usd=spent,
        projected_exhausted_at=projected_exhaustion(budget.limit_usd, spent, key.period_start, now),
        crossed_by_event_id=_crossed_by(threshold_usd(budget, percent), spent, delta),
    )


def alert_for(
    budget: Budget,
    key: SpendKey,
    period_end: datetime,
    spent: Decimal,
    delta: SpendDelta | None,
    now: datetime,
) -> BudgetExceeded:
    """The alert for ``budget`` whose period ``key`` now has ``spent`` (>= its limit). Pure."""
    crossed_by = _crossed_by(budget.limit_usd, spent, delta)
    the_id = alert_id(budget, key.period_start)
    return BudgetExceeded(
        event_id=the_id,
        alert_id=the_id,
        budget=budget.name,
        tag=budget.tag,
        period=budget.period,
        period_start=key.period_start,
        period_end=period_end,
        limit_usd=budget.limit_usd,
        spent_usd=spent,
        crossed_by_event_id=crossed_by,
        occurred_at=now,
    )


def alert_percent(alert: BudgetAlert) -> int:
    """The percent of the limit an alert is about: 100 for ``budget_exceeded``."""
    return alert.percent if isinstance(alert, BudgetWarning) else LIMIT_PERCENT


class AlertSink(Protocol):
    async def publish(self, alert: BudgetAlert) -> None:
        """Store the alert durably (JetStream PubAck) or raise; a republish (same ``event_id``) is dropped."""


@dataclass(slots=True)
class BudgetStep:
    """What one transaction learned: spend of the keys it touched, and the alerts it recorded."""

    spent: dict[SpendKey, Decimal] = field(default_factory=dict)
    #: budget, period start, percent, published
    alerted: list[tuple[str, datetime, int, bool]] = field(default_factory=list)


_UPDATE_SPEND: Final = """
UPDATE budget_spend b
SET spent_usd = b.spent_usd + d.usd, calls = b.calls + d.calls, updated_at = now()
FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::numeric[], $5::bigint[]) AS d(tag, period, start, usd, calls)
WHERE b.tag = d.tag AND b.period = d.period AND b.period_start = d.start
RETURNING b.tag, b.period, b.period_start, b.spent_usd
"""

#: A key seen for the first time (under the lock, so nobody else inserts it): its whole period so far, this
#: transaction's rows included.
_INIT_SPEND: Final = """
INSERT INTO budget_spend (tag, period, period_start, period_end, spent_usd, calls)
SELECT $1, $2, $3, $4, coalesce(sum(cost_usd), 0), count(*)
FROM model_calls WHERE tags @> ARRAY[$1]::text[] AND created_at >= $3 AND created_at < $4
RETURNING spent_usd
"""

_INSERT_ALERTS: Final = """
INSERT INTO budget_alerts (budget, period_start, period_end, period, tag, limit_usd, spent_usd, alert_id,
                           crossed_by_event_id, published, percent)
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::text[], $6::numeric[],
                     $7::numeric[], $8::uuid[], $9::uuid[], $10::bool[], $11::smallint[])
ON CONFLICT (budget, period_start, percent) DO NOTHING
RETURNING budget, period_start, percent
"""

_CURRENT_SPEND: Final = """
SELECT spent_usd FROM budget_spend WHERE tag = $1 AND period = $2 AND period_start = $3
"""

_ALERTED: Final = "SELECT percent FROM budget_alerts WHERE budget = $1 AND period_start = $2"


class BudgetTracker:
    """The budget step of the billing projection, and the budget gauges."""

    def __init__(
        self,
        budgets: Sequence[Budget],
        sink: AlertSink | None,
        clock: Callable[[], datetime] = utcnow,
        on_committed: Callable[[Mapping[SpendKey, Decimal]], None] | None = None,
    ) -> None:
        self.budgets = tuple(budgets)
        #: Told the spend of each commit (`commonos.billing.enforcement`).
        self.on_committed = on_committed
        self.sink = sink
        self.clock = clock
        self._by_key: dict[tuple[str, Period], Budget] = {(b.tag, b.period): b for b in self.budgets}
        self._periods: dict[str, tuple[Period, ...]] = {}
        for budget in self.budgets:
            self._periods[budget.tag] = (*self._periods.get(budget.tag, ()), budget.period)
        #: (budget name, period start) with a committed budget_alerts row: no need to ask again.
        self._alerted: set[tuple[str, datetime, int]] = set()
        #: Spend keys with a committed budget_spend row.
        self._known: set[SpendKey] = set()
        for budget in self.budgets:
            BUDGET_LIMIT.labels(budget.name).set(float(budget.limit_usd))
            # At 0 until `load` reads the stored spend (and when there is none), and until the first alert.
            BUDGET_SPENT.labels(budget.name)
            BUDGET_EXCEEDED.labels(budget.name)
            BUDGET_ALERTS.labels(budget.name)
            for percent in budget.warn_at:
                BUDGET_WARNINGS.labels(budget.name, str(percent))

    async def load(self, conn: Conn) -> None:
        """Set the gauges from the stored spend of each budget's current period (at start)."""
        now = self.clock()
        for budget in self.budgets:
            start, _ = period_bounds(budget.period, now)
            spent = await conn.fetchval(_CURRENT_SPEND, budget.tag, budget.period.value, start)
            if spent is not None:
                self._known.add(SpendKey(budget.tag, budget.period, start))
            for record in await conn.fetch(_ALERTED, budget.name, start):
                self._alerted.add((budget.name, start, record["percent"]))
            self._set_gauges(budget, Decimal(spent or 0))

    def check(self, row: ModelCallRow) -> None:
        """The budget step's arithmetic for one row, without I/O: raises what :meth:`apply` would raise for it
        (``OverflowError`` when a budgeted period of the call ends after the year 9999)."""
        for tag in row.tags:
            for period in self._periods.get(tag, ()):
                period_bounds(period, row.created_at)

    def due_alerts(
        self, deltas: Mapping[SpendKey, SpendDelta], spent: Mapping[SpendKey, Decimal], now: datetime
    ) -> list[tuple[Budget, BudgetAlert, bool]]:
        """The alerts of the keys that reached a ``warn_at`` percent or their limit with ``spent`` and have none
        yet for it (ascending percent per key), each with whether to publish it (a sink, and the current or
        previous period). Pure."""
        alerts: list[tuple[Budget, BudgetAlert, bool]] = []
        for key in sorted(deltas):
            budget = self._by_key[key.tag, key.period]
            total = spent[key]
            recent = self.sink is not None and is_recent(budget.period, key.period_start, now)
            for percent in (*budget.warn_at, LIMIT_PERCENT):
                if total < threshold_usd(budget, percent) or (budget.name, key.period_start, percent) in self._alerted:
                    continue
                end = deltas[key].period_end
                alert: BudgetAlert = (
                    alert_for(budget, key, end, total, deltas[key], now)
                    if percent == LIMIT_PERCENT
                    else warning_for(budget, percent, key, end, total, deltas[key], now)
                )
                alerts.append((budget, alert, recent))
        return alerts

    async def apply(self, conn: Conn, rows: Sequence[ModelCallRow]) -> BudgetStep | None:
        """Update spend with ``rows`` (new rows only) and record/publish alerts; inside the transaction."""
        deltas = spend_deltas(self.budgets, rows)
        if not deltas:
            return None
        keys = sorted(deltas)
        step = BudgetStep()
        # A key is created only under the lock, taken before any spend row is locked (no deadlock with a
        # reprice, which holds the lock and then locks spend rows). Known keys need no lock: deltas commute.
        locked = any(key not in self._known for key in keys)
        if locked:
            await conn.execute("SELECT pg_advisory_xact_lock($1)", BUDGET_LOCK_KEY)
        await self._add_spend(conn, keys, deltas, step)
        missing = [key for key in keys if key not in step.spent]
        if missing and not locked:  # a row we knew was deleted by hand
            await conn.execute("SELECT pg_advisory_xact_lock($1)", BUDGET_LOCK_KEY)
            await self._add_spend(conn, missing, deltas, step)
            missing = [key for key in missing if key not in step.spent]
        for key in missing:
            step.spent[key] = await conn.fetchval(
                _INIT_SPEND, key.tag, key.period.value, key.period_start, deltas[key].period_end
            )
        alerts = self.due_alerts(deltas, step.spent, self.clock())
        if alerts:
            recorded: set[tuple[str, datetime, int]] = {
                (r["budget"], r["period_start"], r["percent"])
                for r in await conn.fetch(
                    _INSERT_ALERTS,
                    [a.budget for _, a, _ in alerts],
                    [a.period_start for _, a, _ in alerts],
                    [a.period_end for _, a, _ in alerts],
                    [a.period.value for _, a, _ in alerts],
                    [a.tag for _, a, _ in alerts],
                    [a.limit_usd for _, a, _ in alerts],
                    [a.spent_usd for _, a, _ in alerts],
                    [a.event_id for _, a, _ in alerts],
                    [a.crossed_by_event_id for _, a, _ in alerts],
                    [publish for _, _, publish in alerts],
                    [alert_percent(a) for _, a, _ in alerts],
                )
            }
            for _, alert, publish in alerts:
                percent = alert_percent(alert)
                if (alert.budget, alert.period_start, percent) not in recorded:
                    step.alerted.append((alert.budget, alert.period_start, percent, False))  # an earlier batch did
                    continue
                if publish:
                    assert self.sink is not None
                    await self.sink.publish(alert)
                step.alerted.append((alert.budget, alert.period_start, percent, publish))
        return step

    @staticmethod
    async def _add_spend(
        conn: Conn, keys: list[SpendKey], deltas: dict[SpendKey, SpendDelta], step: BudgetStep
    ) -> None:
        """Add each key's delta to its existing row (row locks order concurrent writers; increments commute)."""
        updated = await conn.fetch(
            _UPDATE_SPEND,
            [k.tag for k in keys],
            [k.period.value for k in keys],
            [k.period_start for k in keys],
            [deltas[k].usd for k in keys],
            [deltas[k].calls for k in keys],
        )
        for record in updated:
            step.spent[SpendKey(record["tag"], Period(record["period"]), record["period_start"])] = record["spent_usd"]

    def committed(self, step: BudgetStep) -> None:
        """The transaction of ``step`` committed: remember its keys and alerts, update the gauges."""
        self._known.update(step.spent)
        if self.on_committed is not None:
            self.on_committed(step.spent)
        for name, period_start, percent, published in step.alerted:
            self._alerted.add((name, period_start, percent))
            if published and percent == LIMIT_PERCENT:
                BUDGET_ALERTS.labels(name).inc()
            elif published:
                BUDGET_WARNINGS.labels(name, str(percent)).inc()
        now = self.clock()
        for key, spent in step.spent.items():
            budget = self._by_key.get((key.tag, key.period))
            if budget is not None and key.period_start == period_bounds(budget.period, now)[0]:
                self._set_gauges(budget, spent)

    @staticmethod
    def _set_gauges(budget: Budget, spent: Decimal) -> None:
        BUDGET_SPENT.labels(budget.name).set(float(spent))
        BUDGET_EXCEEDED.labels(budget.name).set(1 if spent >= budget.limit_usd else 0)
