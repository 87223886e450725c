"""How fast nats-server delivers to a consumer with one filter, with several, and to merged lanes.

Fills a stream shaped like COS_EVENTS (one subject per session and event type) on its own nats-server,
then drains it three ways, each run three times (median, and the ratio to the single filter):

* one filter: `cos.events.*.*.model_call_completed` (what billing read before it read session creations);
* two filters on one consumer: model calls and session creations (JetStream's `filter_subjects`);
* two lanes: one consumer per filter, merged in stream order (`commonos.runtime.lanes.MergedFetcher`).

    python -m bench.filters [--events 50000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from commonos.runtime.embedded import NatsServer
from commonos.runtime.fetcher import PullFetcher
from commonos.runtime.lanes import Lane, MergedFetcher

STREAM = "COS_EVENTS"
TYPES = ("turn_started", "message_appended", "model_call_completed", "tool_call_recorded", "turn_finished")
CALLS = "cos.events.*.*.model_call_completed"
CREATED = "cos.events.*.*.session_created"


async def fill(js: JetStreamContext, events: int) -> int:
    sessions = [uuid.uuid4() for _ in range(max(events // 10, 1))]
    for i in range(events):
        session = sessions[i % len(sessions)]
        kind = "session_created" if i < len(sessions) else TYPES[i % len(TYPES)]
        await js.publish_async(f"cos.events.demo.{session}.{kind}", b"x" * 300)
    await js.publish_async_completed()
    return len(sessions)


def _config(name: str, filters: Sequence[str]) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=name,
        ack_policy=AckPolicy.EXPLICIT,
        max_ack_pending=20_000,
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=list(filters) if len(filters) > 1 else None,
    )


async def drain(fetch: PullFetcher | MergedFetcher) -> int:
    got = 0
    while msgs := await fetch.fetch(timeout_s=1.0, linger_s=0.005):
        for msg in msgs:
            await msg.ack()
        got += len(msgs)
    return got


async def one_consumer(nc: Client, js: JetStreamContext, name: str, filters: Sequence[str]) -> tuple[int, float]:
    await js.add_consumer(STREAM, _config(name, filters))
    fetcher = await PullFetcher(nc, STREAM, name, batch=1000).start()
    started = time.perf_counter()
    got = await drain(fetcher)
    elapsed = time.perf_counter() - started - 1.0  # the last, empty wait
    await fetcher.stop()
    await js.delete_consumer(STREAM, name)
    return got, elapsed


async def lanes(nc: Client, js: JetStreamContext, name: str, filters: Sequence[str]) -> tuple[int, float]:
    merged = [Lane(f"{name}-{i}", f) for i, f in enumerate(filters)]
    for lane in merged:
        await js.add_consumer(STREAM, _config(lane.durable, [lane.filter_subject]))
    fetcher = await MergedFetcher(nc, js, merged, batch=1000).start()
    started = time.perf_counter()
    got = await drain(fetcher)
    elapsed = time.perf_counter() - started - 1.0
    await fetcher.stop()
    for lane in merged:
        await js.delete_consumer(STREAM, lane.durable)
    return got, elapsed


async def main(events: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        server = NatsServer(Path(folder))
        server.start()
        try:
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=STREAM, subjects=["cos.events.>"], allow_direct=True))
            sessions = await fill(js, events)
            print(f"{events:,} events over {sessions:,} sessions (about {sessions * 6:,} subjects)")
            ways = {
                "one filter (model calls)": (one_consumer, [CALLS]),
                "two filters, one consumer": (one_consumer, [CALLS, CREATED]),
                "two lanes, merged": (lanes, [CALLS, CREATED]),
            }
            rates: dict[str, float] = {}
            for label, (way, filters) in ways.items():
                samples = []
                for run in range(runs):
                    got, elapsed = await way(nc, js, f"bench{run}", filters)
                    samples.append(got / max(elapsed, 1e-6))
                rates[label] = statistics.median(samples)
                print(f"{label:28} {got:>8,} deliveries  {rates[label]:>10,.0f}/s (median of {runs})")
            base = rates["one filter (model calls)"]
            for label, rate in rates.items():
                print(f"{label:28} {rate / base:>6.2f} x the single filter")
            await nc.close()
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.filters", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.events, args.runs))
