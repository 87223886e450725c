"""`NatsJournal`: the Journal on JetStream, the source of truth.

Each operation is one event published with `EventPublisher` (the loop goes on only after the PubAck;
a retry reuses the event id, so JetStream drops a duplicate). A session is read back from the stream
by its owner's subjects (`cos.events.<profile>.<session>.*`) through a short-lived ordered, un-acked pull consumer
on the stream leader, so the loop always sees its own writes — never from Postgres.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Final

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, ReplayPolicy

from commonos.loop.event_journal import LOOP_SOURCE, EventJournal
from commonos.loop.journal import JournalError
from commonos.loop.profile_status import StoredEvent
from commonos.proto.cloudevents import HeaderError, decode_headers
from commonos.proto.events import Event, EventDecodeError, decode_event
from commonos.proto.ids import new_id
from commonos.proto.subjects import EVENTS_PREFIX, EVENTS_STREAM, profile_events_filter
from commonos.proto.tags import check_profile_id
from commonos.runtime.limits import message_bytes, with_stream_header
from commonos.runtime.publisher import EventPublisher, EventTooLarge, PublishError
from commonos.runtime.settings import DEFAULT_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

SOURCE = LOOP_SOURCE
#: Kept free below the server's max_payload by the limit for one message: what its event may grow by
#: once made (the digits of its seq and timestamps) and headers added on the way (tracing).
HEADROOM_BYTES: Final = 1024

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


def session_subjects(session_id: uuid.UUID, profile_id: str | None = None) -> str:
    """Every event of one session stored under `profile_id` (the session's owner), or under any profile."""
    return f"{EVENTS_PREFIX}.{check_profile_id(profile_id) if profile_id is not None else '*'}.{session_id}.*"


def memory_subjects(profile_id: str) -> str:
    """Every `memory_changed` event of one profile, across its sessions."""
    return f"{EVENTS_PREFIX}.{profile_id}.*.memory_changed"


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
    delay = 0.05
    if last_per_subject or last:
        deliver, start = (DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else DeliverPolicy.LAST), None
    else:
        deliver, start = (DeliverPolicy.BY_START_SEQUENCE, start_seq) if start_seq > 1 else (DeliverPolicy.ALL, None)
    while True:
        try:
            return await _read_once(js, filter_subject, batch, fetch_timeout_s, deliver, start)
        except _RETRYABLE_READ as exc:
            if time.monotonic() + delay >= deadline:
                raise JournalError(
                    f"could not read {filter_subject} from {EVENTS_STREAM} within {deadline_s:.0f}s: "
                    f"{type(exc).__name__}"
                ) from exc
            log.warning("reading %s failed (%s); retrying", filter_subject, type(exc).__name__)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


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


class NatsJournal(EventJournal):
    """The Journal on JetStream stream COS_EVENTS (which must exist: `commonos.runtime.nats.ensure_streams`)."""

    def __init__(
        self,
        js: JetStreamContext,
        publisher: EventPublisher | None = None,
        *,
        read_deadline_s: float = 30.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        super().__init__(max_message_bytes=max_message_bytes)
        self.js = js
        self.publisher = publisher if publisher is not None else EventPublisher(js, SOURCE)
        self.read_deadline_s = read_deadline_s

    @property
    def message_limit(self) -> int:
        """COS_MAX_MESSAGE_BYTES, or the connected server's max_payload less `HEADROOM_BYTES` if smaller."""
        return min(self.max_message_bytes, self.publisher.max_payload - HEADROOM_BYTES)

    def _limit_reason(self) -> str:
        return (
            f"the smaller of COS_MAX_MESSAGE_BYTES, {self.max_message_bytes}, and the NATS server's max_payload, "
            f"{self.publisher.max_payload}, less {HEADROOM_BYTES} bytes of headroom"
        )

    def _event_bytes(self, event: Event) -> int:
        """The publisher's own sizing: the body and headers it would send."""
        try:
            _, payload, headers = self.publisher.prepare(event)
        except EventTooLarge as exc:
            return exc.size
        return message_bytes(payload, with_stream_header(headers, EVENTS_STREAM))

    async def _store(self, event: Event) -> None:
        if self.js._nc.is_closed:
            # nats-py never reopens a closed connection: waiting out the publisher's deadline is pointless.
            raise JournalError(f"event {event.event_id} not published: the NATS connection is closed")
        try:
            await self.publisher.publish(event)
        except PublishError as exc:
            raise JournalError(str(exc)) from exc

    async def _read_session(self, session_id: uuid.UUID, profile_id: str | None) -> list[Event]:
        return await read_events(self.js, session_subjects(session_id, profile_id), deadline_s=self.read_deadline_s)

    async def _read_memory(self, profile_id: str, after: int = 0) -> list[Event]:
        return await read_events(
            self.js, memory_subjects(profile_id), deadline_s=self.read_deadline_s, start_seq=after + 1
        )

    async def _read_profiles(self, profile_id: str | None) -> list[StoredEvent]:
        return await read_stored(
            self.js, profile_events_filter(profile_id or "*"), last_per_subject=True, deadline_s=self.read_deadline_s
        )

    async def has_events(self, profile_id: str) -> bool:
        last = await read_stored(
            self.js, f"{EVENTS_PREFIX}.{check_profile_id(profile_id)}.>", last=True, deadline_s=self.read_deadline_s
        )
        return bool(last)

    async def _session_position(self, session_id: uuid.UUID, profile_id: str) -> int | None:
        created = await read_stored(
            self.js,
            f"{EVENTS_PREFIX}.{check_profile_id(profile_id)}.{session_id}.session_created",
            deadline_s=self.read_deadline_s,
        )
        return created[0].position if created else None

    async def events(self, filter_subjects: Sequence[str] = (f"{EVENTS_PREFIX}.>",)) -> list[Event]:
        """Every event on these subjects (for tools and tests), in stream order per subject filter."""
        out: list[Event] = []
        for subject in filter_subjects:
            out += await read_events(self.js, subject, deadline_s=self.read_deadline_s)
        return out
