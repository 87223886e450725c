"""A durable pull consumer that applies events to PostgreSQL in batches, exactly once.

* Each batch is written in one transaction together with the consumer's position (the stream
  sequence of its last event); deliveries at or below the position are acknowledged unapplied,
  so redelivery after a crash changes nothing.
* Messages are acknowledged only after the commit.
* An event that cannot be decoded, whose subject disagrees with its body, that the projection's
  `check` finds wrong (a `DataError`), or that PostgreSQL rejects as data (a constraint, a bad value)
  goes to the dead-letter stream with its reason; the batch is retried without it. Any other
  exception from a projection is a bug and stops the consumer: no good event is thrown away.
* A database that cannot be reached is not poison: the consumer reports not-ready, retries with
  backoff and acknowledges nothing meanwhile.
* With OpenTelemetry on (`commonos.runtime.telemetry`), a batch whose events carry a `traceparent` is
  applied inside a `process COS_EVENTS` span linked to (and, for one trace, a child of) their producers' spans.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import asyncpg
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy
from prometheus_client import Counter, Gauge, Histogram

from commonos.proto.cloudevents import HeaderError, check_event_headers
from commonos.proto.events import Event, EventDecodeError, decode_event, event_type
from commonos.proto.subjects import EVENTS_STREAM, SubjectError, parse_subject
from commonos.runtime import telemetry
from commonos.runtime.dlq import REPLAY_FOR, dead_letter
from commonos.runtime.errors import DataError, EventRejected
from commonos.runtime.fetcher import ConsumerGone, PullFetcher
from commonos.runtime.http import Health
from commonos.runtime.lanes import Lane, MergedFetcher, lane_names
from commonos.runtime.nats import ConnectionLost
from commonos.runtime.postgres import Conn
from commonos.runtime.projection import Projection, refuse_misspelt_members
from commonos.runtime.retry import Backoff, sleep_or_stop
from commonos.runtime.settings import Settings

__all__ = [
    "BatchConsumer",
    "ConsumerOptions",
    "Delivery",
    "Projection",
    "config_drift",
    "decode_delivery",
    "is_poison",
    "partition_of",
    "partition_suffix",
    "projection_of",
]

log = logging.getLogger(__name__)

EVENTS_APPLIED = Counter(
    "cos_consumer_events_total",
    "Events handled by a consumer, by type and outcome",
    ["consumer", "type", "outcome"],
)
DEAD_LETTERS = Counter(
    "cos_consumer_dead_letters_total", "Events sent to the dead-letter stream", ["consumer", "reason"]
)
BATCH_SIZE = Histogram(
    "cos_consumer_batch_size",
    "Events per applied batch",
    ["consumer"],
    buckets=(1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000),
)
BATCH_SECONDS = Histogram(
    "cos_consumer_batch_duration_seconds",
    "Time to apply and commit one batch",
    ["consumer"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
LAG = Gauge(
    "cos_consumer_lag_events",
    "Events of the consumer's subjects in the stream not yet applied (pending plus delivered, unacknowledged)",
    ["consumer"],
)
LAST_COMMIT = Gauge("cos_consumer_last_commit_timestamp_seconds", "Unix time of the last committed batch", ["consumer"])
POSITION = Gauge("cos_consumer_position", "Stream sequence of the last applied event", ["consumer"])
SKIPPED = Counter(
    "cos_consumer_redeliveries_skipped_total",
    "Deliveries at or below the committed position, acknowledged without applying them again",
    ["consumer"],
)
DB_UP = Gauge("cos_consumer_database_up", "1 while the consumer can reach PostgreSQL", ["consumer"])
DB_RETRIES = Counter(
    "cos_consumer_database_retries_total", "Batches retried because PostgreSQL was unreachable", ["consumer"]
)

#: What PostgreSQL being unreachable, restarting or cutting connections looks like (`is_poison` tells apart
#: the data errors among the PostgresErrors).
_DATABASE_DOWN: Final = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)

#: SQLSTATE classes that mean "this event's data is wrong", not "the database is unwell".
_POISON_CLASSES: Final = ("22", "23", "54")


def is_poison(exc: BaseException) -> bool:
    state = getattr(exc, "sqlstate", None)
    return isinstance(exc, asyncpg.PostgresError) and isinstance(state, str) and state[:2] in _POISON_CLASSES


@dataclass(slots=True)
class Delivery:
    msg: Msg
    stream_seq: int
    event: Event | None = None
    error: str | None = None
    #: Another partition's event, or one replayed for another consumer: acknowledged and counted in the
    #: position, not applied.
    foreign: bool = False


def decode_delivery(msg: Msg, stream_seq: int) -> Delivery:
    """Decode and cross-check one delivery; any problem becomes its `error` (the reason).

    On the hot path the subject and every CloudEvents attribute are compared with what the body implies
    as strings; the full parse runs only to explain a mismatch.
    """
    d = Delivery(msg, stream_seq)
    try:
        event = decode_event(msg.data)
    except EventDecodeError as exc:
        d.error = f"undecodable event: {exc}"
        return d
    type_name = event_type(event)
    if msg.subject != f"cos.events.{event.profile_id}.{event.session_id}.{type_name}":
        try:
            parse_subject(msg.subject)
        except SubjectError as exc:
            d.error = f"bad subject: {exc}"
        else:
            d.error = f"subject {msg.subject} does not match the event's profile, session and type"
        return d
    try:
        check_event_headers(msg.headers, event)
    except HeaderError as exc:
        d.error = f"bad headers: {exc}"
        return d
    d.event = event
    return d


#: Settings of a service's durable consumer that nothing but the service may choose, and the value
#: that stands for "off" on the server. A consumer whose settings differ was changed by someone else
#: (an operator, an intruder): `bind` recreates it rather than trust it (`headers_only` would make every
#: event arrive without its body).
_MUST_BE_OFF: Final = (
    "headers_only",
    "deliver_subject",
    "deliver_group",
    "rate_limit_bps",
    "sample_freq",
    "backoff",
    "flow_control",
    "idle_heartbeat",
    "inactive_threshold",
    "max_batch",
    "max_expires",
    "max_bytes",
    "mem_storage",
    "pause_until",
)
_MUST_EQUAL: Final = ("ack_policy", "ack_wait", "max_ack_pending", "max_deliver", "filter_subject", "filter_subjects")


def config_drift(actual: ConsumerConfig, wanted: ConsumerConfig) -> list[str]:
    """How `actual` differs from the configuration the service creates (empty: it is the service's)."""
    drift = []
    for name in _MUST_EQUAL:
        have, want = getattr(actual, name), getattr(wanted, name)
        if name == "max_deliver" and want == -1 and have in (None, -1, 0):
            continue
        if have != want and (have or want):
            drift.append(f"{name} is {have!r}, not {want!r}")
    drift += [f"{name} is {getattr(actual, name)!r}" for name in _MUST_BE_OFF if getattr(actual, name, None)]
    if actual.replay_policy not in (None, ReplayPolicy.INSTANT):
        drift.append(f"replay_policy is {actual.replay_policy!r}")
    return drift


@dataclass
class ConsumerOptions:
    batch_size: int = 1000
    #: How long a batch waits for more events after its first arrived (latency against batch size).
    batch_timeout_s: float = 0.005
    ack_wait_s: float = 60.0
    max_ack_pending: int = 20_000
    backoff_max_s: float = 5.0
    #: How often the lag gauge is refreshed from the consumer's state on the server, also while stalled.
    lag_interval_s: float = 2.0
    #: The subjects to consume; empty (the default): the projection's own `filter_subjects`.
    filter_subjects: tuple[str, ...] = ()
    #: False when rebuilding: the stream's poison events are already in the dead-letter stream.
    dead_letters: bool = True
    #: This instance applies the sessions of partition `partition` out of `partitions`.
    partitions: int = 1
    partition: int = 0


_PARTITION_SUFFIX: Final = re.compile(r"-p\d+-of-\d+$")


def projection_of(consumer: str) -> str:
    """A consumer's name without its partition suffix: a replay for `journal-writer-p1-of-4` is for the
    journal-writer's projection, whichever instance (or `cos replay`) applies that session now."""
    return _PARTITION_SUFFIX.sub("", consumer)


def partition_suffix(settings: Settings) -> str:
    """Durable consumer names carry the partition, so each partition has its own cursor and position."""
    if settings.partitions == 1:
        return ""
    return f"-p{settings.partition or 0}-of-{settings.partitions}"


def partition_of(subject: str, partitions: int) -> int:
    """The partition of an event: by its session token, so one session is always one writer's.

    A subject without a session token (poison) belongs to partition 0, so exactly one writer
    dead-letters it.
    """
    if partitions == 1:
        return 0
    tokens = subject.split(".")
    if len(tokens) != 5:
        return 0
    return zlib.crc32(tokens[3].encode()) % partitions


@dataclass
class BatchConsumer:
    js: JetStreamContext
    pool: asyncpg.Pool
    projection: Projection
    health: Health
    options: ConsumerOptions = field(default_factory=ConsumerOptions)
    position: int = 0
    applied: int = 0
    rejected: int = 0
    #: Consumer sequence of the last delivery taken, by durable consumer (set by `bind`); the next one of
    #: each must follow it, or deliveries were lost in flight.
    last_delivery: dict[str, int] = field(default_factory=dict)
    #: Set when deliveries were lost in flight: the cursor must restart from the committed position.
    gap: bool = False
    #: The NATS connection `js` came from (the fetcher pulls on it, and its state says whether it is lost);
    #: optional for a consumer that is only configured or fed batches (`process`), required by `run`.
    nc: Client | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        # A projection's own attributes (set in __init__) cannot misspell a member either.
        refuse_misspelt_members(type(self.projection).__name__, vars(self.projection))
        if not self.options.filter_subjects:
            self.options = replace(self.options, filter_subjects=self.projection.filter_subjects)
        #: One durable consumer per filter subject, merged in stream order when there are several
        #: (`commonos.runtime.lanes`: nats-server serves a consumer with several filters very slowly).
        self.lanes = [
            Lane(durable, subject)
            for durable, subject in zip(
                lane_names(self.name, self.options.filter_subjects), self.options.filter_subjects, strict=True
            )
        ]
        # Its counters at 0 from the start: an alert on them then tells "none" from "not scraped".
        SKIPPED.labels(self.name)
        DB_RETRIES.labels(self.name)

    @property
    def name(self) -> str:
        return self.projection.name

    @property
    def client(self) -> Client:
        """The NATS connection `js` came from: `run` needs it (nats-py offers no public way to get it from `js`)."""
        if self.nc is None:
            raise TypeError(f"{self.name}: BatchConsumer needs its NATS connection to run: pass nc=")
        return self.nc

    def consumer_config(self, lane: Lane | None = None) -> ConsumerConfig:
        """The configuration of a lane's durable consumer (the first lane's when none is named)."""
        lane = lane if lane is not None else self.lanes[0]
        return ConsumerConfig(
            durable_name=lane.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.options.ack_wait_s,
            max_ack_pending=self.options.max_ack_pending,
            max_deliver=-1,
            filter_subject=lane.filter_subject,
        )

    async def bind(self) -> None:
        """Bind to the durable consumers (one per lane), restarting their cursors from the committed position
        if needed.

        A writer that died held deliveries it never committed; JetStream would redeliver them only
        after `ack_wait`, behind newer events, which breaks per-session order. The position in
        PostgreSQL is the truth, so a consumer that has delivered past it is recreated to start
        right after it.
        """
        for lane in self.lanes:
            await self._bind_lane(lane)
        self.gap = False

    async def _bind_lane(self, lane: Lane) -> None:
        durable = lane.durable
        try:
            info = await self.js.consumer_info(EVENTS_STREAM, durable)
        except nats.js.errors.NotFoundError:
            info = None
        wanted = self.consumer_config(lane)
        drift = config_drift(info.config, wanted) if info is not None else []
        if drift:
            log.warning(
                "%s: the consumer's configuration is not this service's (%s); recreating it from %d",
                durable,
                "; ".join(drift),
                self.position + 1,
            )
            await self.js.delete_consumer(EVENTS_STREAM, durable)
            info = None
        if info is not None and info.delivered.stream_seq > self.position:
            log.info(
                "%s: consumer delivered up to %d but %d is committed; restarting it from %d",
                durable,
                info.delivered.stream_seq,
                self.position,
                self.position + 1,
            )
            await self.js.delete_consumer(EVENTS_STREAM, durable)
            info = None
        if info is None:
            config = self.consumer_config(lane)
            if self.position > 0:
                config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
                config.opt_start_seq = self.position + 1
            await self.js.add_consumer(EVENTS_STREAM, config)
        # Deliveries are counted from here: the first one taken must be the next of this consumer,
        # or a batch starting after a hole would carry the position past events never applied.
        lane.delivered = self.last_delivery[durable] = info.delivered.consumer_seq if info is not None else 0

    async def load_position(self) -> int:
        async with self.pool.acquire() as conn:
            row = await conn.fetchval(
                f"SELECT stream_seq FROM {self.projection.position_table} WHERE consumer = $1", self.name
            )
        self.position = int(row or 0)
        POSITION.labels(self.name).set(self.position)
        return self.position

    async def run(self, stop: asyncio.Event) -> None:
        await self._wait_for_database(stop)
        if stop.is_set():
            return
        await self._bind_until_bound(stop)
        if stop.is_set():
            return
        fetcher: PullFetcher | MergedFetcher
        if len(self.lanes) == 1:
            fetcher = await PullFetcher(self.client, EVENTS_STREAM, self.name, batch=self.options.batch_size).start()
        else:
            fetcher = await MergedFetcher(self.client, self.js, self.lanes, batch=self.options.batch_size).start()
        self.health.set_ready("starting", True)
        lag = asyncio.create_task(self._watch_lag(stop), name=f"{self.name}-lag")
        backoff = self._backoff()
        try:
            while not stop.is_set():
                self.health.beat()
                try:
                    msgs = await fetcher.fetch(timeout_s=1.0, linger_s=self.options.batch_timeout_s)
                except ConsumerGone as exc:
                    log.warning("%s: %s; binding again", self.name, exc)
                    fetcher.reset()  # what it holds may come from before the change, with holes
                    await self._bind_until_bound(stop)
                    continue
                except (nats.errors.Error, nats.js.errors.Error, OSError) as exc:
                    self._check_connection()
                    self.health.set_ready("nats", False, f"fetch failed: {type(exc).__name__}")
                    await sleep_or_stop(stop, backoff.next())
                    continue
                self.health.set_ready("nats", True)
                backoff.reset()
                if not msgs:
                    continue
                if not await self.process(msgs, stop):
                    return  # stopping with the batch abandoned: nothing of it was acked
                if self.gap:
                    await self._restart_cursor(fetcher, stop)
        finally:
            lag.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lag
            await fetcher.stop()

    def _backoff(self) -> Backoff:
        return Backoff(0.1, self.options.backoff_max_s)

    @staticmethod
    async def _pause(stop: asyncio.Event | None, backoff: Backoff) -> None:
        """The next pause of `backoff`, cut short by `stop` when there is one."""
        if stop is None:
            await asyncio.sleep(backoff.next())
        else:
            await sleep_or_stop(stop, backoff.next())

    def _check_connection(self) -> None:
        """Raise ConnectionLost once nats-py has closed the connection for good (it will not reconnect)."""
        nc = self.nc
        if nc is not None and nc.is_closed:
            raise ConnectionLost(f"{self.name}: NATS connection closed: {nc.last_error or 'by the server'}")

    async def _watch_lag(self, stop: asyncio.Event) -> None:
        """Keep the lag gauge true from the server's view of the consumer, also while a batch is stuck."""
        while not stop.is_set():
            try:
                lag = 0
                for lane in self.lanes:
                    info = await self.js.consumer_info(EVENTS_STREAM, lane.durable, timeout=2.0)
                    lag += info.num_pending + info.num_ack_pending
                LAG.labels(self.name).set(lag)
            except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as exc:
                log.debug("%s: lag not refreshed (%s)", self.name, type(exc).__name__)
            await sleep_or_stop(stop, self.options.lag_interval_s)

    async def _restart_cursor(self, fetcher: PullFetcher | MergedFetcher, stop: asyncio.Event) -> None:
        """Recreate the consumers right after the committed position and forget what was buffered."""
        for lane in self.lanes:
            with contextlib.suppress(nats.js.errors.NotFoundError, nats.errors.Error):
                await self.js.delete_consumer(EVENTS_STREAM, lane.durable)
        await self._bind_until_bound(stop)
        fetcher.reset()

    async def _bind_until_bound(self, stop: asyncio.Event) -> None:
        """Bind, riding out a NATS outage or a JetStream leader election."""
        backoff = self._backoff()
        while not stop.is_set():
            try:
                await self.bind()
                self.health.set_ready("nats", True)
                return
            except (nats.errors.Error, nats.js.errors.Error, OSError, TimeoutError) as exc:
                self.health.set_ready("nats", False, f"cannot bind the consumer: {type(exc).__name__}")
                log.warning("%s: cannot bind the consumer (%s); retrying", self.name, exc)
                await sleep_or_stop(stop, backoff.next())

    async def _wait_for_database(self, stop: asyncio.Event) -> None:
        backoff = self._backoff()
        while not stop.is_set():
            try:
                await self.load_position()
                DB_UP.labels(self.name).set(1)
                self.health.set_ready("database", True)
                return
            except _DATABASE_DOWN as exc:
                if is_poison(exc):
                    raise
                DB_UP.labels(self.name).set(0)
                self.health.set_ready("database", False, f"PostgreSQL unreachable: {type(exc).__name__}")
                self.health.beat()  # waiting out an outage is not a hang: liveness must not restart us
                log.warning("%s: PostgreSQL unreachable (%s); retrying", self.name, exc)
                await sleep_or_stop(stop, backoff.next())

    def _contiguous(self, msgs: Sequence[Msg]) -> Sequence[Msg]:
        """The deliveries up to the first one lost in flight (a leader change, a reconnect).

        JetStream counts every delivery of a consumer. Lost ones would come back only after `ack_wait`,
        behind newer events, which would break per-session order (and the position would then skip
        them), so the batch stops short and the cursor is restarted from the committed position.
        """
        for i, msg in enumerate(msgs):
            meta = msg.metadata
            delivery = meta.sequence.consumer or 0
            last = self.last_delivery.get(meta.consumer, 0)
            if delivery != last + 1:
                log.warning(
                    "%s: deliveries %d..%d lost in flight; restarting from %d",
                    meta.consumer,
                    last + 1,
                    delivery - 1,
                    self.position + 1,
                )
                self.gap = True
                return msgs[:i]
            self.last_delivery[meta.consumer] = delivery
        return msgs

    async def process(self, msgs: Sequence[Msg], stop: asyncio.Event | None = None) -> bool:
        """Apply one fetched batch; True if it was committed and acknowledged."""
        started = time.perf_counter()
        deliveries: list[Delivery] = []
        skipped: list[Msg] = []
        partitions, mine = self.options.partitions, self.options.partition
        msgs = self._contiguous(msgs)
        previous = 0
        for msg in msgs:
            meta = msg.metadata
            seq = meta.sequence.stream
            if seq <= self.position or seq == previous:
                # Applied already, or the same event again from a second lane whose filter it also matches.
                skipped.append(msg)
                continue
            previous = seq
            if partitions > 1 and partition_of(msg.subject, partitions) != mine:
                deliveries.append(Delivery(msg, seq, foreign=True))
                continue
            headers = msg.headers
            target = headers.get(REPLAY_FOR) if headers else None
            if target is not None and projection_of(target) != projection_of(self.name):
                deliveries.append(Delivery(msg, seq, foreign=True))  # replayed for another consumer
                continue
            d = decode_delivery(msg, seq)
            if d.event is not None:
                try:
                    self.projection.check(d.event)
                except DataError as exc:  # anything else is the projection's bug: it stops the consumer
                    d.error = f"invariant: {exc}"
            deliveries.append(d)
        if msgs:
            # Until this batch commits, it is lag too.
            LAG.labels(self.name).set(msgs[-1].metadata.num_pending + len(msgs))
        if deliveries:
            with self._batch_span(deliveries):
                if not await self._commit_until_done(deliveries, stop):
                    return False
        for d in deliveries:
            await _quietly(d.msg.ack())
        for msg in skipped:
            await _quietly(msg.ack())
        if msgs:
            LAG.labels(self.name).set(msgs[-1].metadata.num_pending)
        if skipped:
            SKIPPED.labels(self.name).inc(len(skipped))
        if deliveries:
            BATCH_SIZE.labels(self.name).observe(len(deliveries))
            BATCH_SECONDS.labels(self.name).observe(time.perf_counter() - started)
            LAST_COMMIT.labels(self.name).set(time.time())
        return True

    def _batch_span(self, deliveries: list[Delivery]) -> contextlib.AbstractContextManager[object]:
        """With OpenTelemetry on, the batch's span, joining the traces its events were published in."""
        if telemetry.active() is None:
            return contextlib.nullcontext()
        return telemetry.consumer_batch_span(
            self.name, EVENTS_STREAM, [d.msg.headers for d in deliveries if not d.foreign]
        )

    async def _commit_until_done(self, deliveries: list[Delivery], stop: asyncio.Event | None) -> bool:
        """Commit a batch, riding out PostgreSQL and dead-letter outages; False if stopped first (nothing acked)."""
        backoff = self._backoff()
        while True:
            try:
                await self._commit(deliveries)
                break
            except (*_DATABASE_DOWN, TimeoutError) as exc:
                if is_poison(exc):
                    raise
                # A connection cut in the middle of a statement can be left unusable ("another operation
                # is in progress"): the retry starts on fresh connections.
                await self.pool.expire_connections()
                DB_UP.labels(self.name).set(0)
                DB_RETRIES.labels(self.name).inc()
                self.health.beat()
                self.health.set_ready("database", False, f"PostgreSQL unreachable: {type(exc).__name__}")
                log.warning("%s: batch not committed (%s); retrying", self.name, exc)
                if stop is not None and stop.is_set():
                    return False  # abandon: nothing was acked, the events come back
                for d in deliveries:
                    await _quietly(d.msg.in_progress())
                await self._pause(stop, backoff)
            except (nats.errors.Error, nats.js.errors.Error) as exc:
                # The dead-letter stream did not acknowledge: roll back and try the batch again.
                self._check_connection()
                self.health.set_ready("nats", False, f"dead-lettering failed: {type(exc).__name__}")
                log.warning("%s: dead-lettering failed (%s); retrying", self.name, exc)
                if stop is not None and stop.is_set():
                    return False
                await self._pause(stop, backoff)
        DB_UP.labels(self.name).set(1)
        self.health.set_ready("database", True)
        self.health.set_ready("nats", True)
        return True

    async def _commit(self, deliveries: list[Delivery]) -> None:
        good = [d for d in deliveries if d.event is not None and d.error is None and not d.foreign]
        self.projection.rolled_back()  # whatever an earlier, failed attempt at this batch staged is void
        async with self.pool.acquire() as conn:
            await self.projection.prepare(conn, [d.event for d in good if d.event is not None])
            try:
                async with conn.transaction():
                    await self.projection.apply(conn, [d.event for d in good if d.event is not None])
                    await self._finish(conn, deliveries)
            except (asyncpg.PostgresError, EventRejected) as exc:
                if not isinstance(exc, EventRejected) and not is_poison(exc):
                    raise
                # Some event of the batch is rejected: apply them one by one to find which.
                self.projection.rolled_back()
                async with conn.transaction():
                    await self._isolate(conn, good)
                    await self._finish(conn, deliveries)
        self.position = deliveries[-1].stream_seq
        POSITION.labels(self.name).set(self.position)
        await self._after_commit([d.event for d in good if d.event is not None and d.error is None])
        self.projection.committed()
        for d in deliveries:
            if d.foreign:
                continue
            kind = event_type(d.event) if d.event is not None else "unknown"
            if d.error is None:
                EVENTS_APPLIED.labels(self.name, kind, "applied").inc()
            else:
                EVENTS_APPLIED.labels(self.name, kind, "dead_lettered").inc()
                DEAD_LETTERS.labels(self.name, d.error.split(":", 1)[0][:40]).inc()
        self.applied += sum(1 for d in good if d.error is None)
        self.rejected += sum(1 for d in deliveries if d.error is not None)

    async def _after_commit(self, events: list[Event]) -> None:
        """The projection's `after_commit`: best effort, never undoing or repeating the batch."""
        if not events:
            return
        try:
            async with self.pool.acquire() as conn:
                await self.projection.after_commit(conn, events)
        except _DATABASE_DOWN as exc:
            log.warning("%s: after-commit step skipped (%s)", self.name, exc)

    async def _finish(self, conn: Conn, deliveries: list[Delivery]) -> None:
        """Inside the batch's transaction: dead-letter its rejected events, record the position."""
        poison = [d for d in deliveries if d.error is not None]
        if self.options.dead_letters:
            for d in poison:
                await dead_letter(self.js, d.msg, d.error or "", self.name, d.stream_seq, nc=self.nc)
        last = deliveries[-1].stream_seq
        await conn.execute(
            f"INSERT INTO {self.projection.position_table} (consumer, stream_seq, updated_at) "
            "VALUES ($1, $2, now()) ON CONFLICT (consumer) DO UPDATE "
            "SET stream_seq = EXCLUDED.stream_seq, updated_at = now()",
            self.name,
            last,
        )

    async def _isolate(self, conn: Conn, good: list[Delivery]) -> None:
        """Apply events one at a time, each under a savepoint, to find the ones PostgreSQL rejects."""
        for d in good:
            assert d.event is not None
            try:
                async with conn.transaction():
                    await self.projection.apply(conn, [d.event])
            except EventRejected as exc:
                d.error = f"{exc.reason}: {exc}"
            except asyncpg.PostgresError as exc:
                if not is_poison(exc):
                    raise
                d.error = f"rejected by PostgreSQL: {type(exc).__name__}: {exc}"


async def _quietly(awaitable: object) -> None:
    try:
        await awaitable  # type: ignore[misc]
    except (nats.errors.Error, OSError) as exc:
        log.debug("ack not sent (%s): the event will be redelivered and skipped", exc)
