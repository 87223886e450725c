"""`MemoryJournal`: the Journal kept in a list, for tests of the loop without servers."""

from __future__ import annotations

import uuid

from commonos.loop.event_journal import LOOP_SOURCE, EventJournal
from commonos.proto.events import Event, MemoryChanged, ProfileDeleted, ProfileUpserted, SessionCreated
from commonos.proto.profiles import StoredEvent
from commonos.runtime.settings import DEFAULT_MAX_MESSAGE_BYTES


class MemoryJournal(EventJournal):
    """Every event in `events`, in the order stored. Same events as `NatsJournal`, no I/O."""

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        super().__init__(max_message_bytes=max_message_bytes)
        self.events: list[Event] = []

    async def _store(self, event: Event, prepared: object = None) -> None:
        self.events.append(event)

    async def _read_session(self, session_id: uuid.UUID, profile_id: str | None) -> list[Event]:
        return [e for e in self.events if e.session_id == session_id and profile_id in (None, e.profile_id)]

    # A position is an event's place in `events`, from 1.

    async def _read_memory(self, profile_id: str, after: int = 0) -> list[Event]:
        return [e for e in self.events[after:] if isinstance(e, MemoryChanged) and e.profile_id == profile_id]

    async def _read_profiles(self, profile_id: str | None) -> list[StoredEvent]:
        return [
            StoredEvent(i, e, LOOP_SOURCE)
            for i, e in enumerate(self.events, start=1)
            if isinstance(e, ProfileUpserted | ProfileDeleted) and profile_id in (None, e.profile_id)
        ]

    async def has_events(self, profile_id: str) -> bool:
        return any(e.profile_id == profile_id for e in self.events)

    async def _session_position(self, session_id: uuid.UUID, profile_id: str) -> int | None:
        for i, e in enumerate(self.events, start=1):
            if isinstance(e, SessionCreated) and e.session_id == session_id and e.profile_id == profile_id:
                return i
        return None
