"""The Journal operations turned into events, shared by every adapter.

An adapter only says how to store one event and how to read a session's (or a profile's memory)
events back; building the events and folding them (`session_state`) is the same for all, so the
memory and NATS journals cannot drift apart.
"""

from __future__ import annotations

import asyncio
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from commonos.loop.journal import (
    ApprovalDecision,
    HistoryEntry,
    MemoryChange,
    MemoryEntries,
    MessageTooLarge,
    ModelCall,
    SessionNotFound,
    SessionRecord,
    ToolCallRecord,
)
from commonos.loop.session_state import SessionState, fold_memory, fold_session
from commonos.proto.budget_state import BudgetState
from commonos.proto.cloudevents import event_headers
from commonos.proto.events import (
    ApprovalDecided,
    Event,
    MemoryChanged,
    MessageAppended,
    MessageDeactivated,
    ModelCallCompleted,
    ModelCallRefused,
    ProfileDeleted,
    ProfileUpserted,
    SessionCreated,
    ToolCallRecorded,
    TurnFinished,
    TurnStarted,
    TurnStatus,
    encode_event,
    utcnow,
)
from commonos.proto.identity import NewSession, TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.messages import Message
from commonos.proto.profiles import ProfileStatus, StoredEvent, fold_profiles
from commonos.proto.subjects import EVENTS_STREAM
from commonos.proto.tags import check_profile_id, parse_tags
from commonos.runtime.limits import message_bytes, with_stream_header
from commonos.runtime.settings import DEFAULT_MAX_MESSAGE_BYTES

#: Sessions whose state is kept between calls (the loop re-reads a session at each turn anyway).
MAX_CACHED_SESSIONS = 4096
#: `ce-source` of the loop's events.
LOOP_SOURCE: Final = "urn:commonos:loop"


def _sizing_time() -> datetime:
    """A timestamp for sizing an event not yet made: with microseconds, the longest form it can take."""
    now = utcnow()
    return now if now.microsecond else now.replace(microsecond=1)


def _priced_tier(service_tier: str | None) -> str | None:
    """A vendor's service tier when it selects a price variant (`priority`, `flex`, `batch`...)."""
    return None if service_tier in (None, "standard", "default", "auto") else service_tier


