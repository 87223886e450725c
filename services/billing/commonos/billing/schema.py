"""CommonBill's plugin tables, applied after the core schema on every start, `IF NOT EXISTS`.

`model_calls` holds one row per successful model call (one per `model_call_completed` event, keyed by
its event id). Token columns follow the convention of :mod:`commonos.accounting.usage`: the four input
buckets are disjoint (`input_tokens` excludes cache reads and writes) and `output_tokens` includes
`reasoning_tokens`. `created_at` is the call's own time (the event's `occurred_at`), not the insert
time, which is `recorded_at`. `cost_usd` is exact (numeric, 1e-10 USD) and NULL only when `unpriced`.

`model_call_days` holds the sums of `model_calls` per UTC day, profile, provider, model, cost status and tag set,
changed only in the transactions that change `model_calls` (`commonos.billing.days`): the cost reports read it
for whole days.

The core never reads these tables, and billing reads no core table.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
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


class CallDayRow(msgspec.Struct, frozen=True):
    """The totals of one UTC day's calls of a profile, provider, model, cost status and tag set: the sums the
    cost reports show (`commonos.accounting.cost_queries`), kept in step with `model_calls` in the same
    transaction (the consumer adds its new rows, a reprice moves the rows it changes)."""

    day: date
    profile_id: str
    provider: str
    model: str
    cost_status: str
    #: The calls' tags, sorted (byte order): calls with the same set share a row whatever order they gave.
    tags: tuple[str, ...]
    calls: int
    unpriced_calls: int
    #: The priced calls' exact cost (0 when none is priced: `calls - unpriced_calls` says whether any is).
    usd: Decimal
    input_tokens: Decimal
    output_tokens: Decimal
    cache_read_tokens: Decimal
    cache_write_5m_tokens: Decimal
    cache_write_1h_tokens: Decimal
    reasoning_tokens: Decimal


#: The key of a `model_call_days` row, in the order every writer locks rows in (no deadlock between writers).
DAY_KEY: Final = ("day", "profile_id", "provider", "model", "cost_status", "tags")

#: A month of `model_calls` that retention drops (`{month}`, detached: exactly the calls that left), taken out of
#: the days in the transaction that drops it: every UTC day of a UTC month is in that month's table, so the days
#: from its first call to its last hold its calls and no other (`Table.drops`).
DELETE_DROPPED_CALL_DAYS: Final = (
    "DELETE FROM model_call_days WHERE day "
    "BETWEEN (SELECT (min(m.created_at) AT TIME ZONE 'UTC')::date FROM {month} m) "
    "AND (SELECT (max(m.created_at) AT TIME ZONE 'UTC')::date FROM {month} m)"
)

MODEL_CALL_DAYS: Final = Table(
    "model_call_days",
    CallDayRow,
    key=DAY_KEY,
    owner=BILLING,
    # Token sums are numeric: each count is a bigint, their sum need not be. The cost keeps model_calls' scale.
    types={"calls": "bigint", "unpriced_calls": "bigint", "usd": "numeric(38, 10)"},
    # A reprice can empty a row (its calls moved to another cost status): it deletes the empty rows. No CHECK
    # on the sums: an upsert's proposed row (a reprice's negative differences) is checked before its conflict.
    indexes={"model_call_days_empty": "(day) WHERE calls = 0"},
    readers=(Read(CONSOLE), Read(ANALYST, by_profile())),
    # Retention drops months of model_calls: their days go in the same transaction (before the sessions' rows,
    # the order every writer takes them in).
    drops={MODEL_CALLS.name: (DELETE_DROPPED_CALL_DAYS,)},
)

_DAY_COLUMNS: Final = ", ".join(c.name for c in MODEL_CALL_DAYS.columns)
_DAY_SUMS: Final = [c.name for c in MODEL_CALL_DAYS.columns if c.name not in DAY_KEY]


_DAY_OF_CALL: Final = "(m.created_at AT TIME ZONE 'UTC')::date"
_SORTED_TAGS: Final = 'ARRAY(SELECT t FROM unnest(m.tags) AS t ORDER BY t COLLATE "C")'
_KEYS: Final = ", ".join(str(i) for i in range(1, len(DAY_KEY) + 1))


def _days_of(source: str, where: str) -> str:
    """The `model_call_days` rows of the `model_calls` rows (`source`, as m) where `where` holds, in key order."""
    return f"""
