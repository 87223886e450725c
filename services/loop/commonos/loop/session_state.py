"""Pure folds of events into what the loop needs: a session's state and a profile's memory.

No I/O here: both journal adapters read their events and hand them to these folds, so they agree.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from commonos.loop.journal import HistoryEntry, MemoryEntries, SessionRecord, UnknownMessage
from commonos.proto.events import (
    Event,
    MemoryChanged,
    MemoryOp,
    MemoryTarget,
    MessageAppended,
    MessageDeactivated,
    SessionCreated,
    TurnFinished,
    TurnStarted,
)
from commonos.proto.messages import Message

log = logging.getLogger(__name__)


class SessionState:
    """A session folded from its events in stream order, as its owner's.

    The owner is the profile that created the session (`profile_id` when given: a session created by
    any other profile then does not exist). Only events whose body names the owner and this session
    count; anything else read with them (another profile's events about the same session id, an event
    whose body names another session) is left out, as the core projection dead-letters it.
    """

    def __init__(self, session_id: uuid.UUID, profile_id: str | None = None) -> None:
        self.session_id = session_id
        #: The profile the session must belong to, when known before its `session_created` is read.
        self.expected_profile = profile_id
        self.created: SessionCreated | None = None
        self.context_snapshot: dict[str, Any] | None = None
        self.turn_count = 0
        self._open_turns: dict[uuid.UUID, None] = {}
        self._entries: list[HistoryEntry] = []
        self._by_id: dict[uuid.UUID, int] = {}

    @property
    def exists(self) -> bool:
        return self.created is not None

    @property
    def owner(self) -> str | None:
        """The profile that created the session (None before its `session_created`)."""
        return self.created.profile_id if self.created is not None else None

    def _foreign(self, event: Event) -> bool:
        """Whether `event` is not the owner's event about this session (and is to be left out)."""
        if event.session_id != self.session_id:
            return True
        if self.created is None:
            # Nothing of a session counts before it is created, and only its profile can create it.
            return not isinstance(event, SessionCreated) or (
                self.expected_profile is not None and event.profile_id != self.expected_profile
            )
        return event.profile_id != self.created.profile_id

    @property
    def last_seq(self) -> int:
        return self._entries[-1].seq if self._entries else 0

    @property
    def next_seq(self) -> int:
        return self.last_seq + 1

    def apply(self, event: Event) -> None:
        if self._foreign(event):
            log.warning(
                "session %s: %s from profile %r left out (the session is %r's)",
                self.session_id,
                type(event).__name__,
                event.profile_id,
                self.owner or self.expected_profile,
            )
            return
        match event:
            case SessionCreated():
                if self.created is None:
                    self.created = event
            case TurnStarted():
                self.turn_count += 1
                self._open_turns[event.turn_id] = None
                if self.context_snapshot is None and event.context_snapshot is not None:
                    self.context_snapshot = event.context_snapshot
            case TurnFinished():
                self._open_turns.pop(event.turn_id, None)
            case MessageAppended():
                if event.seq <= self.last_seq:
                    return  # the same message seen twice (a redelivery); the first one counts
                if event.seq != self.next_seq:
                    log.warning(
                        "session %s: message seq %d follows %d (gap)", self.session_id, event.seq, self.last_seq
                    )
                self._by_id[event.message_id] = len(self._entries)
                self._entries.append(
                    HistoryEntry(
                        seq=event.seq, message_id=event.message_id, turn_id=event.turn_id, message=event.content
                    )
                )
            case MessageDeactivated():
                for message_id in event.message_ids:
                    index = self._by_id.get(message_id)
                    if index is not None:
                        entry = self._entries[index]
                        self._entries[index] = HistoryEntry(
                            seq=entry.seq,
                            message_id=entry.message_id,
                            turn_id=entry.turn_id,
                            message=entry.message,
                            active=False,
                        )
            case _:
                pass

    def record(self) -> SessionRecord:
        if self.created is None:
            raise ValueError(f"session {self.session_id} has no session_created event")
        c = self.created
        return SessionRecord(
            session_id=self.session_id,
            profile_id=c.profile_id,
            source=c.source,
            title=c.title,
            tags=c.tags,
            parent_session_id=c.parent_session_id,
            context_snapshot=self.context_snapshot,
            turn_count=self.turn_count,
            open_turns=tuple(self._open_turns),
        )

    def entries(self) -> list[HistoryEntry]:
        return list(self._entries)

    def history(self) -> list[Message]:
        return [e.message for e in self._entries if e.active]

    def message_ids(self, seqs: Sequence[int]) -> tuple[uuid.UUID, ...]:
        by_seq = {e.seq: e.message_id for e in self._entries}
        missing = [s for s in seqs if s not in by_seq]
        if missing:
            raise UnknownMessage(f"session {self.session_id} has no message with seq {missing}")
        return tuple(by_seq[s] for s in seqs)


def fold_session(session_id: uuid.UUID, events: Iterable[Event], profile_id: str | None = None) -> SessionState:
    """The session as its owner's events describe it: `profile_id`'s when given, else its creator's."""
    state = SessionState(session_id, profile_id)
    for event in events:
        state.apply(event)
    return state


def apply_memory_op(entries: list[str], op: MemoryOp, position: int, content: str | None) -> bool:
    """Apply one change to an ordered list in place; False when the position does not exist.

    `add` inserts at `position` (past the end appends); `replace` and `remove` need an existing position.
    The SQL projection (`commonos.journal_writer.memory.memory_rows`) does exactly the same.
    """
    if op is MemoryOp.ADD:
        entries.insert(min(position, len(entries)), content or "")
        return True
    if not 0 <= position < len(entries):
        return False
    if op is MemoryOp.REPLACE:
        entries[position] = content or ""
    else:
        del entries[position]
    return True


class MemoryState:
    """A profile's memory folded from its `memory_changed` events (another profile's are left out)."""

    def __init__(self, profile_id: str | None = None) -> None:
        self.profile_id = profile_id
        self.lists: dict[MemoryTarget, list[str]] = {t: [] for t in MemoryTarget}
        self._seen: set[uuid.UUID] = set()

    def apply(self, event: Event) -> None:
        if not isinstance(event, MemoryChanged) or event.event_id in self._seen:
            return
        if self.profile_id is not None and event.profile_id != self.profile_id:
            log.warning(
                "memory_changed %s of profile %r left out of %r's memory",
                event.event_id,
                event.profile_id,
                self.profile_id,
            )
            return
        self._seen.add(event.event_id)
        if not apply_memory_op(self.lists[event.target], event.op, event.position, event.content):
            log.warning("memory_changed %s: no entry at position %d; ignored", event.event_id, event.position)

    def entries(self) -> MemoryEntries:
        return MemoryEntries(memory=tuple(self.lists[MemoryTarget.MEMORY]), user=tuple(self.lists[MemoryTarget.USER]))


def fold_memory(events: Iterable[Event], profile_id: str | None = None) -> MemoryEntries:
    state = MemoryState(profile_id)
    for event in events:
        state.apply(event)
    return state.entries()