class EventJournal(ABC):
    """Base of the journal adapters: each operation is one event, stored with `_store`."""

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._states: OrderedDict[uuid.UUID, SessionState] = OrderedDict()
        self._session_locks: dict[uuid.UUID, asyncio.Lock] = {}
        #: COS_MAX_MESSAGE_BYTES: the largest `message_appended` event stored, unless the store allows less.
        self.max_message_bytes = max_message_bytes

    @abstractmethod
    async def _store(self, event: Event, prepared: Any = None) -> None:
        """Store one event durably; return only once it is stored. Raise `JournalError` otherwise.
        `prepared` is what `_sized` returned with the event's size (its encoded form), so that an event sized
        before it is stored is encoded once."""

    @abstractmethod
    async def _read_session(self, session_id: uuid.UUID, profile_id: str | None) -> list[Event]:
        """Every event of one session, in the order they were stored: those stored under `profile_id`
        when given (the fold leaves out any other profile's anyway)."""

    @abstractmethod
    async def _read_memory(self, profile_id: str, after: int = 0) -> list[Event]:
        """Every `memory_changed` event of one profile stored after position `after`, in the order stored."""

    @abstractmethod
    async def _read_profiles(self, profile_id: str | None) -> list[StoredEvent]:
        """The `profile_upserted` and `profile_deleted` events of one profile (of every profile when None),
        with their positions: at least the latest of each kind of each profile."""

    @abstractmethod
    async def has_events(self, profile_id: str) -> bool:
        """Whether any event of the profile is stored."""

    @abstractmethod
    async def _session_position(self, session_id: uuid.UUID, profile_id: str) -> int | None:
        """The position of the profile's (first) `session_created` of the session."""

    # -- sizes -------------------------------------------------------------------------------------

    @property
    def message_limit(self) -> int:
        return self.max_message_bytes

    def _limit_reason(self) -> str:
        """Where `message_limit` comes from, for the error that quotes it."""
        return "COS_MAX_MESSAGE_BYTES"

    def _sized(self, event: Event) -> tuple[int, Any]:
        """An event's size as NATS counts it (its body and the headers it is published with), and what
        `_store` may reuse to store it without encoding it again (None here: nothing to reuse)."""
        size = message_bytes(encode_event(event), with_stream_header(event_headers(event, LOOP_SOURCE), EVENTS_STREAM))
        return size, None

    def _event_bytes(self, event: Event) -> int:
        return self._sized(event)[0]

    def _appended(self, turn: TurnInfo, seq: int, message: Message, **kw: Any) -> MessageAppended:
        return MessageAppended(
            profile_id=turn.profile_id, session_id=turn.session_id, turn_id=turn.turn_id, seq=seq, content=message, **kw
        )

    def message_bytes(self, turn: TurnInfo, message: Message) -> int:
        state = self._states.get(turn.session_id)
        seq = state.next_seq if state is not None else 1
        return self._event_bytes(self._appended(turn, seq, message, occurred_at=_sizing_time()))

    def tool_call_bytes(self, turn: TurnInfo, record: ToolCallRecord) -> int:
        return self._event_bytes(self._tool_call_event(turn, record, occurred_at=_sizing_time()))

    def check_message(self, turn: TurnInfo, message: Message, what: str = "the message") -> int:
        return self._check(what, self.message_bytes(turn, message))

    def _check(self, what: str, size: int) -> int:
        limit = self.message_limit
        if size > limit:
            raise MessageTooLarge(what, size, limit, self._limit_reason())
        return size

    # -- state -------------------------------------------------------------------------------------

    def _lock(self, session_id: uuid.UUID) -> asyncio.Lock:
        lock = self._session_locks.get(session_id)
        if lock is None:
            lock = self._session_locks[session_id] = asyncio.Lock()
        return lock

    def _remember(self, state: SessionState) -> SessionState:
        self._states[state.session_id] = state
        self._states.move_to_end(state.session_id)
        while len(self._states) > MAX_CACHED_SESSIONS:
            old, _ = self._states.popitem(last=False)
            self._session_locks.pop(old, None)
        return state

    async def _refresh(self, session_id: uuid.UUID, profile_id: str | None = None) -> SessionState:
        state = fold_session(session_id, await self._read_session(session_id, profile_id), profile_id)
        if not state.exists:
            self._session_locks.pop(session_id, None)
            raise SessionNotFound(session_id, profile_id)
        return self._remember(state)

    async def _state(self, session_id: uuid.UUID, profile_id: str) -> SessionState:
        state = self._states.get(session_id)
        if state is not None and state.owner == profile_id:
            return state
        return await self._refresh(session_id, profile_id)

    async def _emit(self, event: Event, state: SessionState | None = None, prepared: Any = None) -> None:
        try:
            await self._store(event, prepared)
        except BaseException:
            # We do not know whether it was stored: read the session back before the next append.
            self._states.pop(event.session_id, None)
            raise
        if state is not None:
            state.apply(event)

    # -- the Journal operations --------------------------------------------------------------------

    async def publish_profile(self, profile_id: str, tags: Sequence[str]) -> None:
        check_profile_id(profile_id)
        await self._emit(ProfileUpserted(profile_id=profile_id, tags=tuple(parse_tags(tags))))

    async def profile_status(self, profile_id: str) -> ProfileStatus:
        check_profile_id(profile_id)
        status = fold_profiles(await self._read_profiles(profile_id)).get(profile_id)
        return status if status is not None else ProfileStatus(profile_id=profile_id)

    async def profile_statuses(self) -> dict[str, ProfileStatus]:
        return fold_profiles(await self._read_profiles(None))

    async def delete_profile(self, profile_id: str, deleted_by: str) -> ProfileDeleted:
        check_profile_id(profile_id)
        event = ProfileDeleted(profile_id=profile_id, deleted_by=deleted_by)
        await self._emit(event)
        return event

    async def session_position(self, session_id: uuid.UUID, profile_id: str) -> int | None:
        return await self._session_position(session_id, check_profile_id(profile_id))

    async def create_session(self, session: NewSession) -> uuid.UUID:
        check_profile_id(session.profile_id)
        session_id = new_id()
        event = SessionCreated(
            profile_id=session.profile_id,
            session_id=session_id,
            source=session.source,
            title=session.title,
            tags=tuple(parse_tags(session.tags)),
            parent_session_id=session.parent_session_id,
        )
        state = SessionState(session_id, session.profile_id)
        async with self._lock(session_id):
            await self._emit(event, state)
        self._remember(state)
        return session_id

    async def load_session(self, session_id: uuid.UUID, profile_id: str | None = None) -> SessionRecord:
        async with self._lock(session_id):
            return (await self._refresh(session_id, profile_id)).record()

    async def load_history(self, session_id: uuid.UUID, profile_id: str | None = None) -> list[Message]:
        async with self._lock(session_id):
            return (await self._refresh(session_id, profile_id)).history()

    async def load_entries(self, session_id: uuid.UUID, profile_id: str | None = None) -> list[HistoryEntry]:
        async with self._lock(session_id):
            return (await self._refresh(session_id, profile_id)).entries()

    async def start_turn(self, turn: TurnInfo, context_snapshot: dict[str, Any] | None = None) -> None:
        event = TurnStarted(
            profile_id=turn.profile_id,
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            parent_turn_id=turn.parent_turn_id,
            tags=turn.tags,
            depth=turn.depth,
            context_snapshot=context_snapshot,
        )
        async with self._lock(turn.session_id):
            await self._emit(event, await self._state(turn.session_id, turn.profile_id))

    async def append_message(self, turn: TurnInfo, message: Message) -> int:
        async with self._lock(turn.session_id):
            state = await self._state(turn.session_id, turn.profile_id)
            seq = state.next_seq
            event = self._appended(turn, seq, message)
            size, prepared = self._sized(event)
            self._check(f"the {event.role.replace('_', ' ')} message", size)
            await self._emit(event, state, prepared)
            return seq

    async def deactivate_messages(self, turn: TurnInfo, seqs: Sequence[int]) -> None:
        if not seqs:
            return
        async with self._lock(turn.session_id):
            state = await self._state(turn.session_id, turn.profile_id)
            event = MessageDeactivated(
                profile_id=turn.profile_id, session_id=turn.session_id, message_ids=state.message_ids(seqs)
            )
            await self._emit(event, state)

    @staticmethod
    def _tool_call_event(turn: TurnInfo, record: ToolCallRecord, **kw: Any) -> ToolCallRecorded:
        return ToolCallRecorded(
            profile_id=turn.profile_id,
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            tool_call_id=record.tool_call_id,
            call_id=record.call_id,
            name=record.name,
            args=record.args,
            result=record.result,
            is_error=record.is_error,
            risk=record.risk,
            started_at=record.started_at,
            finished_at=record.finished_at,
            approval=record.approval,
            result_bytes=record.result_bytes,
            **kw,
        )

    async def record_tool_call(self, turn: TurnInfo, record: ToolCallRecord) -> None:
        await self._emit(self._tool_call_event(turn, record, event_id=record.event_id))

    async def record_approval(self, turn: TurnInfo, decision: ApprovalDecision) -> None:
        await self._emit(
            ApprovalDecided(
                profile_id=turn.profile_id,
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                tool_call_id=decision.tool_call_id,
                call_id=decision.call_id,
                status=decision.status,
                decided_at=decision.decided_at,
                decided_by=decision.decided_by,
            )
        )

    async def record_model_call(self, turn: TurnInfo, call: ModelCall) -> None:
        u = call.usage
        await self._emit(
            ModelCallCompleted(
                event_id=call.event_id,
                profile_id=turn.profile_id,
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                provider=call.provider,
                model=call.model,
                request_id=call.request_id,
                input_tokens=u.input_tokens,
                output_tokens=u.output_tokens,
                cache_read_tokens=u.cache_read_tokens,
                cache_write_5m_tokens=u.cache_write_5m_tokens,
                cache_write_1h_tokens=u.cache_write_1h_tokens,
                reasoning_tokens=u.reasoning_tokens,
                speed=u.speed or _priced_tier(u.service_tier),
                latency_s=call.latency_s,
                stop_reason=call.stop_reason,
                tags=turn.tags,
                usage_estimated=u.usage_estimated,
            )
        )

    async def record_model_call_refused(self, turn: TurnInfo, state: BudgetState, reason: str) -> None:
        await self._emit(
            ModelCallRefused(
                profile_id=turn.profile_id,
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                budget=state.budget,
                tag=state.tag,
                limit_usd=state.limit_usd,
                spent_usd=state.spent_usd,
                period_start=state.period_start,
                period_end=state.period_end,
                reason=reason,
            )
        )

    async def record_memory_change(self, turn: TurnInfo, change: MemoryChange) -> None:
        await self._emit(
            MemoryChanged(
                profile_id=turn.profile_id,
                session_id=turn.session_id,
                turn_id=turn.turn_id,
                target=change.target,
                op=change.op,
                position=change.position,
                content=change.content,
            )
        )

    async def load_memory(self, profile_id: str) -> MemoryEntries:
        # A re-created profile's memory starts empty: the changes before its latest deletion are gone.
        after = (await self.profile_status(profile_id)).deleted_position
        return fold_memory(await self._read_memory(profile_id, after), profile_id)

    async def finish_turn(self, turn: TurnInfo, status: TurnStatus, error: str | None = None) -> None:
        event = TurnFinished(
            profile_id=turn.profile_id,
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            status=status,
            error=error,
        )
        async with self._lock(turn.session_id):
            await self._emit(event, self._states.get(turn.session_id))