SELECT {_DAY_OF_CALL}, m.profile_id, m.provider, m.model, m.cost_status, {_SORTED_TAGS},
       count(*), count(*) FILTER (WHERE m.cost_usd IS NULL), coalesce(sum(m.cost_usd), 0),
       {", ".join(f"coalesce(sum(m.{c}), 0)" for c in _DAY_SUMS[3:])}
FROM {source} m
WHERE {where}
GROUP BY {_KEYS}
ORDER BY {_KEYS}"""


_ADD_SUMS: Final = "ON CONFLICT ({}) DO UPDATE SET {}".format(
    ", ".join(DAY_KEY), ", ".join(f"{c} = d.{c} + EXCLUDED.{c}" for c in _DAY_SUMS)
)
_INTO: Final = f"INSERT INTO model_call_days AS d ({_DAY_COLUMNS})"

#: Add the calls of these event ids ($1) to their days: the consumer runs it on the rows its insert added. $2
#: and $3 are the first and last of their times, so that only the months between are looked into.
ADD_CALL_DAYS: Final = (
    f"{_INTO}{_days_of('model_calls', 'm.event_id = ANY($1::uuid[]) AND m.created_at BETWEEN $2 AND $3')}\n{_ADD_SUMS}"
)

_TOKENS: Final = _DAY_SUMS[3:]

#: Move repriced calls: $1 their event ids, $2 and $3 their cost and status before the update (which has run).
#: Each call leaves its old row (its sums subtracted) for its new one (added); where its cost status stayed,
#: that adds the cost's difference. Then `DELETE_EMPTY_CALL_DAYS`.
MOVE_REPRICED_CALL_DAYS: Final = f"""
WITH old AS (
    SELECT * FROM unnest($1::uuid[], $2::numeric(24, 10)[], $3::text[]) AS o(event_id, cost_usd, cost_status)
),
moves AS (
    SELECT m.created_at, m.profile_id, m.provider, m.model, m.tags, m.cost_status, m.cost_usd, 1 AS sign,
           {", ".join(f"m.{c}" for c in _TOKENS)}
    FROM model_calls m JOIN old ON m.event_id = old.event_id
    UNION ALL
    SELECT m.created_at, m.profile_id, m.provider, m.model, m.tags, old.cost_status, old.cost_usd, -1,
           {", ".join(f"m.{c}" for c in _TOKENS)}
    FROM model_calls m JOIN old ON m.event_id = old.event_id
)
{_INTO}
SELECT {_DAY_OF_CALL}, m.profile_id, m.provider, m.model, m.cost_status, {_SORTED_TAGS},
       sum(m.sign), coalesce(sum(m.sign) FILTER (WHERE m.cost_usd IS NULL), 0),
       sum(m.sign * coalesce(m.cost_usd, 0)),
       {", ".join(f"sum(m.sign * m.{c})" for c in _TOKENS)}
