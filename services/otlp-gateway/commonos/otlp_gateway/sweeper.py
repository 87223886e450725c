"""The gateway's sweeper: ends the turns Claude Code and Codex never end (:mod:`~commonos.otlp_gateway.turns`).

Every gateway replica runs one, every `interval_s` (a quarter of ``COS_OTLP_TURN_IDLE_S``, at most 5 s). A
sweep reads every session's turns from the store (`common.TurnStore`: NATS KV in the gateway) and, for each
session:

1. decides the end of each turn that is over and quiet for `settle_s` (`turns.decide`), and stores the
   decision by compare-and-set on the revision it read: when another replica or a request wrote first,
   nothing is decided this time (the next sweep reads the new state), so each end is decided once,
   whatever the replicas;
2. publishes every decided end not yet marked published (its session and turn announced again, then its
   ``turn_finished``: `turns.end_events`), and waits for JetStream's acknowledgements;
3. marks them published (compare-and-set again; when it fails, the next sweep publishes them again: the
   same event ids, which JetStream drops as duplicates within its 10-minute window);
4. forgets the session (deletes its state) once all its turns are over and it has been quiet for the idle
   time.

A decision is stored before it is published, so a replica stopped (or NATS lost) in between leaves it for
the next sweep of any replica: a turn is ended exactly once, and a restart ends the turns that went idle
while no gateway ran. A sweep that fails (NATS unavailable) is logged and tried again at the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Final

import msgspec
import nats.errors

from commonos.otlp_gateway.common import TurnStore
from commonos.otlp_gateway.metrics import GatewayMetrics
from commonos.otlp_gateway.turns import SessionTurns, decide, end_events, forgettable, published
from commonos.proto.errors import OperationalError
from commonos.proto.events import event_type
from commonos.runtime.publisher import EventPublisher, PublishError

log = logging.getLogger("commonos.otlp_gateway.sweeper")

#: The longest pause between two sweeps (seconds).
MAX_INTERVAL_S: Final = 5.0
#: The shortest.
MIN_INTERVAL_S: Final = 0.1


def interval_for(idle_s: float) -> float:
    """The pause between sweeps for an idle time: a quarter of it, within MIN_INTERVAL_S..MAX_INTERVAL_S."""
    return min(max(idle_s / 4, MIN_INTERVAL_S), MAX_INTERVAL_S)


class TurnSweeper:
    """Decides, publishes and forgets the ends of the turns in `store` (see the module's docstring)."""

    def __init__(
        self,
        store: TurnStore,
        publisher: EventPublisher,
        *,
        idle_s: float,
        publish_timeout_s: float = 5.0,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.idle_s = idle_s
        self.interval_s = interval_for(idle_s)
        self.publish_timeout_s = publish_timeout_s
        #: A request's events are acknowledged or refused within two publish timeouts of its arrival (the
        #: mapping's, then the publishing's): a turn heard from since is not ended yet (`turns.decide`).
        self.settle_s = 2 * publish_timeout_s + 1.0
        self.metrics = metrics
        self.clock = clock

    async def sweep(self) -> int:
        """One sweep; the number of turn ends published (acknowledged, duplicates included)."""
        ended = 0
        for key, stored, revision in await self.store.sessions():
            ended += await self._sweep_session(key, stored, revision, self.clock())
        return ended

    async def _sweep_session(self, key: str, stored: SessionTurns, revision: int, now: float) -> int:
        state = decide(stored, now, self.idle_s, self.settle_s)
        if state is not stored:
            decided = await self.store.replace(key, state, revision)
            if decided is None:
                return 0  # written meanwhile: decided on the new state at the next sweep
            revision = decided
        pending = state.unpublished()
        if pending:
            events = [event for turn in pending for event in end_events(state, turn)]
            acks = await asyncio.wait_for(self.publisher.publish_many(events), self.publish_timeout_s)
            if len(acks) != len(events):
                raise PublishError(f"{len(events) - len(acks)} of {len(events)} turn-end events not acknowledged")
            if self.metrics is not None:
                new = Counter(event_type(e) for e, ack in zip(events, acks, strict=True) if not ack.duplicate)
                for kind, number in new.items():
                    self.metrics.events_published.labels(kind).inc(number)
            state = published(state, {turn.key for turn in pending})
            marked = await self.store.replace(key, state, revision)
            if marked is None:
                return len(pending)  # published again at the next sweep: the same ids, dropped as duplicates
            revision = marked
        if forgettable(state, now, self.idle_s):
            await self.store.forget(key, revision)
        return len(pending)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep every `interval_s` until `stop`; a failed sweep is logged and tried again."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.sweep(), max(self.publish_timeout_s * 4, 30.0))
            except (OperationalError, nats.errors.Error, TimeoutError, msgspec.DecodeError) as exc:
                log.warning(
                    "ending idle turns failed (tried again in %g s): %s: %s", self.interval_s, type(exc).__name__, exc
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
