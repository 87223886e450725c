"""The billing projection: ``model_call_completed`` events -> priced ``model_calls`` rows.

The first half is pure (event + :class:`Pricer` -> :class:`ModelCallRow`, rows -> column arrays) so the hot
path can be benchmarked alone. :class:`BillingProjection` runs it inside the consumer's transaction: one
``INSERT … SELECT FROM unnest(…) ON CONFLICT (event_id, created_at) DO NOTHING RETURNING event_id`` per batch (a
call whose event id is stored in any month, or whose vendor request id is stored under another event id, is not
inserted: `same_request_once` and the statement's condition), then, for the rows that were really new, the
budget step and their days added to ``model_call_days`` (the rollup the cost reports read). Metrics and the
budgets' in-memory state are staged and only recorded once the consumer has committed
(:meth:`BillingProjection.committed`), so a batch that is rolled back and retried is not counted twice.

Token convention (Anthropic, OpenAI and Codex usage alike, see :mod:`commonos.accounting.usage`): the event's
``input_tokens`` excludes cache reads and writes and its ``output_tokens`` includes ``reasoning_tokens``; the
row keeps the same buckets unchanged.

A call billing cannot handle is a dead letter, never a stopped service. The consumer dead-letters what
``check`` raises as a ``DataError``, so :meth:`BillingProjection.check` runs the whole per-event path that
needs no I/O (:meth:`BillingProjection.bill`: the call's own checks, pricing, the row, the budget step's
periods) and keeps the row for ``apply``. What counts as the call's data error, and so as its dead letter:

* :class:`InvalidModelCall`: the call breaks a rule of its own (reasoning above output, a count beyond 64
  bits, a time that is no UTC time in the years 1 to 9999 or is the first or last of them, ...);
* :class:`UnbillableModelCall` (a subclass): pricing or the budget step met a value out of range on it,
  that is ``OverflowError`` (date or integer arithmetic beyond its range) or a ``decimal`` signal, or its
  cost does not fit ``model_calls.cost_usd``; the reason names the step (``pricing: ...``, ``budgets: ...``).

Anything else raised on the way is billing's own bug and must stop the service, as it always did: a
``ValueError`` among them is re-raised as :class:`BillingFault` (a ``BugError``), which says so. Rows
PostgreSQL refuses (a NUL in a text, ...) are isolated and dead-lettered by the consumer.
Metrics are counted only from rows that passed all of this, with integer and ``Decimal`` additions that
cannot fail on them (tests/fuzz/test_billing_path.py drives every step with arbitrary valid calls).
"""

from __future__ import annotations

import decimal
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from commonos.accounting.pricing import Pricer
from commonos.accounting.usage import TokenUsage
from commonos.billing.budgets import BudgetStep, BudgetTracker
from commonos.billing.days import INSERT_MODEL_CALLS, add_days
from commonos.billing.metrics import BillingMetrics, MetricBatch
from commonos.billing.outbox import INSERT_PRICED_MODEL_CALLS
from commonos.billing.rows import ModelCallRow
from commonos.billing.schema import BACKFILL, DELETIONS_TABLE, MODEL_CALLS, TABLES
from commonos.proto.events import MAX_COUNT, MAX_NAME_CHARS, Event, ModelCallCompleted, SessionCreated
from commonos.proto.subjects import (
    MODEL_CALLS_FILTER,
    PROFILES_FILTER,
    SESSIONS_CREATED_FILTER,
)
from commonos.runtime import partitions
from commonos.runtime.errors import BugError, DataError
from commonos.runtime.owners import SessionOwners
from commonos.runtime.postgres import Conn
from commonos.runtime.projection import Projection
from commonos.runtime.registry import Registration, rebuilt
from commonos.runtime.tombstones import ProfileTombstones, check_profile_event

if TYPE_CHECKING:
    from commonos.runtime.postgres import Conn

__all__ = [
    "DATA_ERRORS",
    "INSERT_MODEL_CALLS",
    "MAX_COST_USD",
    "BillingFault",
    "BillingProjection",
    "InvalidModelCall",
    "ModelCallRow",
    "UnbillableModelCall",
    "build_row",
    "check_model_call",
    "check_row",
    "insert_arguments",
    "usage_of",
]

