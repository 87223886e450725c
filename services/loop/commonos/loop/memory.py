"""`MemoryJournal`: the Journal kept in a list, for tests of the loop without servers."""

from __future__ import annotations

import uuid

from commonos.loop.event_journal import EventJournal
from commonos.proto.events import Event, MemoryChanged


class MemoryJournal(EventJournal):
    """Every event in `events`, in the order stored. Same events as `NatsJournal`, no I/O."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []

    async def _store(self, event: Event) -> None:
        self.events.append(event)

    async def _read_session(self, session_id: uuid.UUID) -> list[Event]:
        return [e for e in self.events if e.session_id == session_id]

    async def _read_memory(self, profile_id: str) -> list[Event]:
        return [e for e in self.events if isinstance(e, MemoryChanged) and e.profile_id == profile_id]
