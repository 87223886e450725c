"""Every event of the system: one frozen msgspec Struct per type, a tagged union on `type`.

Evolution rules (msgspec's schema-evolution guide): a new field gets a default; an existing
field never changes type; a breaking change is a new tag (`<type>_v2`). Golden payloads of every
published version stay decodable (tests/golden).

The JSON Schema of each type (`commonos.proto.schemas`, exported to proto/schema/) is derived from these
Structs and describes what producers send: every field of a Struct is always encoded, so every field is
`required` there, whatever default the Struct keeps for decoding older payloads. A `dict[str, Any]` field
that has a shape names the Struct describing it with `described_by` (the schema uses that Struct; decoding
stays a plain dict for the code that reads it).
"""

from __future__ import annotations

import functools
import operator
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Final, cast

import msgspec

from commonos.proto.errors import DataError
from commonos.proto.graph.codec import WireGraph, from_wire
from commonos.proto.graph.model import Graph
from commonos.proto.ids import new_id
from commonos.proto.messages import TOOL_ARGS, Message
from commonos.proto.tags import MAX_TAG_LENGTH, TAG_PATTERN

# `(?!\n)` before `$`: Python's `$` also matches before a final newline; ECMA regexes (JSON Schema) agree.
PROFILE_ID_PATTERN: Final = r"^[a-z0-9_-]{1,64}(?!\n)$"
#: Profile-level events belong to no session; they use the nil UUID.
NO_SESSION: Final = uuid.UUID(int=0)

#: A valid tag, as `commonos.proto.tags` defines it.
Tag = Annotated[str, msgspec.Meta(pattern=TAG_PATTERN, max_length=MAX_TAG_LENGTH)]
ProfileId = Annotated[str, msgspec.Meta(pattern=PROFILE_ID_PATTERN)]
#: The largest count or sequence number an event holds: what a 64-bit signed column (PostgreSQL's bigint) stores.
MAX_COUNT: Final = 2**63 - 1
#: The longest provider or model name a model call names (billing stores at most this many characters).
MAX_NAME_CHARS: Final = 256
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Seq = Annotated[int, msgspec.Meta(ge=1, le=MAX_COUNT)]
#: A provider or model name.
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]


def utcnow() -> datetime:
    return datetime.now(UTC)


#: Key of `msgspec.Meta.extra` naming the Struct that describes a `dict[str, Any]` field in the JSON Schema.
DESCRIBED_BY: Final = "described_by"


def described_by(struct: type[msgspec.Struct], description: str | None = None) -> msgspec.Meta:
    """Metadata for a JSON-object field decoded as a dict whose shape `struct` describes (in the schema only)."""
    if description is None:
        return msgspec.Meta(extra={DESCRIBED_BY: struct})
    return msgspec.Meta(description=description, extra={DESCRIBED_BY: struct})


class TurnStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


class Risk(StrEnum):
    LOW = "low"
    HIGH = "high"


class ApprovalStatus(StrEnum):
    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"


class MemoryTarget(StrEnum):
    MEMORY = "memory"
    USER = "user"


class MemoryOp(StrEnum):
    ADD = "add"
    REPLACE = "replace"
    REMOVE = "remove"