#: ``model_calls.cost_usd`` is ``numeric(24, 10)``: a cost must stay below 10^14 USD.
MAX_COST_USD: Final = Decimal(10) ** 14 - Decimal("1e-10")

#: asyncpg stores these two instants as -infinity and infinity, not as themselves.
_FIRST_INSTANT: Final = datetime.min.replace(tzinfo=UTC)
_LAST_INSTANT: Final = datetime.max.replace(tzinfo=UTC)

#: Errors that mean "a value of this call is out of range", not "billing has a bug": date and integer
#: arithmetic beyond its range, and the signals of decimal arithmetic (InvalidOperation, Overflow, ...).
DATA_ERRORS: Final = (OverflowError, decimal.DecimalException)


class InvalidModelCall(DataError):
    """A model_call_completed event that is well-formed but cannot be billed (it is dead-lettered)."""


class UnbillableModelCall(InvalidModelCall):
    """A data error met while billing one call (pricing, budgets): that call is dead-lettered with the reason."""

    @classmethod
    def during(cls, step: str, exc: BaseException) -> UnbillableModelCall:
        if isinstance(exc, decimal.DecimalException):
            # A decimal signal's text is the list of signal classes: its name says it better.
            return cls(f"{step}: decimal arithmetic failed on the call's amounts ({type(exc).__name__})")
        return cls(f"{step}: {type(exc).__name__}: {exc}")


class BillingFault(BugError):
    """A ValueError that billing itself raised on a call that passed its checks: a bug, which stops the service.

    Not a ValueError, so that nothing takes it for the call's fault and dead-letters every call the bug touches.
    """


def check_model_call(event: ModelCallCompleted) -> None:
    """Raise :class:`InvalidModelCall` for a call that cannot be true or cannot be stored."""
    if not event.provider.strip() or not event.model.strip():
        raise InvalidModelCall("a model call names its provider and its model")
    if len(event.provider) > MAX_NAME_CHARS or len(event.model) > MAX_NAME_CHARS:
        raise InvalidModelCall(f"provider and model names are at most {MAX_NAME_CHARS} characters")
    if event.reasoning_tokens > event.output_tokens:
        raise InvalidModelCall(
            f"reasoning_tokens ({event.reasoning_tokens}) cannot exceed output_tokens ({event.output_tokens}) "
            "which includes them"
        )
    counts = (
        event.input_tokens,
        event.output_tokens,
        event.cache_read_tokens,
        event.cache_write_5m_tokens,
        event.cache_write_1h_tokens,
    )
    if max(counts) > MAX_COUNT:
        raise InvalidModelCall("a token count does not fit in 64 bits")
    reported = event.reported_cost_usd
    if reported is not None and (not reported.is_finite() or reported < 0 or reported.adjusted() > 12):
        raise InvalidModelCall(f"reported_cost_usd must be a finite amount from 0 to 1e12, got {reported}")
    at = event.occurred_at
    try:
        utc = at.astimezone(UTC)  # what pricing, budgets and PostgreSQL's driver all do with it
    except OverflowError:
        edge = "after the year 9999" if at.year == 9999 else "before the year 1"
        raise InvalidModelCall(f"occurred_at {at.isoformat()} is {edge} in UTC: no row can hold it") from None
    if utc in (_FIRST_INSTANT, _LAST_INSTANT):
        edge, stored = ("first", "-infinity") if utc == _FIRST_INSTANT else ("last", "infinity")
        raise InvalidModelCall(
            f"occurred_at {at.isoformat()} is the {edge} instant of time, which a row holds as {stored} "
            "(PostgreSQL's driver, asyncpg, maps it so)"
        )


def check_row(row: ModelCallRow) -> None:
    """Raise :class:`UnbillableModelCall` for a priced row that ``model_calls`` cannot hold."""
    cost = row.cost_usd
    if cost is not None and cost > MAX_COST_USD:
        raise UnbillableModelCall(f"pricing: the cost {cost} USD does not fit model_calls.cost_usd (below 10^14 USD)")


def usage_of(event: ModelCallCompleted) -> TokenUsage:
    """The event's token counts for the pricer: the same disjoint buckets, nothing converted."""
    return TokenUsage(
        input_tokens=event.input_tokens,
        output_tokens=event.output_tokens,
        cache_read_tokens=event.cache_read_tokens,
        cache_write_5m_tokens=event.cache_write_5m_tokens,
        cache_write_1h_tokens=event.cache_write_1h_tokens,
        reasoning_tokens=event.reasoning_tokens,
        usage_estimated=event.usage_estimated,
        speed=event.speed,
    )


