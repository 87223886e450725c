"""`NatsJournal`: the Journal on JetStream, the source of truth.

Each operation is one event published with `EventPublisher` (the loop goes on only after the PubAck;
a retry reuses the event id, so JetStream drops a duplicate). A session is read back from the stream
by its owner's subjects (`cos.events.<profile>.<session>.*`) through a short-lived ordered, un-acked pull consumer
on the stream leader, so the loop always sees its own writes — never from Postgres.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any, Final

from nats.js import JetStreamContext

from commonos.loop.event_journal import LOOP_SOURCE, EventJournal
from commonos.loop.journal import JournalError
from commonos.proto.events import Event
from commonos.proto.profiles import StoredEvent
from commonos.proto.subjects import EVENTS_PREFIX, EVENTS_STREAM, profile_events_filter
from commonos.proto.tags import check_profile_id
from commonos.runtime import reading
from commonos.runtime.limits import message_bytes, with_stream_header
from commonos.runtime.publisher import EventPublisher, EventTooLarge, Prepared, PublishError
from commonos.runtime.settings import DEFAULT_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

SOURCE = LOOP_SOURCE
#: Kept free below the server's max_payload by the limit for one message: what its event may grow by
#: once made (the digits of its seq and timestamps) and headers added on the way (tracing).
HEADROOM_BYTES: Final = 1024


def session_subjects(session_id: uuid.UUID, profile_id: str | None = None) -> str:
    """Every event of one session stored under `profile_id` (the session's owner), or under any profile."""
    return f"{EVENTS_PREFIX}.{check_profile_id(profile_id) if profile_id is not None else '*'}.{session_id}.*"


def memory_subjects(profile_id: str) -> str:
    """Every `memory_changed` event of one profile, across its sessions."""
    return f"{EVENTS_PREFIX}.{profile_id}.*.memory_changed"


async def read_events(js: JetStreamContext, filter_subject: str, **options: Any) -> list[Event]:
    """`commonos.runtime.reading.read_events`, failing as the Journal fails (`JournalError`)."""
    try:
        return await reading.read_events(js, filter_subject, **options)
    except reading.StreamReadError as exc:
        raise JournalError(str(exc)) from exc


async def read_stored(js: JetStreamContext, filter_subject: str, **options: Any) -> list[StoredEvent]:
    """`commonos.runtime.reading.read_stored`, failing as the Journal fails (`JournalError`)."""
    try:
        return await reading.read_stored(js, filter_subject, **options)
    except reading.StreamReadError as exc:
        raise JournalError(str(exc)) from exc


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

    def _sized(self, event: Event) -> tuple[int, Prepared | None]:
        """The publisher's own sizing (the body and headers it would send), and those to send."""
        try:
            prepared = self.publisher.prepare(event)
        except EventTooLarge as exc:
            return exc.size, None
        return message_bytes(prepared[1], with_stream_header(prepared[2], EVENTS_STREAM)), prepared

    async def _store(self, event: Event, prepared: Prepared | None = None) -> None:
        if self.publisher.closed:
            # nats-py never reopens a closed connection: waiting out the publisher's deadline is pointless.
            raise JournalError(f"event {event.event_id} not published: the NATS connection is closed")
        try:
            await self.publisher.publish(event, prepared)
        except (PublishError, EventTooLarge) as exc:
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
