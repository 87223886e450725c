"""Priced calls as events: billing's outbox and the relay that publishes it to `COS_COSTS`.

Every transaction that prices a call writes, with the call's row, one `billing_outbox` row: the consumer's
insert (:data:`INSERT_PRICED_MODEL_CALLS`, one statement that inserts the calls and queues the ones it really
added, revision 0) and a reprice (:data:`QUEUE_REPRICED`, the calls it changed, revision = the run's id in
`billing_reprices`). A row and its queued event commit together or not at all, so they never disagree.

The relay (:class:`PricedRelay`) takes the oldest queued rows (`FOR UPDATE SKIP LOCKED`: several relays share
the work), joins each to its call for what never changes (profile, session, provider, model, tags, time),
publishes one `model_call_priced` event per row (`commonos.proto.costs`), waits for every PubAck, and only
then deletes the rows, in the same transaction. A crash between the publish and the delete publishes those
rows again with the same `event_id` = `Nats-Msg-Id`: JetStream drops them within the stream's duplicate
window, a subscriber counting each `event_id` once drops them after it. A row whose event is larger than the
server's max_payload (stored when NATS took more than it does now) is held, not published, so that it cannot
stall the rows after it: `billing_outbox.held` says why, and an operator who has raised max_payload releases
it (``UPDATE billing_outbox SET held = NULL WHERE held IS NOT NULL``).

The billing service runs the relay in a process of its own (:class:`RelayProcess`, so that publishing takes no
time from pricing), restarts it when it dies (`cos_billing_relay_restarts_total`), and reports the queue
(`cos_billing_priced_queued`, `cos_billing_priced_oldest_seconds`, `cos_billing_priced_held`).
``COS_BILLING_PRICED_EVENTS=off`` turns the whole feature off: nothing is queued and no relay runs (`cos billing
reprice` reads the same setting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

import asyncpg
import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from prometheus_client import Counter, Gauge

from commonos.billing.days import INSERT_MODEL_CALLS
from commonos.proto.cloudevents import message_headers
from commonos.proto.costs import ModelCallPriced, cost_delta, encode_priced, priced_event_id
from commonos.proto.schemas import COSTS, schema_id
from commonos.proto.subjects import COSTS_STREAM, costs_subject
from commonos.proto.text import unescape_nul
from commonos.runtime import nats as cos_nats
from commonos.runtime.errors import OperationalError
from commonos.runtime.limits import message_bytes, server_max_payload, with_stream_header
from commonos.runtime.postgres import create_pool
from commonos.runtime.retry import sleep_or_stop
from commonos.runtime.settings import Settings

log = logging.getLogger("commonos.billing.relay")

__all__ = [
    "INSERT_PRICED_MODEL_CALLS",
    "QUEUE_REPRICED",
    "PricedRelay",
    "RelayProcess",
    "priced_message",
]

#: The relay's CPU priority below billing's (`os.nice`): the lowest, so that pricing goes first when both want the
#: CPU (docs/performance.md, "Billing with priced-call events", has the runs with and without it).
_RELAY_NICENESS: Final = 19

#: The relay's source, `ce-source` of every priced-call event.
RELAY_SOURCE: Final = "urn:commonos:billing"
_CE_TYPE: Final = "cos.model_call_priced.v1"
_DATASCHEMA: Final = schema_id(COSTS, "model_call_priced")

#: The consumer's insert (`days.INSERT_MODEL_CALLS`) with the calls it added queued, in the same statement.
INSERT_PRICED_MODEL_CALLS: Final = f"""
WITH added AS ({INSERT_MODEL_CALLS}, created_at, cost_usd, cost_status, price_source, price_version),
queued AS (
    INSERT INTO billing_outbox (call_id, created_at, revision, cost_usd, previous_cost_usd, cost_status,
                                price_source, price_version)
    SELECT event_id, created_at, 0, cost_usd, NULL, cost_status, price_source, price_version FROM added
)
SELECT event_id FROM added
"""

#: A reprice's changed calls, queued under its run's id: $1 the run, then one array per column.
QUEUE_REPRICED: Final = """
INSERT INTO billing_outbox (call_id, created_at, revision, cost_usd, previous_cost_usd, cost_status,
                            price_source, price_version)