FROM moves m
GROUP BY {_KEYS}
ORDER BY {_KEYS}
{_ADD_SUMS}"""

#: The rows a reprice emptied.
DELETE_EMPTY_CALL_DAYS: Final = "DELETE FROM model_call_days WHERE calls = 0"

#: Rebuild the days from $1 to $2 (dates, inclusive) from `model_calls` (after a change made by hand): clear
#: them, then fill them again, in one transaction.
CLEAR_CALL_DAYS: Final = "DELETE FROM model_call_days WHERE day BETWEEN $1::date AND $2::date"
REBUILD_CALL_DAYS: Final = f"{_INTO}{_days_of('model_calls', _DAY_OF_CALL + ' BETWEEN $1::date AND $2::date')}"

#: Fill the days from `model_calls` when they are empty and it is not: a database that had calls before the
#: table came to be. Part of the schema, run under the schema lock before billing consumes anything.
BACKFILL_CALL_DAYS: Final = f"{_INTO}{_days_of('model_calls', 'NOT EXISTS (SELECT 1 FROM model_call_days)')};\n"


class SessionCostRow(msgspec.Struct, frozen=True):
    """The totals of one session's calls (`model_calls.session_id`: a loop session's own calls, an imported tree's
    top-level session's calls, which the importer bills to it), kept in step with `model_calls` in the same
    transactions as the days: the console ranks sessions by cost from it, one row a session instead of every call."""

    session_id: uuid.UUID
    #: The profile of the session's calls (one: a call of another profile is a profile_mismatch dead letter).
    profile_id: str
    calls: int
    unpriced_calls: int
    #: The priced calls' exact cost (0 when none is priced).
    usd: Decimal
    #: The first and last of the calls' own times: the console's ranking counts the calls of a range, and when
    #: the first call is in it, the whole sum is the range's.
    first_call_at: datetime
    last_call_at: datetime


_SESSION_COLUMNS: Final = ", ".join(SessionCostRow.__struct_fields__)
_SESSIONS_INTO: Final = f"INSERT INTO session_costs AS c ({_SESSION_COLUMNS})"


def _sessions_of(source: str, where: str, sign: str = "") -> str:
    """The `session_costs` rows of the `model_calls` rows (`source`, as m) where `where` holds, in key order
    (the order every writer locks them in); `sign` "-" for rows to subtract."""
    return f"""
SELECT m.session_id, min(m.profile_id), {sign}count(*), {sign}count(*) FILTER (WHERE m.cost_usd IS NULL),
       {sign}coalesce(sum(m.cost_usd), 0), min(m.created_at), max(m.created_at)
FROM {source} m
WHERE {where}
GROUP BY m.session_id
ORDER BY m.session_id"""


_SESSION_SUMS: Final = (
    "calls = c.calls + EXCLUDED.calls, unpriced_calls = c.unpriced_calls + EXCLUDED.unpriced_calls, "
    "usd = c.usd + EXCLUDED.usd"
)
_ADD_SESSION_SUMS: Final = (
    f"ON CONFLICT (session_id) DO UPDATE SET {_SESSION_SUMS}, first_call_at = least(c.first_call_at, "
    "EXCLUDED.first_call_at), last_call_at = greatest(c.last_call_at, EXCLUDED.last_call_at)"
)

#: Add the calls of these event ids ($1, their times from $2 to $3) to their sessions: the consumer runs it after
#: `ADD_CALL_DAYS`, on the same rows.
ADD_SESSION_COSTS: Final = (
    f"{_SESSIONS_INTO}"
    f"{_sessions_of('model_calls', 'm.event_id = ANY($1::uuid[]) AND m.created_at BETWEEN $2 AND $3')}\n"
    f"{_ADD_SESSION_SUMS}"
)

#: Move repriced calls' cost in their sessions: the arguments of `MOVE_REPRICED_CALL_DAYS`, run after it. A
#: reprice changes costs and statuses, never which calls a session has (calls, times).
MOVE_REPRICED_SESSION_COSTS: Final = f"""
WITH old AS (
    SELECT * FROM unnest($1::uuid[], $2::numeric(24, 10)[], $3::text[]) AS o(event_id, cost_usd, cost_status)
)
{_SESSIONS_INTO}
SELECT m.session_id, min(m.profile_id), 0, sum((m.cost_usd IS NULL)::int - (old.cost_usd IS NULL)::int),
       sum(coalesce(m.cost_usd, 0) - coalesce(old.cost_usd, 0)), min(m.created_at), max(m.created_at)
