"""`MemoryJournal`: the Journal kept in a list, for tests of the loop without servers."""

from __future__ import annotations

import uuid

from commonos.loop.event_journal import EventJournal
from commonos.proto.events import Event, MemoryChanged
from commonos.runtime.settings import DEFAULT_MAX_MESSAGE_BYTES


class MemoryJournal(EventJournal):
    """Every event in `events`, in the order stored. Same events as `NatsJournal`, no I/O."""

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        super().__init__(max_message_bytes=max_message_bytes)
        self.events: list[Event] = []

    async def _store(self, event: Event) -> None:
        self.events.append(event)

    async def _read_session(self, session_id: uuid.UUID, profile_id: str | None) -> list[Event]:
        return [e for e in self.events if e.session_id == session_id and profile_id in (None, e.profile_id)]

    async def _read_memory(self, profile_id: str) -> list[Event]:
        return [e for e in self.events if isinstance(e, MemoryChanged) and e.profile_id == profile_id]