SELECT u.id, u.at, $1, u.cost, u.previous, u.status, u.source, u.version
FROM unnest($2::uuid[], $3::timestamptz[], $4::numeric[], $5::numeric[], $6::text[], $7::text[], $8::text[])
     AS u(id, at, cost, previous, status, source, version)
"""

#: The oldest queued rows no other relay holds, each with its call (absent when the call was deleted since).
_CLAIM: Final = """
SELECT o.id, o.call_id, o.revision, o.cost_usd, o.previous_cost_usd, o.cost_status, o.price_source,
       o.price_version, o.queued_at, o.created_at, m.profile_id, m.session_id, m.turn_id, m.provider, m.model,
       m.tags
FROM billing_outbox o
LEFT JOIN model_calls m ON m.event_id = o.call_id AND m.created_at = o.created_at
WHERE o.held IS NULL
ORDER BY o.id
LIMIT $1
FOR UPDATE OF o SKIP LOCKED
"""

#: More than a priced event's CloudEvents headers can take (`priced_message`: fixed names, ids, a time).
_HEADERS_BOUND: Final = 4096

_DELETE: Final = "DELETE FROM billing_outbox WHERE id = ANY($1::bigint[])"

_HOLD: Final = """
UPDATE billing_outbox SET held = u.reason
FROM unnest($1::bigint[], $2::text[]) AS u(id, reason)
WHERE billing_outbox.id = u.id
"""

_QUEUE: Final = """
SELECT count(*) FILTER (WHERE held IS NULL) AS queued, min(queued_at) FILTER (WHERE held IS NULL) AS oldest,
       count(*) FILTER (WHERE held IS NOT NULL) AS held