FROM model_calls m JOIN old ON m.event_id = old.event_id
GROUP BY m.session_id
ORDER BY m.session_id
{_ADD_SESSION_SUMS}"""

#: A month of `model_calls` that retention drops, taken out of the sessions (`{month}`: the month's table, detached
#: from `model_calls` and so holding exactly the calls that left it), in the transaction that drops it: its sums
#: subtracted, a first or last call that was in it looked up again among the calls that stay, the emptied rows
#: deleted (`Table.drops`).
SUBTRACT_DROPPED_SESSION_COSTS: Final = (
    f"{_SESSIONS_INTO}{_sessions_of('{month}', 'true', sign='-')}\n"
    f"ON CONFLICT (session_id) DO UPDATE SET {_SESSION_SUMS}, "
    "first_call_at = CASE WHEN c.calls + EXCLUDED.calls = 0 OR c.first_call_at < EXCLUDED.first_call_at "
    "THEN c.first_call_at ELSE coalesce((SELECT min(x.created_at) FROM model_calls x "
    "WHERE x.session_id = c.session_id), c.first_call_at) END, "
    "last_call_at = CASE WHEN c.calls + EXCLUDED.calls = 0 OR c.last_call_at > EXCLUDED.last_call_at "
    "THEN c.last_call_at ELSE coalesce((SELECT max(x.created_at) FROM model_calls x "
    "WHERE x.session_id = c.session_id), c.last_call_at) END"
)
DELETE_EMPTY_SESSION_COSTS: Final = "DELETE FROM session_costs WHERE calls = 0"

#: Rebuild the sessions $1 (ids) from `model_calls` (after a change made by hand): clear them, then fill them
#: again, in one transaction (`days.rebuild_days`).
CLEAR_SESSION_COSTS: Final = "DELETE FROM session_costs WHERE session_id = ANY($1::uuid[])"
REBUILD_SESSION_COSTS: Final = f"{_SESSIONS_INTO}{_sessions_of('model_calls', 'm.session_id = ANY($1::uuid[])')}"
#: The sessions a rebuild of the days from $1 to $2 (dates, inclusive) computes again: those with a call on
#: those days, and those the rollup says had one (a call deleted by hand is no longer in `model_calls`).
SESSIONS_OF_DAYS: Final = f"""
SELECT m.session_id FROM model_calls m WHERE {_DAY_OF_CALL} BETWEEN $1::date AND $2::date
UNION
SELECT c.session_id FROM session_costs c
WHERE (c.first_call_at AT TIME ZONE 'UTC')::date <= $2::date
  AND (c.last_call_at AT TIME ZONE 'UTC')::date >= $1::date"""

#: Fill the sessions from `model_calls` when they are empty and it is not (a database billed before the table
#: came to be), as `BACKFILL_CALL_DAYS` fills the days.
BACKFILL_SESSION_COSTS: Final = (
    f"{_SESSIONS_INTO}{_sessions_of('model_calls', 'NOT EXISTS (SELECT 1 FROM session_costs)')};\n"
)

SESSION_COSTS: Final = Table(
    "session_costs",
    SessionCostRow,
    key=("session_id",),
    owner=BILLING,
    types={"calls": "bigint", "unpriced_calls": "bigint", "usd": "numeric(38, 10)"},
    # Retention can empty a row (every call of the session was in the month it dropped): it deletes the empty
    # rows. No CHECK on the sums, as for the days: an upsert's proposed row (a subtraction) is checked first.
    indexes={
        "session_costs_empty": "(session_id) WHERE calls = 0",
        # The console ranks the sessions with a call in a range (its last from the range's start on).
        "session_costs_last_call": "(last_call_at)",
    },
    readers=(Read(CONSOLE), Read(ANALYST, by_profile())),
    # Retention drops months of model_calls: their calls leave the sessions in the same transaction.
    drops={MODEL_CALLS.name: (SUBTRACT_DROPPED_SESSION_COSTS, DELETE_EMPTY_SESSION_COSTS)},
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
    #: 100 for the limit (`budget_exceeded`), else the `warn_at` percent (`budget_warning`).
    percent: int = 100


BUDGET_ALERTS: Final = Table(
    "budget_alerts",
    AlertRow,
    key=("budget", "period_start", "percent"),
    owner=BILLING,
    types={"percent": "smallint"},
    details={"sent_at": "DEFAULT now()", "percent": "DEFAULT 100"},
    readers=(Read(CONSOLE),),
)

#: A budget_alerts table made before warnings (key budget, period_start): its rows are the 100 % alerts; the
#: key gains the percent. Idempotent; part of the schema, run under the schema lock.
MIGRATE_BUDGET_ALERTS: Final = """
ALTER TABLE budget_alerts ADD COLUMN IF NOT EXISTS percent smallint NOT NULL DEFAULT 100;
DO $$
BEGIN
    IF (SELECT cardinality(conkey) FROM pg_constraint
        WHERE conrelid = 'budget_alerts'::regclass AND contype = 'p') = 2 THEN
        EXECUTE (SELECT format('ALTER TABLE budget_alerts DROP CONSTRAINT %I', conname) FROM pg_constraint
                 WHERE conrelid = 'budget_alerts'::regclass AND contype = 'p');
        ALTER TABLE budget_alerts ADD PRIMARY KEY (budget, period_start, percent);
    END IF;
