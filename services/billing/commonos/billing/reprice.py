"""``cos billing reprice``: price stored calls again with today's prices and price file.

Every ``model_calls`` row from ``since`` (to ``until``, exclusive) is priced again at its own time with a
fresh :class:`Pricer`. A row changes when its cost, cost status or price source would change; it then gets the
new ``price_version`` and ``price_detail`` and ``repriced_at = now()``. Rows whose cost is the same keep the
version that priced them, so a second run with the same prices changes nothing (idempotent), and a price-file
edit changes exactly the rows it affects. Budget spend of the periods in range is recomputed, then the daily
rollup (``model_call_days``) is adjusted by what changed: each changed call leaves its day's row of its old cost
and status for the row of its new ones, in one statement (its row locks taken last and in key order, as the
consumer takes them). A run that changed rows is logged in ``billing_reprices``. Everything happens in one
transaction: a row whose new cost ``model_calls.cost_usd`` cannot hold stops the run with a :class:`RepriceError`
and nothing changes.

The running billing service keeps the prices it started with: restart it after changing the price file, or
new calls are priced with the old file (a reprice later fixes them too).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

import asyncpg

from commonos.accounting.pricing import PriceFile, Pricer, PriceResult
from commonos.accounting.usage import TokenUsage
from commonos.billing.budgets import BUDGET_LOCK_KEY
from commonos.billing.outbox import QUEUE_REPRICED
from commonos.billing.projection import MAX_COST_USD
from commonos.billing.report import columns
from commonos.billing.schema import DELETE_EMPTY_CALL_DAYS, MOVE_REPRICED_CALL_DAYS, MOVE_REPRICED_SESSION_COSTS
from commonos.proto.errors import DataError
from commonos.runtime.postgres import Conn

__all__ = ["RepriceChange", "RepriceError", "RepriceResult", "render_reprice", "reprice", "reprice_row"]

#: A stored row: an asyncpg Record, or any mapping with the same keys.
Row = Mapping[str, Any] | asyncpg.Record

_CHUNK: Final = 5000
_ZERO: Final = Decimal(0)

_SELECT: Final = """
SELECT event_id, provider, model, input_tokens, output_tokens, cache_read_tokens, cache_write_5m_tokens,
       cache_write_1h_tokens, reasoning_tokens, speed, usage_estimated, reported_cost_usd,
       cost_usd, cost_status, price_source, created_at
FROM model_calls
WHERE created_at >= $1 AND ($2::timestamptz IS NULL OR created_at < $2)
  AND (created_at, event_id) > ($3, $4)
ORDER BY created_at, event_id
LIMIT $5
"""

_UPDATE: Final = """
UPDATE model_calls m
SET cost_usd = u.cost, cost_status = u.status, price_source = u.source, price_version = u.version,
    price_detail = u.detail, repriced_at = now()
FROM unnest($1::uuid[], $2::numeric[], $3::text[], $4::text[], $5::text[], $6::text[])
     AS u(id, cost, status, source, version, detail)
WHERE m.event_id = u.id
"""

_LOCK_SPEND: Final = """
SELECT 1 FROM budget_spend WHERE period_end > $1 AND ($2::timestamptz IS NULL OR period_start < $2) FOR UPDATE
"""

_RECOMPUTE_SPEND: Final = """
UPDATE budget_spend b
SET (spent_usd, calls, updated_at) = (
    SELECT coalesce(sum(cost_usd), 0), count(*), now() FROM model_calls m
    WHERE m.tags @> ARRAY[b.tag] AND m.created_at >= b.period_start AND m.created_at < b.period_end)
WHERE b.period_end > $1 AND ($2::timestamptz IS NULL OR b.period_start < $2)
"""

_LOG: Final = """
INSERT INTO billing_reprices (id, since, until, genai_version, price_file, price_file_sha, rows_examined,
                              rows_changed, usd_before, usd_after)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""

#: The run's id, taken first: its changes are queued as priced-call events under it (their revision).
_RUN_ID: Final = "SELECT nextval(pg_get_serial_sequence('billing_reprices', 'id'))"