FROM billing_outbox
"""

QUEUED: Final = Gauge("cos_billing_priced_queued", "Priced-call events queued in billing_outbox, not yet published")
OLDEST: Final = Gauge(
    "cos_billing_priced_oldest_seconds",
    "Age of the oldest priced-call event not yet published (0 when none is queued)",
)
HELD: Final = Gauge(
    "cos_billing_priced_held",
    "Priced-call events held in billing_outbox because they are larger than the server's max_payload",
)
RESTARTS: Final = Counter("cos_billing_relay_restarts", "Times billing restarted its priced-call relay after it died")


def priced_event(row: asyncpg.Record | dict[str, Any]) -> ModelCallPriced:
    """The event of one queued row joined to its call."""
    cost: Decimal | None = row["cost_usd"]
    previous: Decimal | None = row["previous_cost_usd"]
    return ModelCallPriced(
        event_id=priced_event_id(row["call_id"], row["revision"]),
        occurred_at=row["queued_at"],
        call_id=row["call_id"],
        revision=row["revision"],
        profile_id=row["profile_id"],
        session_id=row["session_id"],
        turn_id=row["turn_id"],
        provider=unescape_nul(row["provider"]),
        model=unescape_nul(row["model"]),
        tags=tuple(row["tags"]),
        called_at=row["created_at"],
        cost_usd=cost,
        previous_cost_usd=previous,
        cost_delta_usd=cost_delta(cost, previous),
        cost_status=row["cost_status"],
        price_source=row["price_source"],
        price_version=row["price_version"],
    )


def priced_message(event: ModelCallPriced, source: str = RELAY_SOURCE) -> tuple[str, bytes, dict[str, str]]:
    """Subject, body and CloudEvents headers of a priced-call event (`ce-subject` = the call's id). Pure."""
    headers = message_headers(
        id=str(event.event_id),
        type=_CE_TYPE,
        source=source,
        time=event.occurred_at,
        subject=str(event.call_id),
        dataschema=_DATASCHEMA,
    )
    return costs_subject(event.profile_id), encode_priced(event), headers


class PricedRelay:
    """Publishes the queued priced calls, oldest first, `batch` rows per transaction."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        js: JetStreamContext,
        *,
        batch: int = 1000,
        idle_s: float = 0.02,
        ack_timeout_s: float = 10.0,
        source: str = RELAY_SOURCE,
    ) -> None:
        self.pool = pool
        self.js = js
        self.batch = batch
        self.idle_s = idle_s
        self.ack_timeout_s = ack_timeout_s
        self.source = source
        self.nc = cos_nats.client_of(js)
        self.published = 0
        self.held = 0

    async def relay_once(self) -> int:
        """Publish one batch of queued rows and delete them; the number of rows done (0: the queue is empty)."""
        async with self.pool.acquire() as conn, conn.transaction():
            # The delete need not wait for the disk: lost in a PostgreSQL crash, its rows are published again
            # under the same ids (dropped by JetStream), and billing's own commits get the WAL's flushes.
            await conn.execute("SET LOCAL synchronous_commit = off")
            rows = await conn.fetch(_CLAIM, self.batch)
            if not rows:
                return 0
            futures: list[asyncio.Future[Any]] = []
            held: list[tuple[int, str]] = []
            limit = server_max_payload(self.nc)  # the server's, as of the last (re)connection
            for row in rows:
                if row["profile_id"] is None:
                    # Its call was deleted before it could be published (retention, an operator): nothing to say.
                    log.warning(
                        "priced call %s (revision %s) is no longer stored: not published",
                        row["call_id"],
                        row["revision"],
                    )
                    continue
                subject, body, headers = priced_message(priced_event(row), self.source)
                # Its headers are a few hundred bytes (ids, a time, fixed names): counted only near the limit.
                if (
                    len(body) > limit - _HEADERS_BOUND
                    and (size := message_bytes(body, with_stream_header(headers, COSTS_STREAM))) > limit
                ):
                    why = f"its event is {size} bytes, over the server's max_payload of {limit}"
                    log.error(
                        "priced call %s (revision %s) held, not published: %s; raise max_payload, then release "
                        "it: UPDATE billing_outbox SET held = NULL WHERE held IS NOT NULL",
                        row["call_id"],
                        row["revision"],
                        why,
                    )
                    held.append((row["id"], why))
                    continue
                futures.append(await self.js.publish_async(subject, body, stream=COSTS_STREAM, headers=headers))
            if futures:
                done, pending = await asyncio.wait(futures, timeout=self.ack_timeout_s)
                for future in pending:
                    future.cancel()
                failed = [f for f in done if f.exception() is not None]
                if pending or failed:
                    reason = failed[0].exception() if failed else f"no PubAck within {self.ack_timeout_s} s"
                    # The rows stay queued (this transaction rolls back); the next round publishes them again
                    # with the same ids, and JetStream drops the ones it has.
                    raise RelayError(
                        f"{len(pending) + len(failed)} of {len(futures)} priced calls unpublished: {reason}"
                    )
            if held:
                await conn.execute(_HOLD, [i for i, _ in held], [r for _, r in held])
            held_ids = {i for i, _ in held}
            await conn.execute(_DELETE, [r["id"] for r in rows if r["id"] not in held_ids])
        self.published += len(futures)
        self.held += len(held)
        return len(rows)

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until `stop`; a failed round is retried after a pause (nothing is lost: the rows stay queued)."""
        pause = self.idle_s
        while not stop.is_set():
            try:
                done = await self.relay_once()
            except (RelayError, nats.errors.Error, nats.js.errors.Error, asyncpg.PostgresError, OSError) as exc:
                log.warning("priced calls: %s; retrying", exc)
                pause = min(max(pause * 2, 0.2), 5.0)
                await sleep_or_stop(stop, pause)
                continue
            pause = self.idle_s
            if done < self.batch:
                await sleep_or_stop(stop, self.idle_s)


class RelayError(OperationalError):
    """A batch the relay could not publish whole (it stays queued)."""


async def queue_state(conn: asyncpg.Connection | asyncpg.Pool) -> tuple[int, float, int]:
    """How many priced calls wait to be published, the age of the oldest in seconds (0 when none), and how many
    are held (too large to publish)."""
    record = await conn.fetchrow(_QUEUE)
    assert record is not None
    oldest: datetime | None = record["oldest"]
    age = 0.0 if oldest is None else max(0.0, (datetime.now(UTC) - oldest).total_seconds())
    return int(record["queued"]), age, int(record["held"])


async def _relay_main(settings: Settings, parent: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def orphaned() -> None:
        # The billing process that started this one is gone (SIGKILLed): stop too, a new one starts its own.
        while not stop.is_set():
            if os.getppid() != parent:
                log.warning("billing (pid %s) is gone: the relay stops", parent)
                stop.set()
            await sleep_or_stop(stop, 0.5)

    watch = asyncio.create_task(orphaned())
    _, database_url = settings.require_urls()
    nc = await cos_nats.connect(settings, "billing-relay")
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        await PricedRelay(pool, nc.jetstream()).run(stop)
    finally:
        watch.cancel()
        await pool.close()
        with contextlib.suppress(Exception):
            await nc.drain()


def _relay_process(settings: Settings, parent: int, log_level: str) -> None:
    """The relay process' body (spawned: nothing is inherited but its arguments)."""
    from commonos.runtime.lifecycle import setup_logging

    setup_logging(log_level)
    # Pricing comes first when both want the CPU: the relay takes what billing leaves (it catches up after a
    # burst; `cos_billing_priced_oldest_seconds` says by how much it lags).
    os.nice(_RELAY_NICENESS)
    asyncio.run(_relay_main(settings, parent))


class RelayProcess:
    """The relay in a process of its own, started with billing and restarted when it dies; the queue's gauges."""

    def __init__(
        self, settings: Settings, log_level: str = "INFO", *, check_s: float = 1.0, gauges_s: float = 5.0
    ) -> None:
        self.settings = settings
        self.log_level = log_level
        self.check_s = check_s
        #: How often the queue's gauges are read (a count over billing_outbox: cheap while the relay keeps up,
        #: a scan of the backlog when it does not, so not every second).
        self.gauges_s = gauges_s
        self.process: multiprocessing.process.BaseProcess | None = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(
            target=_relay_process,
            args=(self.settings, os.getpid(), self.log_level),
            name="billing-relay",
            daemon=True,
        )
        self.process.start()
        log.info("priced-call relay started (pid %s)", self.process.pid)

    async def run(self, stop: asyncio.Event, pool: asyncpg.Pool | None = None) -> None:
        """Keep the relay running until `stop`; then stop it (SIGTERM, its batch in flight finishes)."""
        self._start()
        last_start = time.monotonic()
        last_gauges = -self.gauges_s
        try:
            while not await sleep_or_stop(stop, self.check_s):
                if pool is not None and time.monotonic() - last_gauges >= self.gauges_s:
                    last_gauges = time.monotonic()
                    with contextlib.suppress(asyncpg.PostgresError, OSError):
                        queued, age, held = await queue_state(pool)
                        QUEUED.set(queued)
                        OLDEST.set(age)
                        HELD.set(held)
                assert self.process is not None
                if not self.process.is_alive():
                    log.error("priced-call relay exited (code %s): starting it again", self.process.exitcode)
                    RESTARTS.inc()
                    if time.monotonic() - last_start < 5.0:
                        await sleep_or_stop(stop, 5.0)
                    self._start()
                    last_start = time.monotonic()
        finally:
            await self.stop()

    async def stop(self, timeout_s: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or not process.is_alive():
            return
        process.terminate()
        await asyncio.get_running_loop().run_in_executor(None, process.join, timeout_s)
        if process.is_alive():
            log.error("priced-call relay did not stop within %s s: killed", timeout_s)
            process.kill()
