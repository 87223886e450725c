"""The billing process (CommonBill): a durable pull consumer of ``model_call_completed`` events.

It applies its own schema (under the schema advisory lock; it reads no core table and leaves those to the
journal-writer), binds the
durable consumer ``billing`` filtered on ``cos.events.*.*.model_call_completed``, and writes one priced
``model_calls`` row per event in batches, each in one transaction with its position in ``billing_positions``;
messages are acknowledged after the commit. Budget alerts go to ``cos.alerts.budget`` in the ``COS_ALERTS``
stream. Configuration: ``COS_PRICE_FILE`` (operator prices, TOML), ``COS_BILLING_CONFIG`` (budgets, metric
labels, TOML), and the common ``COS_*`` settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC
from typing import Final

import asyncpg
import msgspec
from nats.js import JetStreamContext

from commonos.accounting.pricing import PriceFileError, Pricer, load_price_file
from commonos.billing.budgets import BudgetAlert, BudgetTracker
from commonos.billing.config import BillingConfig, BillingConfigError, load_billing_config
from commonos.billing.metrics import BillingMetrics
from commonos.billing.projection import BillingProjection
from commonos.billing.schema import SCHEMA
from commonos.proto.cloudevents import CONTENT_TYPE, MSG_ID, SPECVERSION
from commonos.proto.subjects import (
    ALERTS_BUDGET,
    ALERTS_STREAM,
    MODEL_CALLS_FILTER,
    PROFILES_DELETED_FILTER,
    PROFILES_UPSERTED_FILTER,
    SESSIONS_CREATED_FILTER,
)
from commonos.runtime import nats as cos_nats
from commonos.runtime.consumer import BatchConsumer, ConsumerOptions, partition_suffix
from commonos.runtime.http import Health
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.limits import check_fits, server_max_payload, with_stream_header
from commonos.runtime.postgres import apply_schemas, create_pool
from commonos.runtime.service import run_consumers, service_context
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.billing")

DEFAULT_HTTP_PORT: Final = 9463
CONSUMER_NAME: Final = "billing"
ALERT_SOURCE: Final = "urn:commonos:billing"

_alert_encoder: Final = msgspec.json.Encoder(decimal_format="string")
#: What billing reads: model calls, and who owns sessions and which profiles are deleted (or re-created).
BILLING_FILTERS: Final = (
    MODEL_CALLS_FILTER,
    SESSIONS_CREATED_FILTER,
    PROFILES_DELETED_FILTER,
    PROFILES_UPSERTED_FILTER,
)


def billing_schemas() -> list[str]:
    """Billing's own schema. It reads no core table, so it never creates them: the core's tables belong to
    the journal-writer, which applies them (first, in a process that applies both, such as `cos up`)."""
    return [SCHEMA]


async def apply_billing_schemas(conn: asyncpg.Connection) -> None:
    """Apply billing's schema under the schema advisory lock."""
    await apply_schemas(conn, billing_schemas())


async def apply_schemas_when_reachable(dsn: str, health: Health, stop: asyncio.Event) -> bool:
    """Apply the schemas, waiting out a PostgreSQL that cannot be reached yet; False if stopped first."""
    backoff = 0.1
    while not stop.is_set():
        try:
            conn = await asyncpg.connect(dsn, timeout=5)
            try:
                await apply_billing_schemas(conn)
            finally:
                await conn.close()
            return True
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.InterfaceError, TimeoutError) as exc:
            health.set_ready("database", False, f"PostgreSQL unreachable: {type(exc).__name__}")
            health.beat()  # waiting for the database is this service working as designed, not a hang
            log.warning("PostgreSQL unreachable (%s); retrying", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, 5.0)
    return False


def alert_message(alert: BudgetAlert, msg_id: str, source: str = ALERT_SOURCE) -> tuple[bytes, dict[str, str]]:
    """Body (JSON, amounts as exact decimal strings) and CloudEvents headers of a budget alert. Pure."""
    headers = {
        "ce-specversion": SPECVERSION,
        "ce-id": str(alert.alert_id),
        "ce-source": source,
        "ce-type": "cos.budget_exceeded.v1",
        "ce-time": alert.occurred_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "ce-subject": alert.budget,
        "content-type": CONTENT_TYPE,
        MSG_ID: msg_id,
    }
    return _alert_encoder.encode(alert), headers


