"""Pull-consumer fetching with requests kept in flight, so the next batch arrives while one is applied.

nats-py's `PullSubscription.fetch` issues a request and then awaits each message on its own; at
tens of thousands of events a second that per-message await is the bottleneck. This speaks
JetStream's pull protocol directly — a request on `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`
with a reply subject of ours — and collects deliveries in a callback. Up to `depth` requests are
outstanding at a time. A request ends when it has delivered its batch, or with a status message
(408 request expired, 404 no messages, 409 consumer changes); a request that the server forgot
(a reconnect) is dropped after its expiry.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.proto.errors import OperationalError

_STATUS = "Status"
_DESCRIPTION = "Description"
_HEARTBEAT = "100"


class ConsumerGone(OperationalError):
    """The server says the consumer was deleted or replaced; bind again."""


@dataclass
class _Request:
    remaining: int
    expires_at: float


class PullFetcher:
    def __init__(
        self,
        nc: Client,
        stream: str,
        consumer: str,
        *,
        batch: int = 500,
        expires_s: float = 2.0,
        depth: int = 2,
        arrived: asyncio.Event | None = None,
    ) -> None:
        self.nc = nc
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.batch = batch
        self.expires_s = expires_s
        self.depth = depth
        self._buffer: list[Msg] = []
        self._requests: dict[str, _Request] = {}
        self._wake = asyncio.Event()
        #: Set on every delivery, for a reader of several fetchers (`commonos.runtime.lanes.MergedFetcher`).
        self._arrived = arrived
        self._next_id = 0
        self._prefix = ""
        self._sub: object | None = None
        self._gone: str | None = None
        #: When the oldest message now in the buffer arrived: the linger counts from there, so an event
        #: that arrived while the previous batch was being applied does not wait a full linger again.
        self._first_at = 0.0

    async def start(self) -> PullFetcher:
        self._prefix = self.nc.new_inbox()
        self._sub = await self.nc.subscribe(
            self._prefix + ".*",
            cb=self._on_msg,
            pending_msgs_limit=self.batch * (self.depth + 2) * 4,
            pending_bytes_limit=512 * 1024 * 1024,
        )
        return self

    def reset(self) -> None:
        """Forget buffered deliveries and outstanding requests (the consumer was recreated)."""
        self._buffer.clear()
        self._requests.clear()
        self._first_at = 0.0

    async def stop(self) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            if not self.nc.is_closed:  # a closed connection has no subscription left (nats-py would raise)
                await sub.unsubscribe()  # type: ignore[attr-defined]

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        # A delivery carries an ack subject; a status message of the pull protocol never does (an empty
        # event with a `Status` header of its own is a delivery, and goes to the dead-letter stream).
        is_delivery = msg.reply.startswith("$JS.ACK.")
        status = headers.get(_STATUS) if headers and not msg.data and not is_delivery else None
        if status is None:
            # A delivery carries the event's own subject, not the request's: the server serves
            # requests in order, so it counts against the oldest one.
            was_empty = not self._buffer
            if was_empty:
                self._first_at = time.monotonic()
            self._buffer.append(msg)
            if self._arrived is not None:
                self._arrived.set()
            if self._requests:
                rid = next(iter(self._requests))
                req = self._requests[rid]
                req.remaining -= 1
                if req.remaining <= 0:
                    del self._requests[rid]
                    self._wake.set()
            if was_empty or len(self._buffer) >= self.batch:
                self._wake.set()
            return
        if status == _HEARTBEAT:
            return
        self._requests.pop(msg.subject.rsplit(".", 1)[-1], None)
        description = (headers or {}).get(_DESCRIPTION, "")
        if status == "409" and (
            "Deleted" in description or ("Exceeded" not in description and "Leadership" in description)
        ):
            self._gone = f"{status} {description}"
        self._wake.set()

    async def _top_up(self) -> None:
        now = time.monotonic()
        for rid in [r for r, req in self._requests.items() if req.expires_at < now]:
            del self._requests[rid]  # the server has dropped it (expired, or lost in a reconnect)
        while len(self._requests) < self.depth:
            self._next_id += 1
            rid = str(self._next_id)
            self._requests[rid] = _Request(self.batch, now + self.expires_s + 1.0)
            payload = json.dumps({"batch": self.batch, "expires": int(self.expires_s * 1e9)}).encode()
            await self.nc.publish(self.subject, payload, reply=f"{self._prefix}.{rid}")

    async def fetch(self, timeout_s: float, linger_s: float = 0.05) -> list[Msg]:
        """Up to `batch` messages: waits `timeout_s` for the first, then `linger_s` for more."""
        if self._gone is not None:
            reason, self._gone = self._gone, None
            raise ConsumerGone(reason)
        if len(self._buffer) < self.depth * self.batch:
            await self._top_up()
        deadline = time.monotonic() + timeout_s
        while not self._buffer:
            self._wake.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return []
            if self._gone is not None:
                reason, self._gone = self._gone, None
                raise ConsumerGone(reason)
            if not self._buffer:
                await self._top_up()
        linger_until = self._first_at + linger_s
        while len(self._buffer) < self.batch and self._requests:
            self._wake.clear()
            left = linger_until - time.monotonic()
            if left <= 0:
                break
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                break
        out, self._buffer = self._buffer[: self.batch], self._buffer[self.batch :]
        if self._buffer:
            self._first_at = time.monotonic()
        return out
