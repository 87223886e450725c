"""The Journal port: where the loop records what happens (seed: Turns, Sessions and Tags — The journal).

Every operation becomes one event of `commonos.proto.events`. Two adapters implement the port:
`commonos.loop.memory.MemoryJournal` (a list in memory, for tests) and
`commonos.loop.nats_journal.NatsJournal` (JetStream, the source of truth). Both are held to the same
contract suite (tests/loop/test_journal_contract.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

import msgspec

from commonos.accounting.usage import TokenUsage
from commonos.proto.budget_state import BudgetState
from commonos.proto.errors import DataError, OperationalError
from commonos.proto.events import (
    ApprovalStatus,
    MemoryOp,
    MemoryTarget,
    ProfileDeleted,
    Risk,
    TurnStatus,
    utcnow,
)
from commonos.proto.identity import NewSession, TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.messages import Message
from commonos.proto.profiles import ProfileStatus


class JournalError(OperationalError):
    """The journal could not store or read events before its deadline (e.g. NATS unreachable).

    The operation may or may not have been stored; retrying it is safe for a publish because a retry
    reuses the event id.
    """


class SessionNotFound(DataError, LookupError):
    """No `session_created` event exists for this session id (from this profile, when one is named)."""

    def __init__(self, session_id: uuid.UUID, profile_id: str | None = None) -> None:
        super().__init__(f"session {session_id} not found" + (f" for profile {profile_id!r}" if profile_id else ""))
        self.session_id = session_id
        self.profile_id = profile_id


class UnknownMessage(DataError):
    """A message sequence number that the session does not have."""


class MessageTooLarge(DataError):
    """A message whose `message_appended` event would be over the journal's limit for one message
    (`Journal.message_limit`); nothing of it was stored."""

    def __init__(self, what: str, size: int, limit: int, why: str = "") -> None:
        self.what = what
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} is {size} bytes as an event (headers included), over the limit of {limit} bytes "
            f"for one message{f' ({why})' if why else ''}"
        )


class ToolCallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One executed (or refused) tool call: name, arguments, result, error flag, risk, times, approval."""

    call_id: str
    name: str
    args: dict[str, Any] = {}
    result: str | None = None
    is_error: bool = False
    risk: Risk = Risk.LOW
    started_at: datetime
    finished_at: datetime
    approval: ApprovalStatus | None = None
    #: Set when `result` was cut to fit one message: the size in bytes (UTF-8) of the whole result.
    result_bytes: int | None = None
    #: Our id for the call; the approval of the call refers to it.
    tool_call_id: uuid.UUID = msgspec.field(default_factory=new_id)
    #: The id of the call's `tool_call_recorded` event.
    event_id: uuid.UUID = msgspec.field(default_factory=new_id)

    @property
    def duration_s(self) -> float:
        return (self.finished_at - self.started_at).total_seconds()


class ApprovalDecision(msgspec.Struct, frozen=True, kw_only=True):
    tool_call_id: uuid.UUID
    call_id: str
    status: ApprovalStatus
    #: `policy`, `timeout`, or who answered (`cli:<user>`).
    decided_by: str
    decided_at: datetime = msgspec.field(default_factory=utcnow)


class ModelCall(msgspec.Struct, frozen=True, kw_only=True):
    """One successful model call, tokens in our convention (input excludes cache; output includes reasoning)."""

    provider: str
    model: str
    usage: TokenUsage
    request_id: str | None = None
    latency_s: float | None = None
    stop_reason: str | None = None
    #: The id of the call's `model_call_completed` event.
    event_id: uuid.UUID = msgspec.field(default_factory=new_id)


class MemoryChange(msgspec.Struct, frozen=True, kw_only=True):
    target: MemoryTarget
    op: MemoryOp
    #: 0-based position in the target's ordered list.
    position: int
    content: str | None = None