class NatsAlertSink:
    """Publishes budget alerts to JetStream and waits for the PubAck; errors propagate (the batch retries)."""

    def __init__(self, js: JetStreamContext, source: str = ALERT_SOURCE, ack_timeout_s: float = 5.0) -> None:
        self.js = js
        self.source = source
        self.ack_timeout_s = ack_timeout_s

    async def publish(self, alert: BudgetAlert, msg_id: str) -> None:
        body, headers = alert_message(alert, msg_id, self.source)
        check_fits(
            f"the budget alert of {alert.budget}",
            body,
            with_stream_header(headers, ALERTS_STREAM),
            server_max_payload(getattr(self.js, "_nc", None)),
            "shorten the budget's tag in COS_BILLING_CONFIG",
        )
        ack = await self.js.publish(
            ALERTS_BUDGET,
            body,
            timeout=self.ack_timeout_s,
            stream=ALERTS_STREAM,
            headers=headers,
        )
        log.info(
            "budget %s reached %s of %s USD for the %s from %s%s",
            alert.budget,
            alert.spent_usd,
            alert.limit_usd,
            alert.period,
            alert.period_start.date(),
            " (duplicate dropped by JetStream)" if ack.duplicate else "",
        )


def load_pricer(settings: Settings) -> Pricer:
    """The process' Pricer: genai-prices plus ``COS_PRICE_FILE`` when set (a bad file is a ConfigError)."""
    if settings.price_file is None:
        return Pricer()
    try:
        return Pricer(load_price_file(settings.price_file))
    except PriceFileError as exc:
        raise BillingConfigError(f"COS_PRICE_FILE: {exc}") from None


async def serve(
    settings: Settings,
    config: BillingConfig | None = None,
    pricer: Pricer | None = None,
    stop: asyncio.Event | None = None,
    name: str | None = None,
) -> int:
    """Run the billing consumer until ``stop`` is set (SIGTERM/SIGINT when not given).

    With ``COS_PARTITIONS``/``COS_PARTITION`` each instance bills the sessions of its partition under its own
    durable consumer (``billing-p<i>-of-<n>``); budgets stay exact across instances.
    """
    _, database_url = settings.require_urls()
    name = name or CONSUMER_NAME + partition_suffix(settings)
    config = config if config is not None else load_billing_config(settings.billing_config)
    pricer = pricer if pricer is not None else load_pricer(settings)
    async with service_context(settings, name, stop) as ctx:
        await cos_nats.ensure_stream(ctx.js, cos_nats.alerts_stream_config(settings.stream_replicas))
        if not await apply_schemas_when_reachable(database_url, ctx.health, ctx.stop):
            return 0
        pool = await create_pool(database_url, min_size=1, max_size=3)
        try:
            budgets = BudgetTracker(config.budgets, NatsAlertSink(ctx.js)) if config.budgets else None
            if budgets is not None:
                async with pool.acquire() as conn:
                    await budgets.load(conn)
            projection = BillingProjection(pricer, BillingMetrics(config.metrics), budgets, name=name)
            options = ConsumerOptions(
                batch_size=settings.batch_size,
                batch_timeout_s=settings.batch_timeout_s,
                filter_subjects=BILLING_FILTERS,
                partitions=settings.partitions,
                partition=settings.partition or 0,
            )
            consumer = BatchConsumer(ctx.js, pool, projection, ctx.health, options)
            applied = await run_consumers(ctx, [consumer], settings.drain_timeout_s)
        finally:
            await pool.close()
    log.info("%s: stopped after applying %d events", name, applied)
    return 1 if ctx.lost else 0


def main() -> int:
    async def _main() -> int:
        settings = Settings.from_env(http_port=DEFAULT_HTTP_PORT)
        setup_logging(settings.log_level)
        config = load_billing_config(settings.billing_config)
        pricer = load_pricer(settings)
        return await serve(settings, config, pricer)

    return run(_main)
