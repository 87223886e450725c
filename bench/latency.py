"""Publish -> visible latency: events at a fixed rate against a running, caught-up journal-writer.

The writer's position (`projection_positions`) is polled every few milliseconds; an event is visible
at the first poll whose position has reached its stream sequence (the position commits with the rows).
Latency runs from the event's PubAck to that poll, and, for comparison, from the moment it was sent.
The first `warmup_s` seconds are published but not counted.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import nats

from bench.load import publish_paced
from commonos.proto.events import Event


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of unsorted values."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class Latency:
    events: int
    achieved_rate: float
    #: Milliseconds from PubAck to visible.
    from_ack_ms: tuple[float, ...]
    #: Milliseconds from send to visible.
    from_send_ms: tuple[float, ...]
    polls: int
    not_visible: int

    def p(self, q: float, from_send: bool = False) -> float:
        return percentile(self.from_send_ms if from_send else self.from_ack_ms, q)


async def _poll_positions(
    dsn: str, consumer: str, out: list[tuple[float, int]], stop: asyncio.Event, interval_s: float
) -> None:
    conn: asyncpg.Connection = await asyncpg.connect(dsn)
    try:
        while not stop.is_set():
            position = int(
                await conn.fetchval("SELECT stream_seq FROM projection_positions WHERE consumer = $1", consumer) or 0
            )
            out.append((time.monotonic(), position))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
    finally:
        await conn.close()


async def measure_latency(
    nats_url: str,
    dsn: str,
    events: Sequence[Event],
    rate: float,
    *,
    warmup_s: float = 2.0,
    consumer: str = "journal-writer",
    poll_interval_s: float = 0.005,
    settle_timeout_s: float = 30.0,
) -> Latency:
    nc = await nats.connect(nats_url)
    polls: list[tuple[float, int]] = []
    stop = asyncio.Event()
    poller = asyncio.create_task(_poll_positions(dsn, consumer, polls, stop, poll_interval_s))
    try:
        sent = await publish_paced(nc.jetstream(), events, rate)
        last = max(s.seq for s in sent)
        deadline = time.monotonic() + settle_timeout_s
        while (not polls or polls[-1][1] < last) and time.monotonic() < deadline:
            if poller.done():
                poller.result()  # raises what stopped it
            await asyncio.sleep(0.01)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
        await nc.close()
    warm = int(warmup_s * rate)
    counted = sent[warm:]
    times = [t for t, _ in polls]
    positions = [p for _, p in polls]  # non-decreasing: the position only moves forward
    from_ack: list[float] = []
    from_send: list[float] = []
    missing = 0
    for s in counted:
        i = bisect.bisect_left(positions, s.seq)
        if i == len(positions):
            missing += 1
            continue
        visible = times[i]
        from_ack.append(max(0.0, visible - s.acked_at) * 1000)
        from_send.append((visible - s.sent_at) * 1000)
    took = counted[-1].sent_at - counted[0].sent_at if len(counted) > 1 else 0.0
    return Latency(
        events=len(counted),
        achieved_rate=(len(counted) - 1) / took if took else 0.0,
        from_ack_ms=tuple(from_ack),
        from_send_ms=tuple(from_send),
        polls=len(polls),
        not_visible=missing,
    )