class EventBase(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every event carries."""

    event_id: uuid.UUID = msgspec.field(default_factory=new_id)
    occurred_at: AwareDatetime = msgspec.field(default_factory=utcnow)
    profile_id: ProfileId
    session_id: uuid.UUID


class ProfileUpserted(EventBase, frozen=True, kw_only=True, tag="profile_upserted"):
    session_id: uuid.UUID = NO_SESSION
    tags: tuple[Tag, ...] = ()


class ProfileDeleted(EventBase, frozen=True, kw_only=True, tag="profile_deleted"):
    """A profile deleted with everything of it: its sessions, turns, messages, tool calls, approvals,
    session graphs and memory entries. Events of the profile after it are refused, until a later
    `profile_upserted` re-creates the profile (afresh: nothing from before the deletion comes back).
    On the profile's subject with the nil session, like `profile_upserted`; `occurred_at` is when."""

    session_id: uuid.UUID = NO_SESSION
    #: Who deleted it: `cli:<user>`, or what a service's request named.
    deleted_by: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class SessionCreated(EventBase, frozen=True, kw_only=True, tag="session_created"):
    #: Where it came from: `web`, `cli`, `subagent`, or an importer's vendor.
    source: str
    title: str | None = None
    tags: tuple[Tag, ...] = ()
    parent_session_id: uuid.UUID | None = None


class ContextSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What a session's model sees beside the conversation, frozen on its first turn."""

    system_prompt: str
    #: The profile's memory entries (`memory_changed` target `memory`) when the session started.
    memory: tuple[str, ...]
    #: What the profile's memory knew about the user (target `user`) when the session started.
    user: tuple[str, ...]


class TurnStarted(EventBase, frozen=True, kw_only=True, tag="turn_started"):
    """The whole TurnInfo, and the frozen context on a session's first turn."""

    turn_id: uuid.UUID
    parent_turn_id: uuid.UUID | None = None
    tags: tuple[Tag, ...] = ()
    depth: Count = 0
    #: On a session's first turn only, else null.
    context_snapshot: Annotated[dict[str, Any], described_by(ContextSnapshot)] | None = None


class MessageAppended(EventBase, frozen=True, kw_only=True, tag="message_appended"):
    turn_id: uuid.UUID
    message_id: uuid.UUID = msgspec.field(default_factory=new_id)
    #: Per session, from 1, gap-free.
    seq: Seq
    content: Message

    @property
    def role(self) -> str:
        return type(self.content).__struct_config__.tag  # type: ignore[return-value]


class MessageDeactivated(EventBase, frozen=True, kw_only=True, tag="message_deactivated"):
    """Messages compacted away: they stay for history and search, inactive."""

    message_ids: tuple[uuid.UUID, ...]


class ToolCallRecorded(EventBase, frozen=True, kw_only=True, tag="tool_call_recorded"):
    turn_id: uuid.UUID
    tool_call_id: uuid.UUID = msgspec.field(default_factory=new_id)
    #: The model's id for the call (`tool_calls[].id`).
    call_id: str
    name: str
    args: Annotated[dict[str, Any], msgspec.Meta(description=TOOL_ARGS)] = {}
    result: str | None = None
    is_error: bool = False
    risk: Risk = Risk.LOW
    started_at: AwareDatetime
    finished_at: AwareDatetime
    approval: ApprovalStatus | None = None
    #: Set when `result` was cut to fit one message: the size in bytes (UTF-8) of the whole result.
    result_bytes: Count | None = None


class ApprovalDecided(EventBase, frozen=True, kw_only=True, tag="approval_decided"):
    turn_id: uuid.UUID
    tool_call_id: uuid.UUID
    call_id: str
    status: ApprovalStatus
    decided_at: AwareDatetime
    #: `policy`, `timeout`, or who answered (`cli:<user>`).
    decided_by: str


class MemoryChanged(EventBase, frozen=True, kw_only=True, tag="memory_changed"):
    turn_id: uuid.UUID | None = None
    target: MemoryTarget
    op: MemoryOp
    #: Position in the target's ordered list (0-based) the change applies to.
    position: Count
    content: str | None = None


class ModelCallCompleted(EventBase, frozen=True, kw_only=True, tag="model_call_completed"):
    """One successful model call.

    Token convention: the four input buckets are disjoint — `input_tokens` excludes cache-read and
    cache-write tokens; `output_tokens` includes `reasoning_tokens`.
    """

    turn_id: uuid.UUID | None = None
    provider: Name
    model: Name
    request_id: str | None = None
    input_tokens: Count = 0
    output_tokens: Count = 0
    cache_read_tokens: Count = 0
    cache_write_5m_tokens: Count = 0
    cache_write_1h_tokens: Count = 0
    reasoning_tokens: Count = 0
    speed: str | None = None
    latency_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    stop_reason: str | None = None
    #: The turn's resolved tags.
    tags: tuple[Tag, ...] = ()
    #: Cost the provider reported itself, when it did.
    reported_cost_usd: Decimal | None = None
    #: True when the token counts were estimated, not reported.
    usage_estimated: bool = False


class ModelCallRefused(EventBase, frozen=True, kw_only=True, tag="model_call_refused"):
    """A model call the loop did not make because an enforced budget of the turn's tags was exhausted (as billing
    stored it); the turn then finishes `failed` with `reason` as its error."""

    turn_id: uuid.UUID
    budget: str
    tag: Tag
    limit_usd: Decimal
    spent_usd: Decimal
    period_start: datetime
    period_end: datetime
    reason: str


#: How a turn can end: every status but `running` (a consumer refuses a `turn_finished` still running).
FINISHED_STATUSES: Final = tuple(s.value for s in TurnStatus if s is not TurnStatus.RUNNING)


class TurnFinished(EventBase, frozen=True, kw_only=True, tag="turn_finished"):
    turn_id: uuid.UUID
    status: Annotated[TurnStatus, msgspec.Meta(extra_json_schema={"enum": list(FINISHED_STATUSES)})]
    error: str | None = None


class TranscriptImported(EventBase, frozen=True, kw_only=True, tag="transcript_imported"):
    """A session graph (or the part of it that is new) read from a vendor transcript.

    A graph too large for one message is published as consecutive parts on the tree's subject,
    `part` 1 to `parts`, in the graph's insertion order (parents first). A part that is not
    `self_contained` may refer to rows of earlier parts, or of earlier imports of the same tree;
    the graph-writer checks such a part on its own rows and lets PostgreSQL's foreign keys check
    the references to rows it already stored.
    """

    vendor: str
    source_ref: str | None = None
    tags: tuple[Tag, ...] = ()
    #: The session graph (`commonos.proto.graph`), or the rows of this part; decoded with the graph's own
    #: rules (`commonos.proto.graph.codec`: Go's null lists, raw JSON fields).
    graph: Graph
    part: Seq = 1
    parts: Seq = 1
    self_contained: bool = True


class _WireTranscriptImported(TranscriptImported, frozen=True, kw_only=True, tag="transcript_imported"):
    """How a `TranscriptImported` decodes (msgspec cannot decode a Graph's `Raw | None` fields itself);
    `decode_event` turns it into the `TranscriptImported` it describes."""

    graph: WireGraph  # type: ignore[assignment]

    def event(self) -> TranscriptImported:
        fields = {f: getattr(self, f) for f in self.__struct_fields__}
        return TranscriptImported(**{**fields, "graph": from_wire(self.graph)})


Event = (
    ProfileUpserted
    | ProfileDeleted
    | SessionCreated
    | TurnStarted
    | MessageAppended
    | MessageDeactivated
    | ToolCallRecorded
    | ApprovalDecided
    | MemoryChanged
    | ModelCallCompleted
    | ModelCallRefused
    | TurnFinished
    | TranscriptImported
)

EVENT_TYPES: Final[tuple[type[EventBase], ...]] = Event.__args__
EVENT_TYPE_NAMES: Final[frozenset[str]] = frozenset(str(t.__struct_config__.tag) for t in EVENT_TYPES)


def is_profile_event(event_type: type[EventBase]) -> bool:
    """Whether events of `event_type` belong to a profile and no session: their `session_id` defaults to
    `NO_SESSION` (`profile_upserted`, `profile_deleted`)."""
    field = next(f for f in msgspec.structs.fields(event_type) if f.name == "session_id")
    return bool(field.default == NO_SESSION)


#: The event types about a profile as a whole, not one of its sessions.
PROFILE_EVENT_TYPES: Final[tuple[type[EventBase], ...]] = tuple(t for t in EVENT_TYPES if is_profile_event(t))

#: What a payload decodes as: the event types, a `TranscriptImported` through its wire twin.
_DECODED_AS: Final[dict[type[EventBase], type[EventBase]]] = {TranscriptImported: _WireTranscriptImported}
_decoder: Final = msgspec.json.Decoder(functools.reduce(operator.or_, (_DECODED_AS.get(t, t) for t in EVENT_TYPES)))
_encoder: Final = msgspec.json.Encoder(decimal_format="string")


class EventDecodeError(DataError):
    """A payload that is not a valid event; the message says why."""


class EventInvalid(EventDecodeError):
    """An event a producer made that breaks a bound of its type: every consumer would refuse its payload."""


def event_type(event: EventBase) -> str:
    return str(event.__struct_config__.tag)


def encode_event(event: EventBase) -> bytes:
    return _encoder.encode(event)


def check_event(event: Event) -> None:
    """Raise `EventInvalid` if `event` breaks a bound of its type (a count beyond `MAX_COUNT`, a name
    longer than `MAX_NAME_CHARS`, ...), as its consumers' `decode_event` would.

    msgspec checks the bounds (`msgspec.Meta`) when it decodes, not when a Struct is made or encoded: a
    producer whose values come from outside (the importer, the OTLP gateway) checks its events with this.
    """
    try:
        msgspec.json.decode(_encoder.encode(event), type=_DECODED_AS.get(type(event), type(event)))
    except msgspec.ValidationError as exc:
        raise EventInvalid(f"{event_type(event)} {event.event_id}: {exc}") from None


def decode_event(payload: bytes | memoryview) -> Event:
    try:
        event = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(str(exc)) from exc
    except RecursionError:
        raise EventDecodeError("JSON nested too deeply") from None
    if isinstance(event, _WireTranscriptImported):
        return event.event()
    return cast("Event", event)
