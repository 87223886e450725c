"""Reading events back from COS_EVENTS: every event on a subject filter, in stream order, with an
ephemeral consumer that the server removes once idle (no service holds the right to delete consumers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy

from commonos.proto.cloudevents import HeaderError, decode_headers
from commonos.proto.events import Event, EventDecodeError, decode_event
from commonos.proto.ids import new_id
from commonos.proto.profiles import StoredEvent
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.errors import OperationalError
from commonos.runtime.retry import Backoff

log = logging.getLogger(__name__)


class StreamReadError(OperationalError):
    """The stream could not be read within the deadline (NATS down, no JetStream leader)."""


_RETRYABLE_READ = (
    asyncio.TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
)


async def read_events(
    js: JetStreamContext,
    filter_subject: str,
    *,
    deadline_s: float = 30.0,
    batch: int = 256,
    fetch_timeout_s: float = 5.0,
    start_seq: int = 1,
) -> list[Event]:
    """Every event on `filter_subject` now in COS_EVENTS (from stream sequence `start_seq`), in stream order.

    Retries the whole read (with a fresh consumer) through a NATS outage until `deadline_s`, then
    raises `JournalError`. Payloads that are not events are skipped with a warning.
    """
    stored = await read_stored(
        js, filter_subject, deadline_s=deadline_s, batch=batch, fetch_timeout_s=fetch_timeout_s, start_seq=start_seq
    )
    return [s.event for s in stored]


async def read_stored(
    js: JetStreamContext,
    filter_subject: str,
    *,
    last_per_subject: bool = False,
    last: bool = False,
    deadline_s: float = 30.0,
    batch: int = 256,
    fetch_timeout_s: float = 5.0,
    start_seq: int = 1,
) -> list[StoredEvent]:
    """`read_events` with each event's stream sequence and `ce-source`; with `last_per_subject`, only the
    last event of each subject matching `filter_subject`; with `last`, only the last event of all."""
    deadline = time.monotonic() + deadline_s
    backoff = Backoff(0.05, 1.0)
    if last_per_subject or last:
        deliver, start = (DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else DeliverPolicy.LAST), None
    else:
        deliver, start = (DeliverPolicy.BY_START_SEQUENCE, start_seq) if start_seq > 1 else (DeliverPolicy.ALL, None)
    while True:
        try:
            return await _read_once(js, filter_subject, batch, fetch_timeout_s, deliver, start)
        except _RETRYABLE_READ as exc:
            if time.monotonic() + backoff.current >= deadline:
                raise StreamReadError(
                    f"could not read {filter_subject} from {EVENTS_STREAM} within {deadline_s:.0f}s: "
                    f"{type(exc).__name__}"
                ) from exc
            log.warning("reading %s failed (%s); retrying", filter_subject, type(exc).__name__)
            await asyncio.sleep(backoff.next())


#: How long a session reader's consumer outlives its last fetch before the server removes it.
READER_IDLE_S = 5.0


async def _read_once(
    js: JetStreamContext,
    filter_subject: str,
    batch: int,
    fetch_timeout_s: float,
    deliver: DeliverPolicy = DeliverPolicy.ALL,
    start_seq: int | None = None,
) -> list[StoredEvent]:
    name = f"cos_loop_read_{new_id().hex}"
    config = ConsumerConfig(
        name=name,
        deliver_policy=deliver,
        opt_start_seq=start_seq,
        ack_policy=AckPolicy.NONE,
        replay_policy=ReplayPolicy.INSTANT,
        filter_subject=filter_subject,
        # The server removes it once it is idle: deleting it ourselves would need the right to delete
        # consumers, which would let the loop delete anyone's (deploy/nats/auth.conf grants it to no service).
        inactive_threshold=READER_IDLE_S,
        mem_storage=True,
        num_replicas=1,
    )
    info = await js.add_consumer(EVENTS_STREAM, config)
    events: list[StoredEvent] = []
    remaining = info.num_pending
    if not remaining:
        return events
    sub = await js.pull_subscribe_bind(name, stream=EVENTS_STREAM)
    try:
        while remaining > 0:
            for msg in await sub.fetch(min(batch, remaining), timeout=fetch_timeout_s):
                remaining = msg.metadata.num_pending
                try:
                    event = decode_event(msg.data)
                except EventDecodeError as exc:
                    log.warning("skipping a payload on %s that is not an event: %s", msg.subject, exc)
                    continue
                events.append(StoredEvent(msg.metadata.sequence.stream or 0, event, _source(msg.headers)))
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
    return events


def _source(headers: dict[str, str] | None) -> str | None:
    """Who published an event (`ce-source`), when its headers say."""
    try:
        return decode_headers(headers).get("source")
    except HeaderError:
        return None
