"""The billing process (CommonBill): a durable pull consumer of ``model_call_completed`` events.

It applies its own schema (under the schema advisory lock; it reads no core table and leaves those to the
journal-writer), binds the
durable consumer ``billing`` filtered on ``cos.events.*.*.model_call_completed``, and writes one priced
``model_calls`` row per event in batches, each in one transaction with its position in ``billing_positions``;
messages are acknowledged after the commit. Budget alerts go to ``cos.alerts.budget`` in the ``COS_ALERTS``
stream. Each priced call is queued in the same transaction and published by the relay, a process the service
starts beside itself, as a ``model_call_priced`` event on ``cos.costs.<profile>.priced`` (stream ``COS_COSTS``,
`commonos.billing.outbox`). Configuration: ``COS_PRICE_FILE`` (operator prices, TOML), ``COS_BILLING_CONFIG``
(budgets, metric labels, TOML), ``COS_BILLING_PRICED_EVENTS`` (on/off), and the common ``COS_*`` settings.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

import asyncpg
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.accounting.pricing import PriceFileError, Pricer, load_price_file
from commonos.billing.budgets import BudgetAlert, BudgetTracker, alert_percent
from commonos.billing.config import BillingConfig, BillingConfigError, load_billing_config
from commonos.billing.enforcement import Enforcement
from commonos.billing.metrics import BillingMetrics
from commonos.billing.outbox import RelayProcess
from commonos.billing.projection import BillingProjection
from commonos.billing.schema import SCHEMA
from commonos.billing.settings import BillingSettings
from commonos.proto.alerts import encode_alert
from commonos.proto.cloudevents import alert_headers, ce_type
from commonos.proto.subjects import ALERTS_BUDGET, ALERTS_STREAM
from commonos.runtime import nats as cos_nats
from commonos.runtime import service
from commonos.runtime.consumer import Projection, partition_suffix
from commonos.runtime.lifecycle import run, setup_logging
from commonos.runtime.limits import check_fits, server_max_payload, with_stream_header
from commonos.runtime.postgres import apply_schemas
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.billing")

DEFAULT_HTTP_PORT: Final = 9463
CONSUMER_NAME: Final = "billing"
ALERT_SOURCE: Final = "urn:commonos:billing"
ALERT_TYPE: Final = ce_type("budget_exceeded")

#: What billing reads: model calls, and who owns sessions and which profiles are deleted (or re-created).
BILLING_FILTERS: Final = BillingProjection.filter_subjects


def billing_schemas() -> list[str]:
    """Billing's own schema. It reads no core table, so it never creates them: the core's tables belong to
    the journal-writer, which applies them (first, in a process that applies both, such as `cos up`)."""
    return [SCHEMA]


async def apply_billing_schemas(conn: asyncpg.Connection) -> None:
    """Apply billing's schema under the schema advisory lock."""
    await apply_schemas(conn, billing_schemas())


def alert_message(alert: BudgetAlert, source: str = ALERT_SOURCE) -> tuple[bytes, dict[str, str]]:
    """Body (JSON, amounts as exact decimal strings) and CloudEvents headers of a budget alert, as an event's:
    ``ce-id`` = ``Nats-Msg-Id`` = the body's ``event_id``, ``ce-subject`` the budget's name. Pure."""
    return encode_alert(alert), alert_headers(alert, source)


class NatsAlertSink:
    """Publishes budget alerts to JetStream and waits for the PubAck; errors propagate (the batch retries).

    `nc` (the connection `js` was made from) tells the server's max_payload; it is taken from `js` when not given.
    """

    def __init__(
        self,
        js: JetStreamContext,
        source: str = ALERT_SOURCE,
        ack_timeout_s: float = 5.0,
        *,
        nc: Client | None = None,
    ) -> None:
        self.js = js
        self.nc = nc if nc is not None else cos_nats.client_of(js)
        self.source = source
        self.ack_timeout_s = ack_timeout_s

    async def publish(self, alert: BudgetAlert) -> None:
        body, headers = alert_message(alert, self.source)
        check_fits(
            f"the budget alert of {alert.budget}",
            body,
            with_stream_header(headers, ALERTS_STREAM),
            server_max_payload(self.nc),
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
            "budget %s reached %s of %s USD (%s %%) for the %s from %s%s",
            alert.budget,
            alert.spent_usd,
            alert.limit_usd,
            alert_percent(alert),
            alert.period,
            alert.period_start.date(),
            " (duplicate dropped by JetStream)" if ack.duplicate else "",
        )


def load_pricer(settings: BillingSettings) -> Pricer:
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
    settings.require_urls()
    name = name or CONSUMER_NAME + partition_suffix(settings)
    own = BillingSettings.from_env()
    config = config if config is not None else load_billing_config(own.billing_config)
    pricer = pricer if pricer is not None else load_pricer(own)

    async def projections(ctx: service.ServiceContext, pool: asyncpg.Pool) -> Sequence[Projection]:
        """The billing projection, its budgets loaded and its alerts published on this connection."""
        enforcement = None
        if any(b.enforce for b in config.budgets):
            enforcement = await Enforcement.open(ctx.js, config.budgets, settings.stream_replicas)
        budgets = (
            BudgetTracker(
                config.budgets,
                NatsAlertSink(ctx.js, nc=ctx.nc),
                on_committed=None if enforcement is None else enforcement.committed,
            )
            if config.budgets
            else None
        )
        if budgets is not None:
            async with pool.acquire() as conn:
                await budgets.load(conn)
                if enforcement is not None:
                    await enforcement.reconcile(conn)
        if own.priced_events:
            # Priced calls are queued by the projection's insert and published by the relay, beside it.
            ctx.start_task(RelayProcess(settings, settings.log_level).run(ctx.stop, pool), "priced-call relay")
        return [
            BillingProjection(
                pricer, BillingMetrics(config.metrics), budgets, name=name, priced_events=own.priced_events
            )
        ]

    return await service.serve(
        settings,
        name,
        billing_schemas(),
        projections,
        stop=stop,
        streams=[
            cos_nats.alerts_stream_config(settings.stream_replicas),
            cos_nats.costs_stream_config(settings.stream_replicas),
        ],
        logger=log,
    )


def main() -> int:
    async def _main() -> int:
        settings = Settings.from_env(http_port=DEFAULT_HTTP_PORT)
        setup_logging(settings.log_level)
        own = BillingSettings.from_env()
        config = load_billing_config(own.billing_config)
        pricer = load_pricer(own)
        return await serve(settings, config, pricer)

    return run(_main)
