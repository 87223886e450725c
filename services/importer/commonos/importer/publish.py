"""Publishing an imported tree's events (built by :mod:`commonos.importer.events`) and counting what
the stream stored: the importer's only I/O on NATS, through an ``EventPublisher``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from commonos.proto.events import Event, ModelCallCompleted, TranscriptImported

if TYPE_CHECKING:  # a dry run does not load nats
    from nats.js.api import PubAck


class Publisher(Protocol):
    async def publish_many(self, events: Sequence[Event], window: int = ...) -> list[PubAck]: ...


@dataclass
class PublishCounts:
    """What publishing did: events sent, how many the stream stored anew and how many it dropped as duplicates."""

    events: int = 0
    stored: int = 0
    duplicates: int = 0
    graph_parts: int = 0
    model_calls: int = 0

    def add(self, other: PublishCounts) -> None:
        self.events += other.events
        self.stored += other.stored
        self.duplicates += other.duplicates
        self.graph_parts += other.graph_parts
        self.model_calls += other.model_calls


async def publish_events(publisher: Publisher, events: Sequence[Event], window: int = 256) -> PublishCounts:
    """Publish and wait for every PubAck; a duplicate ack means the stream already held that event."""
    acks = await publisher.publish_many(events, window=window)
    duplicates = sum(1 for ack in acks if ack.duplicate)
    return PublishCounts(
        events=len(events),
        stored=len(events) - duplicates,
        duplicates=duplicates,
        graph_parts=sum(1 for e in events if isinstance(e, TranscriptImported)),
        model_calls=sum(1 for e in events if isinstance(e, ModelCallCompleted)),
    )
