"""The load generator: a realistic mix of events published to JetStream, flat out or at a fixed rate.

The mix is `tests.factories.event_stream`: interleaved conversations whose turns hold several
messages, a tool call and two model calls, about 5% of tool results long. Flat out, events go
through `EventPublisher.publish_many` (pipelined, PubAcks awaited per window); sequentially, through
`EventPublisher.publish` (one PubAck awaited per event). At a fixed rate, each event is sent at its
due time and its PubAck time is recorded.

    python -m bench.load --nats-url nats://127.0.0.1:4222 --events 100000
    python -m bench.load --nats-url nats://127.0.0.1:4222 --rate 2000 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import nats
from nats.js import JetStreamContext
from nats.js.api import PubAck

from commonos.proto.cloudevents import event_headers
from commonos.proto.events import Event, ModelCallCompleted, encode_event, event_type
from commonos.proto.subjects import EVENTS_STREAM, subject_for
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.factories import event_stream

SOURCE: Final = "urn:commonos:bench"
CHUNK: Final = 10_000
WINDOW: Final = 2_000


def realistic_events(total: int, seed: int = 7) -> Iterator[Event]:
    """About `total` events (open sessions are finished, so a few hundred more)."""
    return event_stream(total, seed=seed)


@dataclass
class StreamStats:
    """What was published: counts, sizes, where it ends, where the model calls are, and how fast."""

    events: int = 0
    payload_bytes: int = 0
    last_seq: int = 0
    duplicates: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    #: Stream sequences of the model_call_completed events, ascending (billing's share of the stream).
    model_call_seqs: array[int] = field(default_factory=lambda: array("q"))
    #: One rate per sequential run (events/s).
    sequential_rates: list[float] = field(default_factory=list)
    pipelined_events: int = 0
    pipelined_s: float = 0.0
    generate_s: float = 0.0

    def record(self, events: Sequence[Event], acks: Sequence[PubAck]) -> None:
        for event, ack in zip(events, acks, strict=True):
            self.events += 1
            self.payload_bytes += len(encode_event(event))
            self.by_type[event_type(event)] += 1
            if ack.duplicate:
                self.duplicates += 1
            if isinstance(event, ModelCallCompleted):
                self.model_call_seqs.append(ack.seq)
            self.last_seq = max(self.last_seq, ack.seq)

    @property
    def pipelined_rate(self) -> float:
        return self.pipelined_events / self.pipelined_s if self.pipelined_s else 0.0


async def publish_stream(
    js: JetStreamContext,
    events: Iterable[Event],
    *,
    sequential_runs: int = 3,
    sequential_events: int = 5_000,
    say: Callable[[str], None] = lambda line: None,
) -> StreamStats:
    """Publish `events`: the first `sequential_runs` x `sequential_events` one PubAck at a time, the rest pipelined.

    Every event lands in the stream once, so the stream afterwards holds exactly the events given.
    Generation time is kept out of the rates.
    """
    publisher = EventPublisher(js, SOURCE)
    stats = StreamStats()
    source = iter(events)
    for _ in range(sequential_runs):
        batch = _take(source, sequential_events, stats)
        if not batch:
            break
        started = time.perf_counter()
        acks = [await publisher.publish(event) for event in batch]
        stats.sequential_rates.append(len(batch) / (time.perf_counter() - started))
        stats.record(batch, acks)
    next_report = time.monotonic() + 5.0
    while batch := _take(source, CHUNK, stats):
        started = time.perf_counter()
        acks = await publisher.publish_many(batch, window=WINDOW)
        stats.pipelined_s += time.perf_counter() - started
        stats.pipelined_events += len(batch)
        stats.record(batch, acks)
        if time.monotonic() >= next_report:
            say(f"published {stats.events:,} events ({stats.pipelined_rate:,.0f}/s pipelined)")
            next_report = time.monotonic() + 5.0
    return stats


def _take(source: Iterator[Event], n: int, stats: StreamStats) -> list[Event]:
    started = time.perf_counter()
    batch = list(itertools.islice(source, n))
    stats.generate_s += time.perf_counter() - started
    return batch


@dataclass(frozen=True, slots=True)
class Sent:
    """One event published at a fixed rate: its stream sequence, when it was sent and when acknowledged."""

    seq: int
    sent_at: float
    acked_at: float


async def publish_paced(js: JetStreamContext, events: Sequence[Event], rate: float) -> list[Sent]:
    """Send event i at start + i / rate (asyncio-paced, pipelined); times are `time.monotonic()`.

    Subjects, payloads and headers are prepared first, so the pacing loop only sends.
    """
    prepared = [(subject_for(e), encode_event(e), event_headers(e, SOURCE)) for e in events]
    results: list[Sent | None] = [None] * len(prepared)

    def on_ack(index: int, sent_at: float, future: asyncio.Future[PubAck]) -> None:
        if not future.cancelled() and future.exception() is None:
            results[index] = Sent(future.result().seq, sent_at, time.monotonic())

    futures: list[asyncio.Future[PubAck]] = []
    start = time.monotonic()
    for index, (subject, payload, headers) in enumerate(prepared):
        delay = start + index / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sent_at = time.monotonic()
        future = await js.publish_async(subject, payload, stream=EVENTS_STREAM, headers=headers)
        future.add_done_callback(functools.partial(on_ack, index, sent_at))
        futures.append(future)
    if futures:
        await asyncio.wait(futures, timeout=10.0)
    await asyncio.sleep(0)  # let the last done-callbacks run
    return [r for r in results if r is not None]


async def _main(args: argparse.Namespace) -> int:
    nc = await nats.connect(args.nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        if args.rate:
            count = int(args.rate * args.seconds)
            events = list(itertools.islice(realistic_events(count, args.seed), count))
            sent = await publish_paced(js, events, args.rate)
            took = sent[-1].sent_at - sent[0].sent_at if len(sent) > 1 else 0.0
            print(
                f"published {len(sent):,} events at {len(sent) / took if took else 0:,.0f}/s (asked {args.rate:,.0f}/s)"
            )
        else:
            stats = await publish_stream(
                js, realistic_events(args.events, args.seed), say=lambda line: print(line, file=sys.stderr)
            )
            print(
                f"published {stats.events:,} events up to seq {stats.last_seq}: "
                f"{stats.pipelined_rate:,.0f}/s pipelined, "
                f"{', '.join(f'{r:,.0f}' for r in stats.sequential_rates)}/s sequential"
            )
        return 0
    finally:
        await nc.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--events", type=int, default=100_000, help="flat out: how many events (about)")
    parser.add_argument("--rate", type=float, default=0.0, help="events/s; 0 publishes flat out")
    parser.add_argument("--seconds", type=float, default=15.0, help="at a fixed rate: for how long")
    parser.add_argument("--seed", type=int, default=7)
    return asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
