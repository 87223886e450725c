"""Publishing events to JetStream: continue only after the PubAck; a retry reuses the event id.

An event published inside a span (OpenTelemetry on, `commonos.runtime.telemetry`) carries that span's W3C
`traceparent` (and `tracestate`) header, so whoever consumes it can join the trace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck

from commonos.proto.cloudevents import event_headers
from commonos.proto.errors import DataError, OperationalError
from commonos.proto.events import EventBase, encode_event, event_type
from commonos.proto.subjects import EVENTS_STREAM, subject_for
from commonos.runtime import telemetry
from commonos.runtime.limits import EXPECTED_STREAM, MessageTooLarge, header_bytes, server_max_payload
from commonos.runtime.nats import client_of
from commonos.runtime.retry import Backoff

log = logging.getLogger(__name__)

#: An event ready to send: its subject, body and headers (`EventPublisher.prepare`).
Prepared = tuple[str, bytes, dict[str, str]]

_RETRYABLE = (
    nats.errors.TimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
)


#: JetStream API errors worth retrying: an election in progress (503), or the same message id still
#: being stored by an earlier attempt (10158), whose retry then comes back as a duplicate.
_TRANSIENT_ERR_CODES = frozenset({10158})


def _transient_api_error(exc: nats.js.errors.APIError) -> bool:
    return isinstance(exc, nats.js.errors.ServiceUnavailableError) or exc.err_code in _TRANSIENT_ERR_CODES


#: Longest pause between two attempts, and how long a retry waits for its PubAck. While a stream
#: elects a new leader (4 to 10 s on nats-server after a leader dies) an attempt is answered with "no
#: responders" or not at all; short, cheap retries (deduplicated by the event id) reach the new leader
#: within 0.4 s of its election, where waiting the whole ack timeout on each would add up to that.
_MAX_RETRY_DELAY_S = 0.1
#: The header nats-py's js.publish(..., stream=EVENTS_STREAM) adds to every event, in bytes (`header_bytes`).
_STREAM_HEADER_BYTES = len(EXPECTED_STREAM) + 2 + len(EVENTS_STREAM) + 2
_RETRY_ACK_TIMEOUT_S = 0.3


class PublishError(OperationalError):
    """An event could not be stored in JetStream before the deadline; it was not acknowledged."""


class EventTooLarge(DataError):
    """An event that cannot fit the server's max_payload (headers included); nothing of it was published."""

    def __init__(self, message: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


#: What to change when an event does not fit, unless the producer says something more precise.
DEFAULT_TOO_LARGE_HINT = "send less in one event, or raise the server's max_payload (COS_NATS_MAX_PAYLOAD for `cos up`)"


class EventPublisher:
    """Publishes on `js`; `nc`, the connection `js` was made from, tells the server's max_payload and
    whether the connection is closed (taken from `js` when not given)."""

    def __init__(
        self,
        js: JetStreamContext,
        source: str,
        *,
        nc: Client | None = None,
        ack_timeout_s: float = 2.0,
        deadline_s: float = 30.0,
        too_large_hint: str = DEFAULT_TOO_LARGE_HINT,
    ) -> None:
        self.js = js
        self.nc = nc if nc is not None else client_of(js)
        self.source = source
        self.ack_timeout_s = ack_timeout_s
        self.deadline_s = deadline_s
        self.too_large_hint = too_large_hint

    @property
    def closed(self) -> bool:
        """The connection is closed for good: nats-py never reopens it, so nothing more can be published."""
        return self.nc is not None and self.nc.is_closed

    @property
    def max_payload(self) -> int:
        """The connected server's limit for one message, headers included."""
        return server_max_payload(self.nc)

    def prepare(self, event: EventBase) -> Prepared:
        """Subject, body and headers of `event` (with the current span's `traceparent`, if any); raises
        EventTooLarge if they cannot fit one message."""
        subject = subject_for(event)
        payload = encode_event(event)
        headers = event_headers(event, self.source)
        telemetry.inject(headers)
        # What the server counts: the body, our headers and the one js.publish(..., stream=) adds.
        size = len(payload) + header_bytes(headers) + _STREAM_HEADER_BYTES
        limit = self.max_payload
        if size > limit:
            what = f"event {event.event_id} ({event_type(event)})"
            raise EventTooLarge(str(MessageTooLarge(what, size, limit, self.too_large_hint)), size, limit)
        return subject, payload, headers

    async def publish(self, event: EventBase, prepared: Prepared | None = None) -> PubAck:
        """Publish one event and wait for its PubAck, retrying with the same id until the deadline.

        Raises EventTooLarge, before sending anything, for an event over the server's max_payload. A caller
        that has already `prepare`d the event (to size it) passes what it got: the event is encoded once.
        """
        subject, payload, headers = prepared if prepared is not None else self.prepare(event)
        deadline = time.monotonic() + self.deadline_s
        backoff = Backoff(0.05, _MAX_RETRY_DELAY_S)
        timeout = self.ack_timeout_s
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self.js.publish(
                    subject, payload, timeout=timeout, stream=EVENTS_STREAM, headers=dict(headers)
                )
            except (*_RETRYABLE, nats.js.errors.APIError) as exc:
                if isinstance(exc, nats.js.errors.APIError) and not _transient_api_error(exc):
                    raise PublishError(f"event {event.event_id} ({subject}) refused by JetStream: {exc}") from exc
                if self.closed:
                    # nats-py never reopens a closed connection: waiting out the deadline cannot help.
                    raise PublishError(
                        f"event {event.event_id} ({subject}) not published: the NATS connection is closed"
                    ) from exc
                if time.monotonic() + backoff.current >= deadline:
                    raise PublishError(
                        f"event {event.event_id} ({subject}) not acknowledged within {self.deadline_s:.0f}s: "
                        f"{type(exc).__name__}"
                    ) from exc
                # One warning per event; an election means many quick retries.
                log.log(
                    logging.WARNING if attempt == 1 else logging.DEBUG,
                    "publish of %s not acknowledged (%s); retrying until acknowledged or %.0fs have passed",
                    event.event_id,
                    type(exc).__name__,
                    self.deadline_s,
                )
                await asyncio.sleep(backoff.next())
                timeout = min(self.ack_timeout_s, _RETRY_ACK_TIMEOUT_S)

    async def publish_many(
        self,
        events: Sequence[EventBase],
        window: int = 1000,
        prepared: Sequence[Prepared] | None = None,
    ) -> list[PubAck]:
        """Pipelined publishing: up to `window` un-acked at once; any without a PubAck is retried alone.

        Retries reuse the event id, so an event whose first PubAck was merely lost is dropped by
        JetStream as a duplicate instead of being stored twice. Every event is sized first: one that
        cannot fit raises EventTooLarge before any of them is published. A caller that has already
        `prepare`d the events (to refuse the ones that cannot fit, one by one) passes what it got.
        """
        if prepared is None:
            prepared = [self.prepare(event) for event in events]
        elif len(prepared) != len(events):
            raise ValueError(f"{len(prepared)} prepared messages for {len(events)} events")
        acks: list[PubAck | None] = [None] * len(events)
        for start in range(0, len(events), window):
            chunk = events[start : start + window]
            futures: list[asyncio.Future[PubAck] | None] = []
            for subject, payload, headers in prepared[start : start + window]:
                try:
                    futures.append(await self.js.publish_async(subject, payload, stream=EVENTS_STREAM, headers=headers))
                except (*_RETRYABLE, nats.js.errors.TooManyStalledMsgsError):
                    futures.append(None)
            live = [f for f in futures if f is not None]
            if live:
                await asyncio.wait(live, timeout=self.ack_timeout_s)
            for offset, (event, future) in enumerate(zip(chunk, futures, strict=True)):
                if future is not None and future.done() and not future.cancelled() and future.exception() is None:
                    acks[start + offset] = future.result()
                else:
                    if future is not None and not future.done():
                        future.cancel()
                    elif future is not None and not future.cancelled() and future.exception() is not None:
                        log.debug("pipelined publish of %s failed: %s", event.event_id, future.exception())
                    acks[start + offset] = await self.publish(event)
        return [a for a in acks if a is not None]