class MemoryEntries(msgspec.Struct, frozen=True, kw_only=True):
    """A profile's memory: two ordered lists of entries."""

    memory: tuple[str, ...] = ()
    user: tuple[str, ...] = ()

    def of(self, target: MemoryTarget) -> tuple[str, ...]:
        return self.memory if target is MemoryTarget.MEMORY else self.user


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    message_id: uuid.UUID
    turn_id: uuid.UUID
    message: Message
    active: bool = True


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the journal knows of a session, read back from its events."""

    session_id: uuid.UUID
    profile_id: str
    source: str
    title: str | None = None
    #: The session's own tags (a turn adds the profile's).
    tags: tuple[str, ...] = ()
    parent_session_id: uuid.UUID | None = None
    #: The frozen context written on the session's first turn; None before it.
    context_snapshot: dict[str, Any] | None = None
    turn_count: int = 0
    #: Turns started and not finished (a crashed process leaves one behind).
    open_turns: tuple[uuid.UUID, ...] = ()


class Journal(Protocol):
    """Where the loop records what happens. Every method stores (or reads) events, nothing else."""

    @property
    def message_limit(self) -> int:
        """The largest `message_appended` event this journal stores, in bytes as NATS counts a message
        (headers and body): COS_MAX_MESSAGE_BYTES, and never more than the store can take."""
        ...

    def message_bytes(self, turn: TurnInfo, message: Message) -> int:
        """Bytes of the `message_appended` event that would record `message` next in the turn's session
        (a session the journal has not seen is taken as new). Stores nothing."""
        ...

    def tool_call_bytes(self, turn: TurnInfo, record: ToolCallRecord) -> int:
        """Bytes of the `tool_call_recorded` event that would record `record`. Stores nothing."""
        ...

    def check_message(self, turn: TurnInfo, message: Message, what: str = "the message") -> int:
        """`message_bytes`, or `MessageTooLarge` (naming `what`, the size and the limit) when it is over
        `message_limit`. Stores nothing."""
        ...

    async def publish_profile(self, profile_id: str, tags: Sequence[str]) -> None:
        """Record that a profile exists with these tags (`profile_upserted`), at loop start-up."""
        ...

    async def profile_status(self, profile_id: str) -> ProfileStatus:
        """What the journal says of a profile: its latest `profile_upserted` and `profile_deleted`, and where."""
        ...

    async def profile_statuses(self) -> dict[str, ProfileStatus]:
        """The status of every profile the journal has a `profile_upserted` or `profile_deleted` of."""
        ...

    async def has_events(self, profile_id: str) -> bool:
        """Whether the journal holds any event of the profile (one never upserted: imported work, say)."""
        ...

    async def delete_profile(self, profile_id: str, deleted_by: str) -> ProfileDeleted:
        """Record the deletion of a profile (`profile_deleted`), unchecked (see `profile_status.delete_profile`)."""
        ...

    async def session_position(self, session_id: uuid.UUID, profile_id: str) -> int | None:
        """Where the profile's `session_created` of the session is in the journal; None when there is none."""
        ...

    async def create_session(self, session: NewSession) -> uuid.UUID:
        """Start a new session (`session_created`) and return its new id (UUIDv7)."""
        ...

    async def load_session(self, session_id: uuid.UUID, profile_id: str | None = None) -> SessionRecord:
        """The session as its owner's events describe it; `SessionNotFound` when it has none.

        The owner is `profile_id` when given (a session another profile created is then not found),
        else the profile that created it. Events of any other profile about the session, or whose
        body names another session, are left out, here and in `load_history` / `load_entries`."""
        ...

    async def load_history(self, session_id: uuid.UUID, profile_id: str | None = None) -> list[Message]:
        """Active messages of a session, oldest first (deactivated ones left out)."""
        ...

    async def load_entries(self, session_id: uuid.UUID, profile_id: str | None = None) -> list[HistoryEntry]:
        """Every message of a session with its seq, id and active flag, oldest first."""
        ...

    async def start_turn(self, turn: TurnInfo, context_snapshot: dict[str, Any] | None = None) -> None:
        """Record the start of a turn (`turn_started`, the whole TurnInfo), with the frozen context on a
        session's first turn."""
        ...

    async def append_message(self, turn: TurnInfo, message: Message) -> int:
        """Append a message to the turn's session (`message_appended`) and return its seq: per session,
        from 1, gap-free, continued across processes. `MessageTooLarge`, storing nothing, when its event
        is over `message_limit`."""
        ...

    async def deactivate_messages(self, turn: TurnInfo, seqs: Sequence[int]) -> None:
        """Make the messages with these seqs inactive (`message_deactivated`); they stay for history and
        search. `UnknownMessage` for a seq the session does not have."""
        ...

    async def record_tool_call(self, turn: TurnInfo, record: ToolCallRecord) -> None:
        """Record one tool call (`tool_call_recorded`)."""
        ...

    async def record_approval(self, turn: TurnInfo, decision: ApprovalDecision) -> None:
        """Record the decision on a risky tool call (`approval_decided`)."""
        ...

    async def record_model_call(self, turn: TurnInfo, call: ModelCall) -> None:
        """Record one successful model call with the turn's resolved tags (`model_call_completed`)."""
        ...

    async def record_model_call_refused(self, turn: TurnInfo, state: BudgetState, reason: str) -> None:
        """Record that a model call of ``turn`` was refused by the enforced budget ``state``."""
        ...

    async def record_memory_change(self, turn: TurnInfo, change: MemoryChange) -> None:
        """Record a change to the profile's memory (`memory_changed`)."""
        ...

    async def load_memory(self, profile_id: str) -> MemoryEntries:
        """The profile's memory entries now: every `memory_changed` of the profile since its latest deletion
        applied in order."""
        ...

    async def finish_turn(self, turn: TurnInfo, status: TurnStatus, error: str | None = None) -> None:
        """Record the end of a turn (`turn_finished`) with its status and, if it did not complete, why."""
        ...