class RepriceError(DataError):
    """A reprice that cannot be done (the whole run is rolled back); the message is one line."""


@dataclass(slots=True)
class RepriceChange:
    """Changed rows of one provider, model and status transition."""

    provider: str
    model: str
    old_status: str
    new_status: str
    rows: int = 0
    usd_before: Decimal = _ZERO
    usd_after: Decimal = _ZERO

    @property
    def delta(self) -> Decimal:
        return self.usd_after - self.usd_before


@dataclass(slots=True)
class RepriceResult:
    since: datetime
    until: datetime | None
    genai_version: str
    price_file: str | None
    dry_run: bool
    examined: int = 0
    changed: int = 0
    usd_before: Decimal = _ZERO  # of the changed rows
    usd_after: Decimal = _ZERO
    changes: dict[tuple[str, str, str, str], RepriceChange] = field(default_factory=dict)


def reprice_row(pricer: Pricer, row: Row) -> PriceResult:
    """The price of a stored call with ``pricer``, at the call's own time. Pure."""
    usage = TokenUsage(
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        cache_read_tokens=row["cache_read_tokens"],
        cache_write_5m_tokens=row["cache_write_5m_tokens"],
        cache_write_1h_tokens=row["cache_write_1h_tokens"],
        reasoning_tokens=row["reasoning_tokens"],
        usage_estimated=row["usage_estimated"],
        speed=row["speed"],
    )
    return pricer.price(row["provider"], row["model"], usage, row["created_at"], row["reported_cost_usd"])


def _is_change(row: Row, new: PriceResult) -> bool:
    return (row["cost_usd"], row["cost_status"], row["price_source"]) != (new.cost_usd, new.status.value, new.source)


async def reprice(
    conn: Conn,
    since: datetime,
    until: datetime | None = None,
    price_file: PriceFile | None = None,
    *,
    dry_run: bool = False,
    chunk: int = _CHUNK,
    priced_events: bool = True,
) -> RepriceResult:
    """Reprice the calls in ``[since, until)``; with ``dry_run`` report the changes and write nothing.

    Each changed call is queued (``priced_events``, COS_BILLING_PRICED_EVENTS) as a priced-call event whose
    revision is the run's id, with its cost before and after, in the run's transaction (`billing.outbox`)."""
    pricer = Pricer(price_file)
    result = RepriceResult(
        since=since,
        until=until,
        genai_version=pricer.genai_version,
        price_file=price_file.name if price_file is not None else None,
        dry_run=dry_run,
    )
    after: tuple[datetime, uuid.UUID] = (since, uuid.UUID(int=0))
    #: The changed calls' event ids, and their cost and status before the run (for the rollup's moves).
    moved: tuple[list[uuid.UUID], list[Decimal | None], list[str]] = ([], [], [])
    async with conn.transaction():
        run_id = 0
        if not dry_run:
            # Held to the end: no spend row is created meanwhile from costs this run is changing.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", BUDGET_LOCK_KEY)
            run_id = int(await conn.fetchval(_RUN_ID))
        while True:
            rows = await conn.fetch(_SELECT, since, until, after[0], after[1], chunk)
            if not rows:
                break
            after = (rows[-1]["created_at"], rows[-1]["event_id"])
            result.examined += len(rows)
            update: list[tuple[Any, ...]] = []
            #: The changed calls' times and costs before (the update's rows, same order), for the outbox.
            before: list[tuple[datetime, Decimal | None]] = []
            for row in rows:
                new = reprice_row(pricer, row)
                if not _is_change(row, new):
                    continue
                if new.cost_usd is not None and new.cost_usd > MAX_COST_USD:
                    raise RepriceError(
                        f"call {row['event_id']}: its new cost {new.cost_usd} USD does not fit model_calls.cost_usd "
                        "(below 10^14 USD); nothing was repriced"
                    )
                key = (row["provider"], row["model"], row["cost_status"], new.status.value)
                change = result.changes.get(key)
                if change is None:
                    change = result.changes[key] = RepriceChange(*key)
                change.rows += 1
                change.usd_before += row["cost_usd"] or _ZERO
                change.usd_after += new.cost_usd or _ZERO
                update.append((row["event_id"], new.cost_usd, new.status.value, new.source, new.version, new.detail))
                before.append((row["created_at"], row["cost_usd"]))
                moved[0].append(row["event_id"])
                moved[1].append(row["cost_usd"])
                moved[2].append(row["cost_status"])
            result.changed += len(update)
            if update and not dry_run:
                await conn.execute(_UPDATE, *(list(column) for column in zip(*update, strict=True)))
                if priced_events:
                    await conn.execute(
                        QUEUE_REPRICED,
                        run_id,
                        [u[0] for u in update],
                        [b[0] for b in before],
                        [u[1] for u in update],
                        [b[1] for b in before],
                        [u[2] for u in update],
                        [u[3] for u in update],
                        [u[4] for u in update],
                    )
        result.usd_before = sum((c.usd_before for c in result.changes.values()), _ZERO)
        result.usd_after = sum((c.usd_after for c in result.changes.values()), _ZERO)
        if result.changed and not dry_run:
            # Writers that already added a delta to these rows commit first; the recompute, a later statement,
            # then sees their calls. Writers after it add their delta to the recomputed value.
            await conn.execute(_LOCK_SPEND, since, until)
            await conn.execute(_RECOMPUTE_SPEND, since, until)
            # Last, as the consumer adds its days last: the days' row locks after the spend rows'.
            await conn.execute(MOVE_REPRICED_CALL_DAYS, *moved)
            await conn.execute(DELETE_EMPTY_CALL_DAYS)
            await conn.execute(MOVE_REPRICED_SESSION_COSTS, *moved)  # then the sessions' rows, as the consumer
            await conn.execute(
                _LOG,
                run_id,
                since,
                until,
                pricer.genai_version,
                price_file.name if price_file is not None else None,
                price_file.sha256 if price_file is not None else None,
                result.examined,
                result.changed,
                result.usd_before,
                result.usd_after,
            )
    return result