def build_row(event: ModelCallCompleted, pricer: Pricer) -> ModelCallRow:
    """Price one call at its own time and shape its row (call :func:`check_model_call` first)."""
    usage = usage_of(event)
    result = pricer.price(event.provider, event.model, usage, event.occurred_at, event.reported_cost_usd)
    tags = event.tags
    if len(tags) > 1 and len(set(tags)) != len(tags):
        tags = tuple(sorted(set(tags)))  # a call counts once per tag, even if the event repeats one
    return ModelCallRow(
        event.event_id,
        event.profile_id,
        event.session_id,
        event.turn_id,
        event.request_id,
        event.provider,
        event.model,
        usage,
        event.latency_s,
        event.stop_reason,
        event.reported_cost_usd,
        result.cost_usd,
        result.status.value,
        result.source,
        result.version,
        result.detail,
        tags,
        event.occurred_at,
    )


def insert_arguments(rows: Sequence[ModelCallRow]) -> list[list[Any]]:
    """The column arrays of :data:`INSERT_MODEL_CALLS` (a vendor's text, which may hold U+0000, escaped as every
    projection stores it, `proto.text`; tags as array literals)."""
    return MODEL_CALLS.bulk_args(rows)


def same_request_once(rows: Sequence[ModelCallRow]) -> list[ModelCallRow]:
    """`rows` without a second row for a (profile, provider, request id) that an earlier row with another event id has.

    A vendor's request id names one call. Two sources can report the same call under different event ids:
    a transcript imported by an older version (whose ids for Claude Code calls were minted from the
    message, not the request) and the OTLP gateway or a re-import today. The first stored is billed; the
    rest are duplicates, like a second copy of the same event id. The profile is part of the key: a request
    id is the sender's word, and another profile's claim to the same id must not make a profile's own call a
    duplicate. :data:`INSERT_MODEL_CALLS` checks the stored rows; this checks the batch, which that statement
    cannot see. Likewise a second row of an event id: the same call reported again with another time (by
    telemetry, then by import) would be a second row of `model_calls`, whose key holds the time.
    """
    first: dict[tuple[str, str, str], uuid.UUID] = {}
    seen: set[uuid.UUID] = set()
    kept: list[ModelCallRow] = []
    for row in rows:
        if row.event_id in seen:
            continue
        seen.add(row.event_id)
        if row.request_id is not None:
            event_id = first.setdefault((row.profile_id, row.provider, row.request_id), row.event_id)
            if event_id != row.event_id:
                continue
        kept.append(row)
    return kept


def new_rows(rows: Sequence[ModelCallRow], inserted: set[uuid.UUID]) -> list[ModelCallRow]:
    """The rows the insert really added, each once (a batch may carry the same event twice)."""
    fresh: list[ModelCallRow] = []
    for row in rows:
        if row.event_id in inserted:
            inserted.discard(row.event_id)
            fresh.append(row)
    return fresh


@dataclass(slots=True)
class _Staged:
    metrics: list[MetricBatch] = field(default_factory=list)
    budgets: list[BudgetStep] = field(default_factory=list)


