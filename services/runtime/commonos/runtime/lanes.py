"""Several single-filter consumers read as one, in stream order: a projection's "lanes".

A projection that reads several kinds of events (billing: model calls, session creations, profile
deletions) could use one JetStream consumer with several filter subjects. On a stream with one subject
per session and event type, nats-server serves such a consumer very slowly (measured with
`python -m bench.filters`: a consumer with two filter subjects delivers about 30 times fewer messages per
second than one with a single filter, on nats-server 2.12, 2.14 and 2.15 alike). A consumer with one
filter is served fast, so each filter gets a durable consumer of its own, a lane, and
`MergedFetcher` merges the lanes' deliveries back into stream order.

The merge may hand out a delivery only once no lane can still deliver an earlier one. Each lane
delivers in stream order, so a lane holding deliveries has delivered everything of its own up to the
last of them. A lane holding none is asked (`consumer_info`): when it has nothing pending and every
delivery it made has arrived, it has nothing earlier than what the other lanes already hold (those
were stored before the question was asked). Otherwise the merge waits for it. An event that matches two
lanes' filters (a session_created under the no-session token) comes out twice, one after the other: the
consumer applies the first and only acknowledges the second.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from commonos.proto.events import NO_SESSION
from commonos.proto.subjects import EVENTS_STREAM
from commonos.runtime.fetcher import PullFetcher

__all__ = ["Lane", "MergedFetcher", "lane_names"]


def _suffix(filter_subject: str, index: int) -> str:
    tokens = filter_subject.split(".")
    if len(tokens) == 5 and tokens[3] == str(NO_SESSION):
        return "profiles"
    if tokens[-1] not in ("*", ">"):
        return tokens[-1]
    return f"l{index}"


def lane_names(name: str, filter_subjects: Sequence[str]) -> list[str]:
    """The durable consumer of each filter: the first keeps the projection's consumer name, the others add
    what they read (`billing-session_created`, `billing-profiles`)."""
    return [name if i == 0 else f"{name}-{_suffix(f, i)}" for i, f in enumerate(filter_subjects)]


@dataclass
class Lane:
    """One durable consumer of a projection, on one filter subject."""

    durable: str
    filter_subject: str
    #: Consumer sequence of the last delivery that arrived (`bind` sets it from the consumer's state).
    delivered: int = 0
    fetcher: PullFetcher | None = None
    #: Deliveries that arrived and were not handed out yet, in stream order.
    held: list[Msg] = field(default_factory=list)


def _seq(msg: Msg) -> int:
    return msg.metadata.sequence.stream or 0


class MergedFetcher:
    """The deliveries of several lanes, in stream order, with `PullFetcher`'s interface."""

    def __init__(self, nc: Client, js: JetStreamContext, lanes: Sequence[Lane], *, batch: int) -> None:
        self.nc = nc
        self.js = js
        self.lanes = list(lanes)
        self.batch = batch
        self._arrived = asyncio.Event()

    async def start(self) -> MergedFetcher:
        for lane in self.lanes:
            lane.fetcher = await PullFetcher(
                self.nc, EVENTS_STREAM, lane.durable, batch=self.batch, arrived=self._arrived
            ).start()
        return self

    def reset(self) -> None:
        for lane in self.lanes:
            lane.held.clear()
            if lane.fetcher is not None:
                lane.fetcher.reset()

    async def stop(self) -> None:
        for lane in self.lanes:
            if lane.fetcher is not None:
                await lane.fetcher.stop()

    async def _collect(self) -> int:
        """Move what every lane's fetcher holds into the lane; how many deliveries are held in all."""
        for lane in self.lanes:
            assert lane.fetcher is not None
            if len(lane.held) >= 2 * self.batch:
                continue  # enough held: the lane waits for the others (it stops asking for more meanwhile)
            got = await lane.fetcher.fetch(timeout_s=0.0, linger_s=0.0)
            if got:
                lane.held.extend(got)
                lane.delivered = got[-1].metadata.sequence.consumer or 0
        return sum(len(lane.held) for lane in self.lanes)

    async def _caught_up(self, lane: Lane) -> bool:
        """Whether the lane has nothing pending and every delivery it made has arrived."""
        info = await self.js.consumer_info(EVENTS_STREAM, lane.durable)
        return bool(info.num_pending == 0 and info.delivered.consumer_seq <= lane.delivered)

    async def _ready(self) -> list[Msg]:
        """The held deliveries no lane can still deliver an earlier one than, in stream order."""
        bound = math.inf
        for lane in self.lanes:
            if lane.held:
                bound = min(bound, _seq(lane.held[-1]))
        for lane in self.lanes:
            if not lane.held and not await self._caught_up(lane):
                # It may still deliver something just after the deliveries it made: wait for it.
                return []
        ready = sorted((m for lane in self.lanes for m in lane.held if _seq(m) <= bound), key=_seq)[: self.batch]
        if ready:
            # What is handed out, by identity: an event from two lanes may be split across two batches.
            taken = {id(m) for m in ready}
            for lane in self.lanes:
                lane.held = [m for m in lane.held if id(m) not in taken]
        return ready

    async def fetch(self, timeout_s: float, linger_s: float = 0.05) -> list[Msg]:
        """Up to `batch` deliveries in stream order: waits `timeout_s` for the first, then `linger_s` for more."""
        deadline = time.monotonic() + timeout_s
        linger_until: float | None = None
        while True:
            self._arrived.clear()
            held = await self._collect()
            now = time.monotonic()
            if held:
                if linger_until is None:
                    linger_until = now + linger_s
                if held < self.batch and now < linger_until:
                    await _wait(self._arrived, linger_until - now)
                    continue
                ready = await self._ready()
                if ready:
                    return ready
            left = deadline - now
            if left <= 0:
                return []
            # Held deliveries wait for a lane that is behind: look again soon, or as soon as one arrives.
            await _wait(self._arrived, min(left, 0.05) if held else left)


async def _wait(event: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return
