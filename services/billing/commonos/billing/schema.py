"""CommonBill's plugin tables, applied after the core schema on every start, `IF NOT EXISTS`.

`model_calls` holds one row per successful model call (one per `model_call_completed` event, keyed by
its event id). Token columns follow the convention of :mod:`commonos.accounting.usage`: the four input
buckets are disjoint (`input_tokens` excludes cache reads and writes) and `output_tokens` includes
`reasoning_tokens`. `created_at` is the call's own time (the event's `occurred_at`), not the insert
time, which is `recorded_at`. `cost_usd` is exact (numeric, 1e-10 USD) and NULL only when `unpriced`.

The core never reads these tables, and billing reads no core table.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Final

import msgspec

from commonos.accounting.pricing import CostStatus
from commonos.billing.rows import ModelCallRow
from commonos.proto.alerts import Period
from commonos.runtime.owners import owners_table
from commonos.runtime.partitions import stored_nowhere
from commonos.runtime.tables import (
    ANALYST,
    BILLING,
    CONSOLE,
    Checked,
    Read,
    Table,
    by_profile,
    one_of,
    positions_table,
)
from commonos.runtime.tombstones import tombstones_table

_COUNTS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "reasoning_tokens",
)

MODEL_CALLS: Final = Table(
    "model_calls",
    ModelCallRow,
    key=("event_id",),
    owner=BILLING,
    # One vendor request of a profile is one call, whichever event id names it (`projection.same_request_once`);
    # the insert returns the event ids it added.
    # Partitioned by month: a call whose event id is stored under another time (it came by telemetry, then by
    # import) is that call, not a second one (`partitions.stored_nowhere`).
    conflict=Checked(
        where="(u.request_id IS NULL OR NOT EXISTS (SELECT 1 FROM model_calls m WHERE m.request_id = u.request_id "
        "AND m.provider = u.provider AND m.profile_id = u.profile_id AND m.event_id <> u.event_id)) "
        f"AND {stored_nowhere('model_calls', 'u.event_id', 'event_id')}"
    ),
    # The call's `TokenUsage` gives the token columns, placed as the table has always had them; no column
    # holds its service tier.
    omit=frozenset({"service_tier"}),
    order=(
        *("event_id", "profile_id", "session_id", "turn_id", "request_id", "provider", "model"),
        *_COUNTS,
        *("speed", "latency_s", "stop_reason", "usage_estimated", "reported_cost_usd", "cost_usd", "cost_status"),
        *("price_source", "price_version", "price_detail", "tags", "created_at"),
    ),
    types={**dict.fromkeys(_COUNTS, "bigint"), "cost_usd": "numeric(24, 10)"},
    details={
        **{c: f"CHECK ({c} >= 0)" for c in _COUNTS[:-1]},
        "reasoning_tokens": "CHECK (reasoning_tokens >= 0 AND reasoning_tokens <= output_tokens)",
        "usage_estimated": "DEFAULT false",
        "cost_status": "\n        " + one_of("cost_status", CostStatus),
        "price_detail": "DEFAULT ''",
        "tags": "DEFAULT '{}'",
    },
    extra=("recorded_at timestamptz NOT NULL DEFAULT now()", "repriced_at timestamptz"),
    constraints=("CHECK ((cost_usd IS NULL) = (cost_status = 'unpriced'))",),
    indexes={
        "model_calls_tags": "USING gin (tags)",
        "model_calls_created": "(created_at)",
        "model_calls_session": "(session_id)",
        # A vendor request billed once whatever event id names it (projection.same_request_once).
        "model_calls_request": "(request_id) WHERE request_id IS NOT NULL",
    },
    readers=(Read(CONSOLE), Read(ANALYST, by_profile())),
    # One partition a month of the calls' own time; an accounting record, so kept unless its own retention is
    # asked (`cos retention --model-calls-keep-months`).
    partition_by="created_at",
    accounting=True,
)

#: Billing's own consumer positions, written in the same transaction as its rows.
POSITIONS: Final = positions_table("billing_positions", BILLING, (Read(CONSOLE),))


class SpendRow(msgspec.Struct, frozen=True):
    """Running spend per budgeted tag and calendar period (UTC), kept in step with model_calls by the consumer
    (same transaction) and recomputed by a reprice."""

    tag: str
    period: str
    period_start: datetime
    period_end: datetime
    spent_usd: Decimal
    calls: int
    updated_at: datetime


BUDGET_SPEND: Final = Table(
    "budget_spend",
    SpendRow,
    key=("tag", "period", "period_start"),
    owner=BILLING,
    types={"calls": "bigint"},
    details={
        "period": one_of("period", Period),
        "spent_usd": "DEFAULT 0",
        "calls": "DEFAULT 0",
        "updated_at": "DEFAULT now()",
    },
    readers=(Read(CONSOLE),),
)


class AlertRow(msgspec.Struct, frozen=True):
    """One budget and period whose limit was reached: the alert for that period was sent (or, for a period long
    closed when it was found, recorded without publishing). Same transaction as the batch."""

    budget: str
    period_start: datetime
    period_end: datetime
    period: str
    tag: str
    limit_usd: Decimal
    spent_usd: Decimal
    alert_id: uuid.UUID
    crossed_by_event_id: uuid.UUID | None
    published: bool
    sent_at: datetime


BUDGET_ALERTS: Final = Table(
    "budget_alerts",
    AlertRow,
    key=("budget", "period_start"),
    owner=BILLING,
    details={"sent_at": "DEFAULT now()"},
    readers=(Read(CONSOLE),),
)


class RepriceRow(msgspec.Struct, frozen=True):
    """One `cos billing reprice` run that changed something."""

    id: int
    ran_at: datetime
    since: datetime
    until: datetime | None
    genai_version: str
    price_file: str | None
    price_file_sha: str | None
    rows_examined: int
    rows_changed: int
    usd_before: Decimal
    usd_after: Decimal


BILLING_REPRICES: Final = Table(
    "billing_reprices",
    RepriceRow,
    owner=BILLING,
    types={"id": "bigserial", "rows_examined": "bigint", "rows_changed": "bigint"},
    details={"ran_at": "DEFAULT now()"},
    rebuilt=False,
)

#: Who owns each session billing has seen (its session_created, or the first model call naming it): a model
#: call of another profile is a profile_mismatch dead letter, never billed to the owner's session.
OWNERS: Final = owners_table("billing_session_owners", BILLING)
#: The profiles deleted (`commonos.runtime.tombstones`): a deleted profile's model calls are refused, while
#: what it was billed before stays in `model_calls`, an accounting record.
DELETIONS_TABLE: Final = "billing_profile_deletions"
DELETIONS: Final = tombstones_table(DELETIONS_TABLE, BILLING)

TABLES: Final = (MODEL_CALLS, POSITIONS, BUDGET_SPEND, BUDGET_ALERTS, BILLING_REPRICES, OWNERS, DELETIONS)
SCHEMA: Final = "\n".join(t.ddl() for t in TABLES)

#: Tables of this plugin, for tests and tools.
BILLING_TABLES: Final = (
    "model_calls",
    "billing_positions",
    "budget_spend",
    "budget_alerts",
    "billing_reprices",
    "billing_session_owners",
)
