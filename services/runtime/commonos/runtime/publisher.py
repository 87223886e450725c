"""Publishing events to JetStream: continue only after the PubAck; a retry reuses the event id."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import PubAck

from commonos.proto.cloudevents import event_headers
from commonos.proto.events import _Event, encode_event
from commonos.proto.subjects import EVENTS_STREAM, subject_for

log = logging.getLogger(__name__)

_RETRYABLE = (
    nats.errors.TimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
)


class PublishError(RuntimeError):
    """An event could not be stored in JetStream before the deadline; it was not acknowledged."""


class EventPublisher:
    def __init__(
        self, js: JetStreamContext, source: str, *, ack_timeout_s: float = 5.0, deadline_s: float = 30.0
    ) -> None:
        self.js = js
        self.source = source
        self.ack_timeout_s = ack_timeout_s
        self.deadline_s = deadline_s

    async def publish(self, event: _Event) -> PubAck:
        """Publish one event and wait for its PubAck, retrying with the same id until the deadline."""
        subject = subject_for(event)
        payload = encode_event(event)
        headers = event_headers(event, self.source)
        deadline = time.monotonic() + self.deadline_s
        delay = 0.05
        while True:
            try:
                return await self.js.publish(
                    subject, payload, timeout=self.ack_timeout_s, stream=EVENTS_STREAM, headers=dict(headers)
                )
            except _RETRYABLE as exc:
                if time.monotonic() + delay >= deadline:
                    raise PublishError(
                        f"event {event.event_id} ({subject}) not acknowledged within {self.deadline_s:.0f}s: "
                        f"{type(exc).__name__}"
                    ) from exc
                log.warning("publish of %s not acknowledged (%s); retrying", event.event_id, type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def publish_many(self, events: Sequence[_Event], window: int = 1000) -> list[PubAck]:
        """Pipelined publishing: up to `window` un-acked at once, each retried on its own."""
        semaphore = asyncio.Semaphore(window)

        async def one(event: _Event) -> PubAck:
            async with semaphore:
                return await self.publish(event)

        return list(await asyncio.gather(*(one(e) for e in events)))
