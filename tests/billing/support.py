"""Helpers for billing's integration tests: run billing in-process, publish model calls, read alerts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import msgspec
import nats
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from commonos.accounting.pricing import Pricer
from commonos.billing.cli import register
from commonos.billing.config import BillingConfig
from commonos.billing.service import serve
from commonos.proto.cloudevents import MSG_ID, event_headers, percent_decode
from commonos.proto.events import ModelCallCompleted, encode_event
from commonos.proto.subjects import ALERTS_STREAM, EVENTS_STREAM, subject_for
from commonos.runtime.args import Parser
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import Settings
from tests.support import InProcess

MTOK = Decimal(1_000_000)
POSITIONS = "billing_positions"


def usd(*token_price_pairs: tuple[int, str | Decimal]) -> Decimal:
    """Sum of tokens x USD-per-million, exact, quantized like a stored cost (1e-10 USD)."""
    total = sum((Decimal(tokens) * Decimal(price) for tokens, price in token_price_pairs), Decimal(0))
    return (total / MTOK).quantize(Decimal("1e-10"))


def this_month_start(now: datetime | None = None) -> datetime:
    now = now or datetime.now(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def recent_start() -> datetime:
    """A start time for a few thousand events 1 ms apart that stay inside the current UTC day (so inside the
    current month too: a test of day budgets run just after midnight finds its calls in today's period)."""
    now = datetime.now(UTC)
    return max(now.replace(hour=0, minute=0, second=0, microsecond=0), now - timedelta(minutes=30))


@contextlib.asynccontextmanager
async def billing(
    nats_url: str,
    dsn: str,
    config: BillingConfig | None = None,
    pricer: Pricer | None = None,
    name: str | None = None,
    batch_size: int = 500,
    partitions: int = 1,
    partition: int | None = None,
) -> AsyncIterator[InProcess]:
    settings = Settings(
        nats_url=nats_url,
        database_url=dsn,
        http_port=0,
        batch_size=batch_size,
        partitions=partitions,
        partition=partition,
    )
    running = InProcess()
    running.task = asyncio.create_task(
        serve(settings, config or BillingConfig(), pricer or Pricer(), stop=running.stop, name=name)
    )
    try:
        yield running
    finally:
        if not running.task.done():
            await running.close()
        elif running.task.exception() is not None:
            raise running.task.exception()  # type: ignore[misc]


async def publish_copies(nats_url: str, events: Sequence[ModelCallCompleted], copy: int) -> list[PubAck]:
    """Publish each event again as a distinct stream message (its own Nats-Msg-Id), so it is delivered again."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        semaphore = asyncio.Semaphore(1000)

        async def one(event: ModelCallCompleted) -> PubAck:
            headers = event_headers(event, "urn:commonos:test")
            headers[MSG_ID] = f"{event.event_id}:{copy}"
            async with semaphore:
                return await js.publish(
                    subject_for(event), encode_event(event), stream=EVENTS_STREAM, headers=headers, timeout=10
                )

        acks: list[PubAck] = []
        for start in range(0, len(events), 5000):
            acks += await asyncio.gather(*(one(e) for e in events[start : start + 5000]))
        return acks
    finally:
        await nc.close()


async def stored_alerts(nats_url: str) -> list[dict[str, Any]]:
    """Every message of the alerts stream, decoded, with its Nats-Msg-Id and some CloudEvents headers."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(ALERTS_STREAM)
        except NotFoundError:
            return []
        out: list[dict[str, Any]] = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(ALERTS_STREAM, seq)
            body: dict[str, Any] = msgspec.json.decode(msg.data or b"")
            headers = msg.headers or {}
            body["msg_id"] = headers.get(MSG_ID)
            body["ce_id"] = headers.get("ce-id")
            body["ce_subject"] = percent_decode(headers.get("ce-subject", ""))
            body["ce_dataschema"] = headers.get("ce-dataschema")
            body["subject"] = msg.subject
            out.append(body)
        return out
    finally:
        await nc.close()


def run_cli(argv: list[str]) -> int:
    """A `cos` command of billing's, parsed and run the way `cos` does (configuration from os.environ).

    The handler runs its own event loop: call it with `asyncio.to_thread(run_cli, [...])` from a test.
    """
    parser = Parser(prog="cos")
    register(parser.add_subparsers(dest="command", parser_class=Parser))
    args = parser.parse_args(argv)
    return int(args.handler(args))