def _usd(value: Decimal) -> str:
    return f"{value:,.4f}"


def render_reprice(result: RepriceResult, fmt: str = "table") -> str:
    """The run's changes, for people (``table``) or programs (``json``; amounts as exact strings)."""
    changes = sorted(result.changes.values(), key=lambda c: (-abs(c.delta), c.provider, c.model))
    if fmt == "json":
        return json.dumps(
            {
                "since": result.since.isoformat(),
                "until": result.until.isoformat() if result.until else None,
                "dry_run": result.dry_run,
                "genai_version": result.genai_version,
                "price_file": result.price_file,
                "rows_examined": result.examined,
                "rows_changed": result.changed,
                "usd_before": str(result.usd_before),
                "usd_after": str(result.usd_after),
                "changes": [
                    {
                        "provider": c.provider,
                        "model": c.model,
                        "old_status": c.old_status,
                        "new_status": c.new_status,
                        "rows": c.rows,
                        "usd_before": str(c.usd_before),
                        "usd_after": str(c.usd_after),
                    }
                    for c in changes
                ],
            },
            indent=2,
        )
    window = f"{result.since.isoformat()} .. {result.until.isoformat() if result.until else 'now'}"
    prices = result.genai_version + (f" + {result.price_file}" if result.price_file else "")
    lines = [f"Repriced calls {window} with {prices}{' (dry run: nothing written)' if result.dry_run else ''}"]
    if changes:
        header = ("provider", "model", "status", "rows", "usd before", "usd after", "change")
        table = [
            (
                c.provider,
                c.model,
                c.old_status if c.old_status == c.new_status else f"{c.old_status} -> {c.new_status}",
                str(c.rows),
                _usd(c.usd_before),
                _usd(c.usd_after),
                f"{c.delta:+,.4f}",
            )
            for c in changes
        ]
        lines.append(columns(header, table, right_from=3))
    verb = "would change" if result.dry_run else "changed"
    lines.append(
        f"{result.examined} rows examined, {result.changed} {verb}: "
        f"${_usd(result.usd_before)} -> ${_usd(result.usd_after)} ({result.usd_after - result.usd_before:+,.4f} USD)"
    )
    return "\n".join(lines)
