"""Live events for the pages: core NATS subscriptions (no durable consumer), one set per watching browser.

    async with live.follow(session_filter(profile, session), approval_request_subject(profile)) as events:
        async for item in events:   # decoded events (and approval requests), in the order NATS delivers them
            ...

Messages on `cos.approvals.*` subjects are `ApprovalRequest`s (a tool call starts to wait), every other one is a
stored event (`commonos.proto.events`).

A slow browser does not hold the server up: past `max_pending` undelivered items the queue is emptied and the
page is told (`Overflow`), and reloads what it shows.

No task is made per watcher: the iterator awaits its queue alone, and `Live.close` (the console stopping) wakes
every watcher with a sentinel. A browser leaving cancels that await and nothing else is left pending (a helper
task waiting on the queue would be destroyed pending, logged as "Task was destroyed but it is pending!").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Final

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from commonos.proto.events import Event, decode_event
from commonos.proto.requests import ApprovalRequest

log = logging.getLogger(__name__)

#: What a message on one of these subjects is: an approval request, not an event.
APPROVALS_PREFIX: Final = "cos.approvals."
_APPROVAL_REQUEST: Final = msgspec.json.Decoder(ApprovalRequest)


@dataclass(frozen=True)
class Overflow:
    """Events were dropped: the watcher should reload rather than go on from here."""

    dropped: int


class _Closed:
    """Put in every watcher's queue when the console stops."""


_CLOSED: Final = _Closed()

Item = Event | ApprovalRequest | Overflow


def decode(msg: Msg) -> Event | ApprovalRequest | None:
    """The event (or approval request) a message holds; None for one that is neither (not ours to judge here: the
    journal-writer dead-letters a bad event)."""
    try:
        if msg.subject.startswith(APPROVALS_PREFIX):
            return _APPROVAL_REQUEST.decode(msg.data)
        return decode_event(msg.data)
    except Exception:
        log.debug("live: undecodable message on %s", msg.subject)
        return None


class Live:
    def __init__(self, nc: Client | None) -> None:
        self.nc = nc
        #: Set when the console stops: every stream ends, so that its response completes.
        self.closing = asyncio.Event()
        self._queues: set[asyncio.Queue[Item | _Closed]] = set()

    def close(self) -> None:
        self.closing.set()
        for queue in self._queues:
            queue.put_nowait(_CLOSED)

    @contextlib.asynccontextmanager
    async def follow(self, *subjects: str, max_pending: int = 1000) -> AsyncIterator[AsyncIterator[Item]]:
        if self.nc is None:
            raise RuntimeError("the console has no NATS connection")
        queue: asyncio.Queue[Item | _Closed] = asyncio.Queue()
        # Counted apart from the queue: the sentinel of `close` always fits.
        pending = 0

        async def on_message(msg: Msg) -> None:
            nonlocal pending
            item = decode(msg)
            if item is None or self.closing.is_set():
                return
            if pending >= max_pending:
                dropped = pending
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(Overflow(dropped))
                pending = 1
                return
            pending += 1
            queue.put_nowait(item)

        async def items() -> AsyncGenerator[Item, None]:
            nonlocal pending
            while not self.closing.is_set():
                item = await queue.get()
                if isinstance(item, _Closed):
                    return
                pending -= 1
                yield item

        subs: list[Subscription] = []
        following = items()
        self._queues.add(queue)
        try:
            for subject in subjects:
                subs.append(await self.nc.subscribe(subject, cb=on_message))
            yield following
        finally:
            self._queues.discard(queue)
            # Closed here, not left to the garbage collector (it is suspended at a yield, or already done).
            await following.aclose()
            if subs:
                # Shielded: when the browser left, this request is being cancelled, and every subscription must
                # still end (an unsubscribe cut short would leave the others delivering into a dead queue).
                await asyncio.shield(asyncio.gather(*(_unsubscribe(sub) for sub in subs)))


async def _unsubscribe(sub: Subscription) -> None:
    with contextlib.suppress(nats.errors.Error):
        await sub.unsubscribe()