class BillingProjection(Projection):
    """The ``model_calls`` projection; one per process (it holds the cached :class:`Pricer`)."""

    position_table = "billing_positions"
    #: Model calls, and who owns sessions and which profiles are deleted (or re-created).
    filter_subjects = (
        MODEL_CALLS_FILTER,
        SESSIONS_CREATED_FILTER,
        PROFILES_FILTER,
    )
    #: billing_reprices is written by ``cos billing reprice``, not by the projection.
    tables = rebuilt(TABLES)

    def __init__(
        self,
        pricer: Pricer,
        metrics: BillingMetrics,
        budgets: BudgetTracker | None = None,
        name: str = "billing",
        *,
        priced_events: bool = True,
    ) -> None:
        self.name = name
        #: The insert, which also queues each call it adds for the priced-call relay unless that is off.
        self._insert = INSERT_PRICED_MODEL_CALLS if priced_events else INSERT_MODEL_CALLS
        self.pricer = pricer
        self.metrics = metrics
        self.budgets = budgets
        self._staged = _Staged()
        #: A model call is billed only to the profile that owns its session.
        self.owners = SessionOwners("billing_session_owners")
        #: And never to a deleted profile (what it was billed before its deletion stays).
        self.deletions = ProfileTombstones(DELETIONS_TABLE)
        #: Rows of the events ``check`` accepted, by the event's identity, until their batch commits.
        self._checked: dict[int, tuple[ModelCallCompleted, ModelCallRow]] = {}

    async def prepare(self, conn: Conn, events: Sequence[Event]) -> None:
        """Make the monthly partitions of model_calls the batch's calls fall in (a row's month is its call's)."""
        times = [e.occurred_at for e in events if isinstance(e, ModelCallCompleted)]
        if times:
            await partitions.ensure(conn, {MODEL_CALLS.name: times})

    def bill(self, event: ModelCallCompleted) -> ModelCallRow:
        """Everything billing does with one call before I/O: check, price, build the row, the budget periods.

        Raises :class:`InvalidModelCall` (a ``DataError``: the consumer dead-letters the call) for the call's
        data errors, :class:`BillingFault` for a ``ValueError`` that is a bug; anything else propagates.
        """
        check_model_call(event)
        try:
            row = build_row(event, self.pricer)
        except DATA_ERRORS as exc:
            raise UnbillableModelCall.during("pricing", exc) from exc
        except ValueError as exc:
            raise BillingFault(f"pricing raised {type(exc).__name__} on a valid call: {exc}") from exc
        check_row(row)
        if self.budgets is not None:
            try:
                self.budgets.check(row)
            except DATA_ERRORS as exc:
                raise UnbillableModelCall.during("budgets", exc) from exc
            except ValueError as exc:
                raise BillingFault(f"the budget step raised {type(exc).__name__} on a valid call: {exc}") from exc
        return row

    def check(self, event: Event) -> None:
        check_profile_event(event)
        if isinstance(event, ModelCallCompleted):
            self._checked[id(event)] = (event, self.bill(event))

    def row_for(self, event: ModelCallCompleted) -> ModelCallRow:
        """The row `check` built for `event`, or, for an event it did not check, the row billed now."""
        checked = self._checked.get(id(event))
        if checked is not None and checked[0] is event:
            return checked[1]
        return self.bill(event)  # not checked first: price it now (its data errors then stop the batch)

    async def apply(self, conn: Conn, events: Sequence[Event]) -> None:
        # A deleted profile's model calls are refused (profile_deleted); its sessions are not recorded as anyone's.
        events = await self.deletions.screen(conn, events, refuse=(ModelCallCompleted,), skip=(SessionCreated,))
        await self.owners.check(conn, [e for e in events if isinstance(e, (ModelCallCompleted, SessionCreated))])
        rows = same_request_once([self.row_for(e) for e in events if isinstance(e, ModelCallCompleted)])
        if not rows:
            return
        records = await conn.fetch(self._insert, *insert_arguments(rows))
        added = [r["event_id"] for r in records]
        fresh = new_rows(rows, set(added))
        step = await self.budgets.apply(conn, fresh) if self.budgets is not None and fresh else None
        # The new rows' days, after the budget step (the lock order a reprice keeps too); a call delivered
        # again adds nothing.
        await add_days(conn, fresh)
        # Staged last: an apply that raised staged nothing.
        self._staged.metrics.append(self.metrics.stage(fresh))
        if step is not None:
            self._staged.budgets.append(step)

    def rolled_back(self) -> None:
        """Forget what applies of a transaction that did not commit staged."""
        self._staged = _Staged()

    def committed(self) -> None:
        """Record metrics and budget state of the transaction that has just committed."""
        staged, self._staged = self._staged, _Staged()
        self._checked.clear()
        for batch in staged.metrics:
            self.metrics.record(batch)
        if self.budgets is not None:
            for step in staged.budgets:
                self.budgets.committed(step)


#: Billing as registered (`commonos.projections` in pyproject.toml); its service builds the projection from its
#: prices and budgets (`commonos.billing.service`).
REGISTRATION: Final = Registration("billing", "billing", TABLES, postlude=BACKFILL)