END $$;
"""


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


class OutboxRow(msgspec.Struct, frozen=True):
    """A priced call waiting to be published as a `model_call_priced` event (`commonos.billing.outbox`): written
    in the transaction that priced it, deleted by the relay once JetStream has stored its event."""

    id: int
    #: The call (`model_calls.event_id`) and its time (`model_calls.created_at`: the row's key with it).
    call_id: uuid.UUID
    created_at: datetime
    #: 0 for billing's own pricing, else the id of the reprice run (`billing_reprices.id`) that changed it.
    revision: int
    #: The call's price at this revision, and its cost at the revision before (NULL at revision 0).
    cost_usd: Decimal | None
    previous_cost_usd: Decimal | None
    cost_status: str
    price_source: str | None
    price_version: str | None
    queued_at: datetime
    #: Why the relay holds the row instead of publishing it (its event is larger than the server's
    #: max_payload); NULL: queued. An operator releases held rows by setting it back to NULL.
    held: str | None = None


BILLING_OUTBOX: Final = Table(
    "billing_outbox",
    OutboxRow,
    key=("id",),
    owner=BILLING,
    types={
        "id": "bigserial",
        "revision": "bigint",
        "cost_usd": "numeric(24, 10)",
        "previous_cost_usd": "numeric(24, 10)",
    },
    details={"queued_at": "DEFAULT now()"},
    added=("held",),
    # What is queued is published once, whatever a replay rebuilds (a republish carries the same ids).
    rebuilt=False,
)

#: Who owns each session billing has seen (its session_created, or the first model call naming it): a model
#: call of another profile is a profile_mismatch dead letter, never billed to the owner's session.
OWNERS: Final = owners_table("billing_session_owners", BILLING)
#: The profiles deleted (`commonos.runtime.tombstones`): a deleted profile's model calls are refused, while
#: what it was billed before stays in `model_calls`, an accounting record.
DELETIONS_TABLE: Final = "billing_profile_deletions"
DELETIONS: Final = tombstones_table(DELETIONS_TABLE, BILLING)

TABLES: Final = (
    MODEL_CALLS,
    MODEL_CALL_DAYS,
    SESSION_COSTS,
    POSITIONS,
    BUDGET_SPEND,
    BUDGET_ALERTS,
    BILLING_REPRICES,
    BILLING_OUTBOX,
    OWNERS,
    DELETIONS,
)
#: The rollups filled from the calls where they are empty (a database upgraded to them): after the tables' DDL.
BACKFILL: Final = BACKFILL_CALL_DAYS + BACKFILL_SESSION_COSTS
#: The tables' DDL, then the rollups filled.
SCHEMA: Final = "\n".join(t.ddl() for t in TABLES) + MIGRATE_BUDGET_ALERTS + BACKFILL

#: Tables of this plugin, for tests and tools.
BILLING_TABLES: Final = (
    "model_calls",
    "model_call_days",
    "session_costs",
    "billing_positions",
    "budget_spend",
    "budget_alerts",
    "billing_reprices",
    "billing_outbox",
    "billing_session_owners",
)
