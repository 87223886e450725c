"""Live events for the pages: core NATS subscriptions (no durable consumer), one per watching browser.

    async with live.follow(session_filter(profile, session)) as events:
        async for event in events:   # decoded commonos.proto events, in the order NATS delivers them
            ...

A slow browser does not hold the server up: past `max_pending` undelivered events the oldest are dropped and
the page is told (`Overflow`), and reloads what it shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg

from commonos.proto.events import Event, decode_event

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Overflow:
    """Events were dropped: the watcher should reload rather than go on from here."""

    dropped: int


class Live:
    def __init__(self, nc: Client | None) -> None:
        self.nc = nc
        #: Set when the console stops: every stream ends, so that its response completes.
        self.closing = asyncio.Event()

    def close(self) -> None:
        self.closing.set()

    @contextlib.asynccontextmanager
    async def follow(self, subject: str, max_pending: int = 1000) -> AsyncIterator[AsyncIterator[Event | Overflow]]:
        queue: asyncio.Queue[Event | Overflow] = asyncio.Queue()
        dropped = 0

        async def on_message(msg: Msg) -> None:
            nonlocal dropped
            try:
                event = decode_event(msg.data)
            except Exception:  # not ours to judge here: the journal-writer dead-letters it
                log.debug("live: undecodable message on %s", msg.subject)
                return
            if queue.qsize() >= max_pending:
                dropped += 1
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                return
            queue.put_nowait(event)

        async def events() -> AsyncIterator[Event | Overflow]:
            nonlocal dropped
            closing = asyncio.create_task(self.closing.wait())
            try:
                while not self.closing.is_set():
                    if dropped:
                        n, dropped = dropped, 0
                        yield Overflow(n)
                    if queue.empty():
                        getter = asyncio.create_task(queue.get())
                        await asyncio.wait((getter, closing), return_when=asyncio.FIRST_COMPLETED)
                        if not getter.done():
                            getter.cancel()
                            return
                        yield getter.result()
                    else:
                        yield queue.get_nowait()
            finally:
                closing.cancel()

        if self.nc is None:
            raise RuntimeError("the console has no NATS connection")
        sub = await self.nc.subscribe(subject, cb=on_message)
        try:
            yield events()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
