"""CommonBill's plugin tables, applied after the core schema on every start, `IF NOT EXISTS`.

`model_calls` holds one row per successful model call (one per `model_call_completed` event, keyed by
its event id). Token columns follow the convention of :mod:`commonos.accounting.usage`: the four input
buckets are disjoint (`input_tokens` excludes cache reads and writes) and `output_tokens` includes
`reasoning_tokens`. `created_at` is the call's own time (the event's `occurred_at`), not the insert
time, which is `recorded_at`. `cost_usd` is exact (numeric, 1e-10 USD) and NULL only when `unpriced`.

The core never reads these tables, and billing reads no core table.
"""

from typing import Final

from commonos.runtime.owners import owners_schema
from commonos.runtime.tombstones import tombstones_schema

SCHEMA = """
CREATE TABLE IF NOT EXISTS model_calls (
    event_id              uuid PRIMARY KEY,
    profile_id            text NOT NULL,
    session_id            uuid NOT NULL,
    turn_id               uuid,
    request_id            text,
    provider              text NOT NULL,
    model                 text NOT NULL,
    input_tokens          bigint NOT NULL CHECK (input_tokens >= 0),
    output_tokens         bigint NOT NULL CHECK (output_tokens >= 0),
    cache_read_tokens     bigint NOT NULL CHECK (cache_read_tokens >= 0),
    cache_write_5m_tokens bigint NOT NULL CHECK (cache_write_5m_tokens >= 0),
    cache_write_1h_tokens bigint NOT NULL CHECK (cache_write_1h_tokens >= 0),
    reasoning_tokens      bigint NOT NULL CHECK (reasoning_tokens >= 0 AND reasoning_tokens <= output_tokens),
    speed                 text,
    latency_s             double precision,
    stop_reason           text,
    usage_estimated       boolean NOT NULL DEFAULT false,
    reported_cost_usd     numeric,
    cost_usd              numeric(24, 10),
    cost_status           text NOT NULL
        CHECK (cost_status IN ('priced', 'override', 'reported', 'unpriced', 'estimated')),
    price_source          text NOT NULL,
    price_version         text NOT NULL,
    price_detail          text NOT NULL DEFAULT '',
    tags                  text[] NOT NULL DEFAULT '{}',
    created_at            timestamptz NOT NULL,
    recorded_at           timestamptz NOT NULL DEFAULT now(),
    repriced_at           timestamptz,
    CHECK ((cost_usd IS NULL) = (cost_status = 'unpriced'))
);
CREATE INDEX IF NOT EXISTS model_calls_tags ON model_calls USING gin (tags);
CREATE INDEX IF NOT EXISTS model_calls_created ON model_calls (created_at);
CREATE INDEX IF NOT EXISTS model_calls_session ON model_calls (session_id);
-- A vendor request billed once whatever event id names it (projection.same_request_once).
CREATE INDEX IF NOT EXISTS model_calls_request ON model_calls (request_id) WHERE request_id IS NOT NULL;

-- Billing's own consumer positions, written in the same transaction as its rows.
CREATE TABLE IF NOT EXISTS billing_positions (
    consumer   text PRIMARY KEY,
    stream_seq bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Running spend per budgeted tag and calendar period (UTC), kept in step with model_calls by the consumer
-- (same transaction) and recomputed by a reprice.
CREATE TABLE IF NOT EXISTS budget_spend (
    tag          text NOT NULL,
    period       text NOT NULL CHECK (period IN ('day', 'month')),
    period_start timestamptz NOT NULL,
    period_end   timestamptz NOT NULL,
    spent_usd    numeric NOT NULL DEFAULT 0,
    calls        bigint NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tag, period, period_start)
);

-- One row per budget and period whose limit was reached: the alert for that period was sent (or, for a
-- period long closed when it was found, recorded without publishing). Same transaction as the batch.
CREATE TABLE IF NOT EXISTS budget_alerts (
    budget              text NOT NULL,
    period_start        timestamptz NOT NULL,
    period_end          timestamptz NOT NULL,
    period              text NOT NULL,
    tag                 text NOT NULL,
    limit_usd           numeric NOT NULL,
    spent_usd           numeric NOT NULL,
    alert_id            uuid NOT NULL,
    crossed_by_event_id uuid,
    published           boolean NOT NULL,
    sent_at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (budget, period_start)
);

-- One row per `cos billing reprice` run that changed something.
CREATE TABLE IF NOT EXISTS billing_reprices (
    id             bigserial PRIMARY KEY,
    ran_at         timestamptz NOT NULL DEFAULT now(),
    since          timestamptz NOT NULL,
    until          timestamptz,
    genai_version  text NOT NULL,
    price_file     text,
    price_file_sha text,
    rows_examined  bigint NOT NULL,
    rows_changed   bigint NOT NULL,
    usd_before     numeric NOT NULL,
    usd_after      numeric NOT NULL
);
"""

# Who owns each session billing has seen (its session_created, or the first model call naming it): a model
# call of another profile is a profile_mismatch dead letter, never billed to the owner's session.
SCHEMA += owners_schema("billing_session_owners")

#: The profiles deleted (`commonos.runtime.tombstones`): a deleted profile's model calls are refused, while
#: what it was billed before stays in `model_calls`, an accounting record.
DELETIONS_TABLE: Final = "billing_profile_deletions"
SCHEMA += tombstones_schema(DELETIONS_TABLE)

#: Tables of this plugin, for tests and tools.
BILLING_TABLES: Final = (
    "model_calls",
    "billing_positions",
    "budget_spend",
    "budget_alerts",
    "billing_reprices",
    "billing_session_owners",
)
